#!/usr/bin/env bash
# The main job: set up .venv, then run the speaker-diarization example on the bundled meeting with
# the best backend present (CUDA if pycuda and a GPU are there, else compiled C). Prints speakers
# found, DER and x-realtime.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup_env.sh examples
py=${ASP_GMM_VENV:-.venv}/bin/python
if [ -f examples/diarization/diarize.py ] && [ -f examples/diarization/data/meeting.flac ]; then
    out=$(mktemp -d)
    "$py" examples/diarization/diarize.py examples/diarization/data/meeting.flac \
        --ref examples/diarization/data/meeting.rttm --rttm "$out/meeting.rttm" --backend auto "$@"
    echo "RTTM written to $out/meeting.rttm"
else
    "$py" examples/demo.py "$@"
fi
