#!/usr/bin/env bash
# The CUDA backend on a GPU machine (the lent H100), from the repository root:
#   installs the project, fills the compile cache (cubins carried in .gpu_cache are reused when nvcc
#   and the architecture match), runs the GPU tests, the GPU benchmark, then the rest of the suite,
#   and prints a short summary last. Logs and the benchmark's JSON go to $OUT (default /tmp/gpu_check).
#
#   bash scripts/gpu_check.sh
#
# Needs nvcc, an NVIDIA GPU, pycuda and pytest (torch for the benchmark's peers). On a machine without
# network, put what pip needs on PYTHONPATH first (e.g. source a device-env.sh that does, if you have one).
#
# Settings: GPU_CHECK_SUITE=0 skips the non-GPU part of the suite; GPU_TESTS lists the GPU test files
# (default test_cuda_gpu.py test_cuda_v5.py test_cuda_compile.py); GPU_BENCH_ARGS passes arguments to
# benchmarks/gpu.py (e.g. "--shapes 150000x19x16 --no-torchgmm", "--iteration-only").
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export ASP_GMM_CACHE_DIR=${ASP_GMM_CACHE_DIR:-/tmp/asp_gmm_cache}
mkdir -p "$ASP_GMM_CACHE_DIR"
if [ -d .gpu_cache ]; then cp -r .gpu_cache/. "$ASP_GMM_CACHE_DIR"/; fi
t0=$(date +%s)
status=()

# setuptools and wheel travel in .gpu/wheels (device-env.sh puts them on PYTHONPATH); if the editable
# install still fails, run from the checkout: asp_gmm.variants is then a link to variants/
if ! python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1; then
  echo "pip install -e . failed (see install.log); using PYTHONPATH=$PWD"; tail -5 "$OUT/install.log"
  [ -e asp_gmm/variants ] || ln -s ../variants asp_gmm/variants
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "import asp_gmm.variants, asp_gmm; print('asp_gmm from', asp_gmm.__file__)" || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
nvcc --version | tail -1
python3 - <<'PY'
import pycuda, torch
from asp_gmm.backends import get_backend, unavailable_reason
print("pycuda", pycuda.VERSION_TEXT, "| torch", torch.__version__, "| cuda backend:", unavailable_reason("cuda") or "available",
      "| auto ->", get_backend("auto").name)
PY

python3 scripts/gpu_precompile.py 2>&1 | tee "$OUT/precompile.log"

echo "== GPU tests"
python3 -m pytest -q -rs ${GPU_TESTS:-tests/test_cuda_gpu.py tests/test_cuda_v5.py tests/test_batch_gpu.py tests/test_cuda_compile.py} 2>&1 \
  | tee "$OUT/pytest_gpu.log"
status+=("gpu tests: $(tail -1 "$OUT/pytest_gpu.log")")

echo "== GPU benchmark"
python3 benchmarks/gpu.py --json "$OUT/gpu_bench.json" ${GPU_BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
status+=("benchmark: exit ${PIPESTATUS[0]}")

if [ "${GPU_CHECK_SUITE:-1}" != "0" ]; then
  echo "== rest of the suite"
  python3 -m pytest -q -rs tests --deselect tests/test_cuda_gpu.py --deselect tests/test_cuda_compile.py --deselect tests/test_cuda_v5.py --deselect tests/test_batch_gpu.py \
    2>&1 | tee "$OUT/pytest_rest.log" | tail -5
  status+=("rest of suite: $(tail -1 "$OUT/pytest_rest.log")")
fi

echo
echo "== summary ($(( $(date +%s) - t0 )) s)"
for s in "${status[@]}"; do echo "  $s"; done
sed -n '/^per-EM-iteration/,$p' "$OUT/bench.log"
