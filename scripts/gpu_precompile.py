"""Compile, in parallel and into the compile cache ($ASP_GMM_CACHE_DIR), every CUDA binary that the
GPU tests and benchmarks/gpu.py will load, so that a lent GPU's time is not spent in nvcc. Runs without
a GPU (nvcc only): build here, carry the cache folder to the GPU machine; there it finds every entry
(same nvcc version and architecture) and compiles only what is missing.

    python3 scripts/gpu_precompile.py [--arch sm_90] [--jobs N]
"""

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))

from asp_gmm import cache, registry  # noqa: E402
from asp_gmm.backends import cuda as cu  # noqa: E402
from asp_gmm.problem import Problem  # noqa: E402

TEST_CLASSES = [  # (D, M, cvtypes, dtype) used by tests/test_cuda_gpu.py
    (7, 3, ("full", "diag"), "float32"),
    (1, 4, ("full", "diag"), "float32"),
    (13, 1, ("full", "diag"), "float32"),
    (19, 16, ("full", "diag"), "float32"),
    (33, 5, ("full", "diag"), "float32"),
    (9, 4, ("full", "diag"), "float64"),
    (5, 3, ("full", "diag"), "float32"),
    (71, 3, ("full",), "float32"),
    (6, 4, ("full", "diag"), "float32"),
    (3, 2, ("full",), "float32"),
    (4, 2, ("full",), "float32"),
    (64, 2, ("full", "diag"), "float32"),
    (1, 1, ("full",), "float32"),
    (71, 2, ("full",), "float32"),
    (5, 12, ("full", "diag"), "float32"),
    (9, 24, ("full", "diag"), "float32"),  # padded M = 11, 21
    (6, 7, ("full", "diag"), "float32"),
    (6, 10, ("full", "diag"), "float32"),
    (6, 16, ("full", "diag"), "float32"),  # test_pooled_buffers_and_padding_over_varying_n_and_m
]
#: The diarization example (19 MFCCs, diag by default): every component class up to 64 (cluster models of 5 to 32
#: components, merged models of up to 64), every covariance variant with its default tunables.
DIARIZATION = [(19, M) for M in sorted({cu.component_class(m) for m in range(1, 65)})]


V5_GPU = [  # tests/test_cuda_v5.py on a GPU: (D, M) of GPU_SHAPES x the tunables it loads
    (D, M, cv, t)
    for D, M in ((7, 3), (1, 4), (19, 16), (36, 5), (6, 2))
    for cv, t in (("full", {}), ("full", {"tile": 4}), ("full", {"events": 16}), ("diag", {}))
]

TUNED = [
    ("V3", {"tile": 2}),
    ("V3", {"threads": 512}),
    ("V4", {"tile": 2}),
    ("V4", {"tile": 2, "threads": 128}),
    ("V4", {"blocks": 528, "tile": 2}),
    ("V4", {"blocks": 132, "threads": 128}),
]  # test_tunables_match_reference

V6_GPU = [  # tests/test_cuda_v6.py: (D, M, tunables), diag float32
    (36, 16, {}),
    (19, 5, {}),
    (3, 1, {}),
    (21, 8, {"blocks": 132}),
    (21, 8, {"blocks": 528}),
    (19, 8, {}),
    (12, 16, {}),
    (12, 8, {}),
]

V7_GPU = [  # tests/test_cuda_v7.py: (D, M, tunables), diag float32
    (36, 16, {}),
    (19, 5, {}),
    (3, 1, {}),
    (97, 128, {}),
    (4, 2, {}),
    (21, 8, {"bps": 1}),
    (21, 8, {"bps": 3}),
    (21, 8, {"bps": 4}),
    (12, 8, {}),
    (10, 6, {}),
    (11, 40, {}),
    (7, 40, {}),
    (36, 128, {}),
    (24, 80, {}),
    (71, 3, {}),
    (24, 32, {}),
]


def jobs():
    import gpu as bench

    out = {}
    classes = [(D, M, cv, dt) for D, M, cvs, dt in TEST_CLASSES for cv in cvs]
    diar = [(D, M, "diag", "float32") for D, M in DIARIZATION]
    classes += [c for c in diar if c not in classes]
    bench_classes = [(D, M, cv, "float32") for (_, D, M) in bench.SHAPES for cv in ("full", "diag")]
    ctx = dict(cu._DEFAULT_LIMITS)
    for D, M, cv, dt in classes + bench_classes:
        p = Problem(1000, D, M, cv, dt)
        core = registry.get("cuda", "core", "core")
        out[(core.key, D, M, cv, dt, ())] = (core, {}, p)
        for ev, etun in cu.estep_variants(p, ctx):
            out[(ev.key, D, M, cv, dt, tuple(sorted(etun.items())))] = (ev, etun, p)
        for v in registry.variants("cuda", "covariance"):
            if not cu.pluggable(v) or not v.allows(p, extra=ctx):
                continue
            sweeps = [{}] + (bench.SWEEP.get(v.name, []) if (D, M, cv, dt) in bench_classes else [])
            if cv == "full" and dt == "float32" and (D, M, cv, dt) not in diar:
                sweeps += [t for name, t in TUNED if name == v.name]
            for tun in sweeps:
                t = v.default_tunables()
                t.update(tun)
                out[(v.key, D, M, cv, dt, tuple(sorted(t.items())))] = (v, t, p)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    a = ap.parse_args()
    todo = jobs()
    t0 = time.time()
    before = cache.CompileStats.compiles

    def one(item):
        v, t, p = item
        try:
            cu.compile_variant(v, t, p, a.arch)
            return None
        except Exception as exc:  # noqa: BLE001
            return f"{v.key} {t} D={p.D} M={p.M} {p.cvtype} {p.dtype}: {exc}"

    for D, M, cv, t in V5_GPU:
        p = Problem(0, D, M, cv, "float32")
        for name, tun in (("V5", t), ("estep_fast", {})):
            v = registry.get("cuda", name)
            full = v.default_tunables()
            full.update(tun)
            todo[(v.key, D, M, cv, "float32", tuple(sorted(full.items())))] = (v, full, p)
    for variant, D, M, t in [("V6",) + x for x in V6_GPU] + [("V7",) + x for x in V7_GPU]:
        p = Problem(0, D, M, "diag", "float32")
        for name, tun in ((variant, t), ("core", None), ("estep_fast", {})):
            v = registry.get("cuda", name)
            if tun is None:
                todo[(v.key, D, M, "diag", "float32", ())] = (v, {}, p)
                continue
            full = v.default_tunables()
            full.update(tun)
            todo[(v.key, D, M, "diag", "float32", tuple(sorted(full.items())))] = (v, full, p)
    with ThreadPoolExecutor(max_workers=a.jobs) as ex:
        errors = [e for e in ex.map(one, todo.values()) if e]
    print(
        f"precompile: {len(todo)} binaries, {cache.CompileStats.compiles - before} compiled, "
        f"{len(errors)} failed, {time.time() - t0:.1f} s, cache {cache.cache_dir()}"
    )
    for e in errors:
        print("FAILED", e[:2000])
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
