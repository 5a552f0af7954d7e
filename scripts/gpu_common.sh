# Sourced by the GPU scripts: install the checkout, seed the compile cache from .gpu_cache (built
# here with scripts/gpu_precompile.py, so device time is not spent in nvcc), keep the tuning history
# in /tmp, and long_meeting MINUTES -> the path of a MINUTES-long meeting (the bundled one looped).
OUT=${OUT:-/tmp/o}; mkdir -p "$OUT"
export ASP_GMM_CACHE_DIR=${ASP_GMM_CACHE_DIR:-/tmp/asp_gmm_cache}
export ASP_GMM_DB=${ASP_GMM_DB:-sqlite:////tmp/h.sqlite} PYTHONUNBUFFERED=1
mkdir -p "$ASP_GMM_CACHE_DIR"; [ -d .gpu_cache ] && cp -r .gpu_cache/. "$ASP_GMM_CACHE_DIR"/
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 \
  || { tail "$OUT/install.log"; exit 1; }

long_meeting() {
  python3 -c "
import sys; sys.path.insert(0, 'benchmarks'); import diarization as b
from pathlib import Path
open('/tmp/long_path', 'w').write(str(b.build_long($1, [Path('examples/diarization/data/meeting.flac')])))" >/dev/null
  cat /tmp/long_path
}
