#!/usr/bin/env bash
# The diarization example on a MINUTES-long meeting with the CUDA backend at several --jobs
# (concurrent GMM calls from a thread pool), same audio: time and DER of each.
#   source .gpu/device-env.sh && MINUTES=60 JOBS="1 4" bash scripts/gpu_diarization_jobs.sh
set -u
MINUTES=${MINUTES:-60}
source scripts/gpu_common.sh
W=$(long_meeting $MINUTES); R=${W%.wav}.rttm
for j in ${JOBS:-1 4}; do
  for rep in 1 2; do
    echo "jobs=$j run $rep"
    timeout 200 python3 examples/diarization/diarize.py $W --rttm /tmp/a.rttm --ref $R --backend cuda --jobs $j 2>&1 | grep -E "processing|x-realtime|DER|speakers|error"
  done
done
