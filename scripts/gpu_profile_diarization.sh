set -u
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
export ASP_GMM_CACHE_DIR=/tmp/asp_gmm_cache ASP_GMM_DB=sqlite:////tmp/h.sqlite PYTHONUNBUFFERED=1
mkdir -p $ASP_GMM_CACHE_DIR; cp -r .gpu_cache/. $ASP_GMM_CACHE_DIR/
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > $OUT/install.log 2>&1 || exit 1
python3 -c "
import sys; sys.path.insert(0,'benchmarks'); import diarization as b
from pathlib import Path
print(b.build_long(20, [Path('examples/diarization/data/meeting.flac')]))"
W=benchmarks/out/long_20min.wav
timeout 200 python3 examples/diarization/diarize.py $W --rttm /tmp/a.rttm --backend cuda 2>&1 | tail -3
timeout 200 python3 -m cProfile -o $OUT/prof.out examples/diarization/diarize.py $W --rttm /tmp/a.rttm --backend cuda 2>&1 | tail -3
python3 -c "
import pstats; s=pstats.Stats('$OUT/prof.out'); s.sort_stats('tottime').print_stats(25)" 2>&1 | tail -40
python3 -c "
import pstats; s=pstats.Stats('$OUT/prof.out'); s.sort_stats('cumtime').print_stats(45)" 2>&1 | grep -E "asp_gmm|cluster|diarize" | head -40
