#!/usr/bin/env bash
# Where the diarization example's time goes on the lent GPU: the new CUDA tests of the session
# machinery (padding, pooled buffers, resident data), then a MINUTES-long meeting (the bundled one
# looped) diarized twice with the CUDA backend (first run: empty tuning history; second: warm),
# the second under cProfile.
#   source .gpu/device-env.sh && MINUTES=60 bash scripts/gpu_profile_diarization.sh
set -u
MINUTES=${MINUTES:-60}
source scripts/gpu_common.sh
if [ -n "${TESTS:-}" ]; then
  timeout 240 python3 -m pytest -q -x tests/test_cuda_gpu.py -k "$TESTS" 2>&1 | tail -5
fi
W=$(long_meeting $MINUTES)
R=${W%.wav}.rttm
for run in 1 2; do
  if [ $run = 2 ]; then PROF="-m cProfile -o $OUT/prof.out"; else PROF=""; fi
  timeout 200 python3 $PROF examples/diarization/diarize.py $W --rttm /tmp/a.rttm --ref $R --backend cuda 2>&1 | tail -4
done
python3 -c "
import pstats; s=pstats.Stats('$OUT/prof.out'); s.sort_stats('tottime').print_stats(22)" 2>&1 | tail -30
python3 -c "
import pstats; s=pstats.Stats('$OUT/prof.out'); s.sort_stats('cumtime').print_stats(60)" 2>&1 | grep -E "asp_gmm|cluster|diarize|features" | head -30
