#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment in .venv and installs the package with
# the extras named in $1 (e.g. "test,examples"). Sourced by run.sh and test.sh.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="${ASP_GMM_VENV:-$here/.venv}"
extras="${1:-}"
if [ ! -x "$venv/bin/python" ]; then
    if ! python3 -m venv "$venv" 2>/dev/null; then
        # Debian ships venv's pip bootstrap separately
        rm -rf "$venv"
        if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
            ver=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
            apt-get update -qq && (apt-get install -y -qq "python${ver}-venv" || apt-get install -y -qq python3-venv)
            python3 -m venv "$venv"
        else
            echo "python3 -m venv failed: install the python3-venv package (apt-get install python3-venv)" >&2
            exit 1
        fi
    fi
fi
stamp="$venv/.asp_gmm-installed-$(cat "$here/setup.cfg" "$here/pyproject.toml" | sha256sum | cut -c1-16)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
    log="$venv/install.log"
    echo "setting up $venv (log: $log) ..."
    if ! { "$venv/bin/python" -m pip install --upgrade pip setuptools wheel &&
           "$venv/bin/python" -m pip install -e "$here${extras:+[$extras]}"; } >"$log" 2>&1; then
        tail -30 "$log" >&2
        echo "installing the package into $venv failed; the whole log is $log" >&2
        exit 1
    fi
    touch "$stamp"
fi
