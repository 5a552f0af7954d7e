"""The installed distribution's version (setup.cfg's ``version`` is the one place it is written).

A module of its own so that the floors below the Face (the runtime, the compile cache, the CLI)
read it without importing the package's ``__init__``.

The version is read from the distribution's ``METADATA`` file, found as
:mod:`importlib.metadata` finds it (the first ``asp_gmm-*.dist-info`` folder on ``sys.path``)
but without importing that module, whose imports (``email``, ``zipfile``...) cost 20-30 ms of every
process's start; anything else (an egg, a zipped path, no ``Version`` line) is left to
:mod:`importlib.metadata`."""

import os
import sys


def _from_dist_info() -> str | None:
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            # "{name}-{version}.dist-info", the name normalised ("-" and "." written "_")
            if name.endswith(".dist-info") and name.partition("-")[0].lower().replace(".", "_") == "asp_gmm":
                try:
                    with open(os.path.join(entry or ".", name, "METADATA"), encoding="utf-8") as f:
                        for line in f:
                            if line.startswith("Version:"):
                                return line.split(":", 1)[1].strip()
                            if not line.strip():
                                break  # the end of the headers
                except OSError:
                    pass
                return None
    return None


def _lookup() -> str:
    found = _from_dist_info()
    if found:
        return found
    from importlib import metadata

    try:
        return metadata.version("asp_gmm")
    except metadata.PackageNotFoundError:  # running from a checkout that was never installed
        return "0+unknown"


__version__ = _lookup()
