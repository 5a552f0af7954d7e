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
# The gallery's fits record their timings in a history of the build's own (unless ASP_GMM_DB is set),
# so that the pages do not depend on, or add to, the tuning history of whoever builds them.
mkdir -p docs/_build
export ASP_GMM_DB="${ASP_GMM_DB:-sqlite:///$PWD/docs/_build/tuning-history.sqlite}"
exec "$py" -m sphinx -W --keep-going -b html -d docs/_build/doctrees "$@" docs docs/_build/html
