#!/usr/bin/env bash
# The fused diag variant V7 on the lent GPU (issue 5): its tests, the per-iteration probe (phases and
# guard flags), the diag iteration of V7 and of V5 (what selection ran before) side by side; with
# "full", the generic GPU variant tests too. Short table last.
#   source .gpu/device-env.sh && export OUT && bash scripts/gpu_v7.sh [full]
set -uo pipefail
source scripts/gpu_common.sh
python3 -m pytest -q -x tests/test_cuda_v7.py tests/test_cuda_gpu.py -k "V7 or v7" > "$OUT/test_v7.log" 2>&1; echo "test_cuda_v7: $(tail -1 "$OUT/test_v7.log")"
grep -E "^FAILED|Error|assert" "$OUT/test_v7.log" | head -20
python3 benchmarks/v7_probe.py > "$OUT/probe.log" 2>&1; tail -30 "$OUT/probe.log"
for v in V7 V5; do
  python3 benchmarks/gpu.py --iteration-only --no-torch --shapes ${SHAPES:-500000x36x128,150000x19x16} --cvtypes diag \
    --diag-variant $v --json "$OUT/bench_$v.json" > "$OUT/bench_$v.log" 2>&1
  echo "== $v"; grep -E "iteration diag" "$OUT/bench_$v.log" | sed -E "s/.*'iter_ms': ([0-9.]+).*'sums_ms': ([0-9.]+), 'cov_ms': ([0-9.]+), 'fe_ms': ([0-9.]+).*/iter \1 sums \2 cov \3 fe \4/"
done
if [ "${1:-}" = full ]; then
  python3 -m pytest -q tests/test_cuda_gpu.py tests/test_cuda_v6.py > "$OUT/test_gpu.log" 2>&1
  echo "test_cuda_gpu: $(tail -1 "$OUT/test_gpu.log")"; grep -E "^FAILED" "$OUT/test_gpu.log" | head -20
fi
