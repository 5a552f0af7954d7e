#!/usr/bin/env bash
# Nsight Compute on V7's fused E-step at (500000, 36, 128) diag (issue 5, sixth pass): speed of light,
# occupancy, scheduler and warp-state statistics; the full report in $OUT/ncu.txt, the key lines last.
#   source .gpu/device-env.sh && export OUT && [TUN='{"mtc": 0}'] bash scripts/gpu_ncu_v7.sh
# ITERS (EM iterations run, default 2) and NCU_SKIP (asp_v7_estep launches skipped, default 1) pick the
# iteration profiled: the first ones from the broad start are not the converged ones the timings report.
source scripts/gpu_common.sh
which ncu || ls /usr/local/cuda*/bin/ncu
python3 -c "
import sys; sys.path.insert(0,'benchmarks'); import gpu, numpy as np
rng=np.random.default_rng(2026); X=gpu.blobs(rng,500000,36,128)
gpu.profile_once(X, gpu.init_params(rng,X,128,'diag'), 'diag', 'V7', ${TUN:-None}, ${ITERS:-2})" > /dev/null 2>&1
ncu --clock-control none -k asp_v7_estep -s ${NCU_SKIP:-1} -c 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats --section InstructionStats --section SourceCounters --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' python3 -c "
import sys; sys.path.insert(0,'benchmarks'); import gpu, numpy as np
rng=np.random.default_rng(2026); X=gpu.blobs(rng,500000,36,128)
gpu.profile_once(X, gpu.init_params(rng,X,128,'diag'), 'diag', 'V7', ${TUN:-None}, ${ITERS:-2})" > $OUT/ncu.txt 2>&1
grep -v "^    ---\|^\s*$" $OUT/ncu.txt | grep -E "Duration|Throughput|Registers|Shared Memory|Occupancy|Warp Cycles|Issued|Eligible|Active Warps|Block Limit|Stall|stall|Executed Ipc|Bank|Wavefronts|One or More|No Eligible|L1/TEX Hit|Mem Pipes|Dynamic|Driver|Waves" | head -60
grep -E "smsp__average_warps_issue_stalled" $OUT/ncu.txt | awk '{print $NF, $1}' | sort -gr | head -14
