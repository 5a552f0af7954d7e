#!/usr/bin/env bash
# Set up .venv with the test, example and documentation dependencies, then run the whole test suite
# (tests/test_docs.py builds the documentation site with warnings as errors and runs its examples).
# GPU tests run only where pycuda and an NVIDIA GPU exist (skipped with the reason elsewhere);
# CUDA templates are compiled with nvcc everywhere nvcc exists.
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup_env.sh test,examples,docs
exec "${ASP_GMM_VENV:-.venv}/bin/python" -m pytest -q "$@"
