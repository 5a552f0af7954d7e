"""The installed distribution's version (setup.cfg's ``version`` is the one place it is written).

A module of its own so that the floors below the Face (the runtime, the compile cache, the CLI)
read it without importing the package's ``__init__``."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("asp_gmm")
except _metadata.PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0+unknown"
