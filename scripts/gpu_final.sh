#!/usr/bin/env bash
# Application-level GPU measurements on the lent H100 (after scripts/gpu_check.sh): the diarization
# example on a 1-hour meeting, the scikit-learn drop-in, the selection gain on the GPU grid.
#   source .gpu/device-env.sh && bash scripts/gpu_final.sh [diarization] [sklearn] [selection]
set -uo pipefail
OUT=${OUT:-/tmp/gpu_final}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 ASP_GMM_CACHE_DIR=${ASP_GMM_CACHE_DIR:-/tmp/asp_gmm_cache}
export ASP_GMM_DB=${ASP_GMM_DB:-sqlite:////tmp/asp_gmm_history.sqlite}
mkdir -p "$ASP_GMM_CACHE_DIR"; [ -d .gpu_cache ] && cp -r .gpu_cache/. "$ASP_GMM_CACHE_DIR"/
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
  || { echo "install failed"; tail -20 "$OUT/install.log"; exit 1; }
steps=${*:-diarization sklearn selection}
for step in $steps; do
  case $step in
    diarization)
      timeout 300 python3 benchmarks/diarization.py --minutes 60 --backend cuda --repeat 2 2>&1 | tee "$OUT/diarization.log" | tail -25 ;;
    sklearn)
      for s in "--sizes 150000x19x16" "--sizes 500000x36x128 --cvtypes full" "--sizes 500000x36x128 --cvtypes diag"; do
        timeout 200 python3 benchmarks/sklearn_dropin.py --backend cuda $s 2>&1 | tee -a "$OUT/sklearn.log" | tail -6
      done ;;
    selection)
      timeout 240 python3 benchmarks/selection.py --backend cuda --N 10000,100000,500000 --D 2,12,36 --M 1,16,128 --max-seconds 0.5 --out "$OUT/selection_cuda.json" 2>&1 | tee "$OUT/selection.log" | tail -25 ;;
  esac
done
