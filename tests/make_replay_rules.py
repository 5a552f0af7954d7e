"""Writes tests/data/replay_rules.json, the committed history that tests/test_selection_rules.py
replays (run it again only to change the fixture; the test reads the committed file).

A fake device ("replay-cpu", the fingerprint of tests/test_selection.py) with variants V1..V4 of
fixed sources, full covariance, float32, measured on the whole data at every shape of
N in {10 000, 100 000} x D in {2, 4, 8, 16, 32} x M in {1, 4, 16, 64} except the held-out shapes
(N=100 000, D=8, M=16) and (N=10 000, D=32, M=4). Seconds per event:

    V4 = 1e-9 * D * (D + 1) * (M + 4)          (event blocks: wins from M >= 8)
    V3 = 1e-9 * D * (D + 1) * (1.5 * M + 0.5)  (components in parallel: wins below M = 7)
    V2 = 1.3 * min(V3, V4)                     (never the best, within 1.5x)
    V1 = 3.0 * min(V3, V4)                     (always far slower: pruned)
"""

import json
from pathlib import Path

DEVICE = "401a6ddfc2a9f982"
HELD_OUT = {(100000, 8, 16), (10000, 32, 4)}


def cost(name, D, M):
    v4 = 1e-9 * D * (D + 1) * (M + 4)
    v3 = 1e-9 * D * (D + 1) * (1.5 * M + 0.5)
    return {"V4": v4, "V3": v3, "V2": 1.3 * min(v3, v4), "V1": 3.0 * min(v3, v4)}[name]


def main():
    timings, i = [], 0
    for N in (10000, 100000):
        for D in (2, 4, 8, 16, 32):
            for M in (1, 4, 16, 64):
                if (N, D, M) in HELD_OUT:
                    continue
                for name in ("V1", "V2", "V3", "V4"):
                    i += 1
                    s = cost(name, D, M) * N
                    tun = '{"chunk":4}' if name == "V3" else "{}"
                    timings.append(
                        {
                            "device_id": DEVICE,
                            "variant": {
                                "backend": "fake",
                                "name": name,
                                "tunables": tun,
                                "source_sha256": f"sha-{name}",
                            },
                            "N": N,
                            "D": D,
                            "M": M,
                            "cvtype": "full",
                            "dtype": "float32",
                            "status": "ok",
                            "seconds": s,
                            "cov_seconds": s / 2,
                            "repeats": 3,
                            "created_at": "2026-11-20T10:00:00",
                            "package_version": "0.1.0",
                            "uid": f"rules{i:05d}",
                            "threads": 2,
                            "sampled_from": None,
                        }
                    )
    doc = {
        "format": "asp_gmm-history",
        "schema_version": 3,
        "exported_at": "2026-11-20T12:00:00",
        "devices": [
            {"id": DEVICE, "fingerprint": {"backend": "fake", "model": "replay-cpu", "threads": 2, "compiler": "none"}}
        ],
        "timings": timings,
    }
    (Path(__file__).parent / "data" / "replay_rules.json").write_text(json.dumps(doc, indent=0))


if __name__ == "__main__":
    main()
