#!/usr/bin/env bash
# Tensor-core diag pass on the lent GPU (issue 5): V6 and the tensor-core moments tests, the V6
# accuracy probe, the diag/full iteration benchmark, then the rest of the GPU tests. Short table last.
#   source .gpu/device-env.sh && export OUT && bash scripts/gpu_v6.sh [quick]
set -uo pipefail
source scripts/gpu_common.sh
python3 scripts/gpu_precompile.py --jobs 16 > "$OUT/precompile.log" 2>&1; tail -1 "$OUT/precompile.log"
python3 -m pytest -q -x tests/test_cuda_v6.py > "$OUT/test_v6.log" 2>&1; echo "test_cuda_v6: $(tail -1 "$OUT/test_v6.log")"
python3 benchmarks/v6_probe.py > "$OUT/probe.log" 2>&1; tail -40 "$OUT/probe.log"
python3 benchmarks/gpu.py --iteration-only --no-torch --estep-sweep --shapes ${SHAPES:-500000x36x128,150000x19x16} --cvtypes diag,full \
  > "$OUT/bench.log" 2>&1; tail -25 "$OUT/bench.log"
if [ "${1:-}" != quick ]; then
  python3 -m pytest -q tests/test_cuda_gpu.py tests/test_cuda_v5.py > "$OUT/test_gpu.log" 2>&1
  echo "test_cuda_gpu+v5: $(tail -1 "$OUT/test_gpu.log")"; grep -E "^FAILED|Error" "$OUT/test_gpu.log" | head -20
fi
grep -E "failed|FAILED" "$OUT/test_v6.log" | head -20
