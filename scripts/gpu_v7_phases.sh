#!/usr/bin/env bash
# Where V7's fused E-step spends its time (issue 5, tenth pass): its GPU tests, the phase stamps of
# benchmarks/v7_phases.py, with NCU=1 the pipes' utilisation under Nsight Compute, and the iteration of
# V7 and V5 on shapes from memory-bound (small M) to arithmetic-bound (the benchmark's). Short table last.
#   source .gpu/device-env.sh && export OUT && [NCU=1] [SHAPES=...] bash scripts/gpu_v7_phases.sh
set -uo pipefail
source scripts/gpu_common.sh
python3 -m pytest -q -x tests/test_cuda_v7.py > "$OUT/test_v7.log" 2>&1; echo "test_cuda_v7: $(tail -1 "$OUT/test_v7.log")"
grep -E "^FAILED|Error|assert" "$OUT/test_v7.log" | head -20
for shape in "500000 36 128" "2000000 16 8"; do
  python3 benchmarks/v7_phases.py $shape > "$OUT/phases.log" 2>&1; tail -7 "$OUT/phases.log"
done
if [ "${NCU:-0}" = 1 ]; then
  PROF="import sys; sys.path.insert(0,'benchmarks'); import gpu, numpy as np
rng=np.random.default_rng(2026); X=gpu.blobs(rng,500000,36,128)
gpu.profile_once(X, gpu.init_params(rng,X,128,'diag'), 'diag', 'V7', None, 5)"
  python3 -c "$PROF" > /dev/null 2>&1
  ncu --clock-control none -k asp_v7_estep -s 4 -c 1 \
    --metrics 'regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active','regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active',gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed \
    python3 -c "$PROF" > "$OUT/ncu_pipes.txt" 2>&1
  grep -E "pct|duration|usecond" "$OUT/ncu_pipes.txt" | awk '$NF+0 > 0.5 || /duration/' | head -40
fi
for v in ${VARIANTS:-V7 V5}; do
  python3 benchmarks/gpu.py --iteration-only --no-torch --shapes ${SHAPES:-2000000x16x8,2000000x36x16,1000000x24x32,150000x19x16,500000x36x128} \
    --cvtypes diag --diag-variant $v --json "$OUT/roof_$v.json" > "$OUT/roof_$v.log" 2>&1
  echo "== $v"; grep -A8 "^per-EM-iteration" "$OUT/roof_$v.log" | tail -6 | cut -c1-100
done
