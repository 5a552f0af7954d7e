#!/usr/bin/env bash
# Where the diarization example's time goes on the lent GPU: the new CUDA tests of the session
# machinery (padding, pooled buffers, resident data), then a MINUTES-long meeting (the bundled one
# looped) diarized twice with the CUDA backend (first run: empty tuning history; second: warm),
# the second under cProfile.
#   source .gpu/device-env.sh && MINUTES=60 bash scripts/gpu_profile_diarization.sh
set -u
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
MINUTES=${MINUTES:-60}
export ASP_GMM_CACHE_DIR=/tmp/asp_gmm_cache ASP_GMM_DB=sqlite:////tmp/h.sqlite PYTHONUNBUFFERED=1
mkdir -p $ASP_GMM_CACHE_DIR; cp -r .gpu_cache/. $ASP_GMM_CACHE_DIR/
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > $OUT/install.log 2>&1 || { tail $OUT/install.log; exit 1; }
if [ -n "${TESTS:-}" ]; then
  timeout 240 python3 -m pytest -q -x tests/test_cuda_gpu.py -k "$TESTS" 2>&1 | tail -5
fi
python3 -c "
import sys; sys.path.insert(0,'benchmarks'); import diarization as b
from pathlib import Path
open('/tmp/long_path', 'w').write(str(b.build_long($MINUTES, [Path('examples/diarization/data/meeting.flac')])))" >/dev/null
W=$(cat /tmp/long_path)
R=${W%.wav}.rttm
for run in 1 2; do
  if [ $run = 2 ]; then PROF="-m cProfile -o $OUT/prof.out"; else PROF=""; fi
  timeout 200 python3 $PROF examples/diarization/diarize.py $W --rttm /tmp/a.rttm --ref $R --backend cuda 2>&1 | tail -4
done
python3 -c "
import pstats; s=pstats.Stats('$OUT/prof.out'); s.sort_stats('tottime').print_stats(22)" 2>&1 | tail -30
python3 -c "
import pstats; s=pstats.Stats('$OUT/prof.out'); s.sort_stats('cumtime').print_stats(60)" 2>&1 | grep -E "asp_gmm|cluster|diarize|features" | head -30
