"""One call each of the diarization-like batch's models, pass after pass, from a fresh compile
cache and tuning history: what a user's first minutes of many small ``GMM.train`` calls cost while
the selection explores and the candidates compile in the background.

    python benchmarks/one_each.py --passes 10 --cases diag16,full8

Each pass trains the 32 models of ``benchmarks/batch.py``'s diarization batch (D = 19, 2k-20k events,
5 iterations) one call each; printed per case: every pass's total (ms), the calls over
``--spike-ms``, the cumulative time. ``--keep-cache`` uses the user's compile cache (a fresh history
only).
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passes", type=int, default=10)
    ap.add_argument("--cases", default="diag16,full8", help="cvtype and M, e.g. diag16,full8,full16")
    ap.add_argument("--backend", default="c")
    ap.add_argument("--spike-ms", type=float, default=30.0)
    ap.add_argument("--keep-cache", action="store_true")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="asp_gmm_one_each_") as folder:
        os.environ["ASP_GMM_DB"] = f"sqlite:///{folder}/history.sqlite"
        if not a.keep_cache:
            os.environ["ASP_GMM_CACHE_DIR"] = os.path.join(folder, "cache")
        import numpy as np
        from batch import diar_batch, models

        rng = np.random.default_rng(35)
        total, spikes = 0.0, 0
        for case in a.cases.split(","):
            cvtype, M = case.rstrip("0123456789"), int(case.lstrip("adfgilu"))
            data, params = diar_batch(rng, M, cvtype)
            per = []
            for _ in range(a.passes):
                s = 0.0
                for g, X in zip(models(params, cvtype, a.backend), data):
                    t0 = time.perf_counter()
                    g.train(X, min_em_iters=5, max_em_iters=5, tol=0.0)
                    t = time.perf_counter() - t0
                    s += t
                    spikes += t > a.spike_ms / 1e3
                per.append(round(1e3 * s))
                total += s
            print(f"{case}: passes {per} ms", flush=True)
        print(f"cumulative {1e3 * total:.0f} ms, calls over {a.spike_ms:g} ms: {spikes}")
        from asp_gmm.backends import get_backend
        from selection import _close_history

        get_backend(a.backend).wait_background()  # nothing left writing into the folder
        _close_history()


if __name__ == "__main__":
    main()
