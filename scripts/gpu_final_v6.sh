#!/usr/bin/env bash
# Final check of the tensor-core pass on the lent GPU: all GPU tests, the iteration benchmark (diag with
# V5, what selection runs, and V6 pinned), and V6's guard on the benchmark's own start (how many
# components it recomputes exactly). Short table last.
#   source .gpu/device-env.sh && export OUT && bash scripts/gpu_final_v6.sh
set -uo pipefail
source scripts/gpu_common.sh
python3 scripts/gpu_precompile.py --jobs 16 > "$OUT/precompile.log" 2>&1; tail -1 "$OUT/precompile.log"
python3 -m pytest -q tests/test_cuda_gpu.py tests/test_cuda_v5.py tests/test_cuda_v6.py > "$OUT/test_gpu.log" 2>&1
echo "GPU tests: $(tail -1 "$OUT/test_gpu.log")"; grep -E "^FAILED" "$OUT/test_gpu.log" | head -20
python3 - > "$OUT/guard.log" 2>&1 <<'PY'
import sys; sys.path.insert(0, "benchmarks")
import numpy as np, gpu as b, v6_probe as vp
rng = np.random.default_rng(2026)
X = b.blobs(rng, 500_000, 36, 128)
w, mu, cv = b.init_params(rng, X, 128, "diag")
pr = vp.mstep_probe(X, w, mu, cv)
print("benchmark start (500000, 36, 128): flagged", int(pr["flags"].sum()), "of 128; launches (ms)", pr["launch_ms"],
      "; max ratio", float(pr["ratio"].max()))
PY
cat "$OUT/guard.log" | tail -3
python3 benchmarks/gpu.py --iteration-only --no-torch --diag-variant V5 --shapes 500000x36x128,150000x19x16 \
  --cvtypes diag,full > "$OUT/bench_v5.log" 2>&1
python3 benchmarks/gpu.py --iteration-only --no-torch --diag-variant V6 --shapes 500000x36x128,150000x19x16 \
  --cvtypes diag --json "$OUT/gpu_bench_v6.json" > "$OUT/bench_v6.log" 2>&1
echo "== V5 (selection's diag)"; tail -6 "$OUT/bench_v5.log"
echo "== V6 pinned"; tail -4 "$OUT/bench_v6.log"
