#!/usr/bin/env bash
# The diarization example on a MINUTES-long meeting with the CUDA backend at several --jobs
# (concurrent GMM calls from a thread pool), same audio: time and DER of each.
#   source .gpu/device-env.sh && MINUTES=60 JOBS="1 4" bash scripts/gpu_diarization_jobs.sh
set -u
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
MINUTES=${MINUTES:-60}
export ASP_GMM_CACHE_DIR=/tmp/asp_gmm_cache ASP_GMM_DB=sqlite:////tmp/h.sqlite PYTHONUNBUFFERED=1
mkdir -p $ASP_GMM_CACHE_DIR; cp -r .gpu_cache/. $ASP_GMM_CACHE_DIR/
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > $OUT/install.log 2>&1 || { tail $OUT/install.log; exit 1; }
python3 -c "
import sys; sys.path.insert(0,'benchmarks'); import diarization as b
from pathlib import Path
open('/tmp/long_path', 'w').write(str(b.build_long($MINUTES, [Path('examples/diarization/data/meeting.flac')])))" >/dev/null
W=$(cat /tmp/long_path); R=${W%.wav}.rttm
for j in ${JOBS:-1 4}; do
  for rep in 1 2; do
    echo "jobs=$j run $rep"
    timeout 200 python3 examples/diarization/diarize.py $W --rttm /tmp/a.rttm --ref $R --backend cuda --jobs $j 2>&1 | grep -E "processing|x-realtime|DER|speakers|error"
  done
done
