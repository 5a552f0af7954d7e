#!/usr/bin/env bash
# Build the documentation site with warnings as errors: docs/_build/html/index.html.
# Needs the docs extra (pip install -e '.[docs]'); runs the gallery's examples on the CPU.
# Extra arguments go to sphinx-build (e.g. -E to rebuild every page).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-}"
if [ -z "$py" ]; then
    if [ -x "${ASP_GMM_VENV:-.venv}/bin/python" ]; then py="${ASP_GMM_VENV:-.venv}/bin/python"; else py=python3; fi
fi
exec "$py" -m sphinx -W --keep-going -b html -d docs/_build/doctrees "$@" docs docs/_build/html
