"""Every ``ASP_GMM_*`` environment setting, read in one place.

:func:`settings` reads the environment *at call time* (so a test or a user that sets a variable after
``import asp_gmm`` is obeyed) and returns a frozen :class:`Settings`. Nothing else in the package
reads ``os.environ`` for these names. The README's table of settings lists the same names, defaults
and meanings as :data:`SETTINGS` (``tests/test_config.py`` checks that they agree).

``asp_gmm.tuning_db`` imports nothing of ``asp_gmm``: its ``default_url`` takes the value from
``Settings.db`` when the package opens the history.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields

_FALSE = ("0", "false", "no", "off")

#: name -> (default as documented, meaning). The README's table is written from this.
SETTINGS = {
    "ASP_GMM_CACHE_DIR": ("platformdirs user cache dir", "folder of compiled binaries and their rendered sources"),
    "ASP_GMM_CACHE_TRUST": ("none", "users (names or uids) besides you and root whose cache files may be loaded"),
    "ASP_GMM_DB": ("SQLite file in the user data dir", "SQLAlchemy URL (or file path) of the tuning history"),
    "ASP_GMM_AUTOTUNE": ("on", "`0`/`false`/`no`/`off` turns exploring and recording off"),
    "ASP_GMM_DETERMINISTIC": (
        "off",
        "`1`: repeated calls on the C and NumPy backends give bitwise-identical results (the fixed rule "
        "picks every variant: no history, no exploring, no stand-in while a variant compiles); CUDA's "
        "atomic sums still agree to rounding only",
    ),
    "ASP_GMM_CC": ("`$CC`, else `gcc`", "C compiler command (may carry flags)"),
    "ASP_GMM_NUM_THREADS": ("`$OMP_NUM_THREADS`, else all cores", "CPU threads for large problems"),
    "ASP_GMM_NVCC": ("nvcc on PATH, else /usr/local/cuda/bin/nvcc", "nvcc command (may carry flags)"),
    "ASP_GMM_NVRTC": (
        "NVRTC when present",
        "`0`: compile CUDA with nvcc even where NVRTC (cuda-bindings) is installed",
    ),
    "ASP_GMM_CUDA_DEVICE": ("0", "ordinal of the GPU the CUDA backend uses"),
    "ASP_GMM_CUDA_ESTEP": ("unset (the policy chooses)", "pins the CUDA E-step variant by name"),
    "ASP_GMM_CUDA_SYNC": ("off", "`1`: synchronise after every CUDA launch (debugging)"),
    "ASP_GMM_DEBUG": ("off", "`1`: the CLI shows tracebacks of unexpected errors"),
    "ASP_GMM_DEVICE_BUDGET": (
        "`ASP_GMM_MEMORY_FRACTION` of free memory",
        "bytes an in-memory fit may take on the device; larger X is streamed",
    ),
    "ASP_GMM_MEMORY_FRACTION": ("0.5", "share of the device's free memory that is the budget"),
    "ASP_GMM_BLOCK_BYTES": (
        "last-level cache, at least 8 MiB (C); 1 GiB (CUDA); 64 MiB (others)",
        "data and posteriors per block of streamed EM",
    ),
    "ASP_GMM_CHUNK_BYTES": ("64 MiB", "bytes read at a time from an array-like source (rounded to its chunking)"),
    "ASP_GMM_PROGRESS": ("`auto`", "progress bar of streamed fits: `auto`, `1`, `0`"),
}


@dataclass(frozen=True)
class Settings:
    """The package's environment settings, as read by :func:`settings`.

    Empty strings mean "not set"; the accessors below apply the documented fallbacks.
    """

    cache_dir: str = ""
    cache_trust: str = ""
    db: str = ""
    autotune: bool = True
    deterministic: bool = False
    cc: str = ""
    num_threads: str = ""
    nvcc: str = ""
    nvrtc: bool = True
    cuda_device: str = ""
    cuda_estep: str = ""
    cuda_sync: bool = False
    debug: bool = False
    # streamed EM (asp_gmm/streaming.py parses and checks them: messages name the setting)
    device_budget: str = ""
    memory_fraction: str = ""
    block_bytes: str = ""
    chunk_bytes: str = ""
    progress: str = ""
    # fallbacks that are not ours but are read here too, so that one place says what was used
    env_cc: str = ""
    omp_num_threads: str = ""

    @classmethod
    def from_environ(cls, environ=None) -> "Settings":
        """Read the settings from ``environ`` (default ``os.environ``)."""
        env = os.environ if environ is None else environ

        def get(name):
            return (env.get(name) or "").strip()

        return cls(
            cache_dir=get("ASP_GMM_CACHE_DIR"),
            cache_trust=get("ASP_GMM_CACHE_TRUST"),
            db=get("ASP_GMM_DB"),
            autotune=get("ASP_GMM_AUTOTUNE").lower() not in _FALSE,
            deterministic=get("ASP_GMM_DETERMINISTIC").lower() not in ("",) + _FALSE,
            cc=get("ASP_GMM_CC"),
            num_threads=get("ASP_GMM_NUM_THREADS"),
            nvcc=get("ASP_GMM_NVCC"),
            nvrtc=get("ASP_GMM_NVRTC").lower() not in _FALSE,
            cuda_device=get("ASP_GMM_CUDA_DEVICE"),
            cuda_estep=get("ASP_GMM_CUDA_ESTEP"),
            cuda_sync=get("ASP_GMM_CUDA_SYNC") not in ("", "0"),
            debug=get("ASP_GMM_DEBUG") not in ("", "0"),
            device_budget=get("ASP_GMM_DEVICE_BUDGET"),
            memory_fraction=get("ASP_GMM_MEMORY_FRACTION"),
            block_bytes=get("ASP_GMM_BLOCK_BYTES"),
            chunk_bytes=get("ASP_GMM_CHUNK_BYTES"),
            progress=get("ASP_GMM_PROGRESS"),
            env_cc=get("CC"),
            omp_num_threads=get("OMP_NUM_THREADS"),
        )

    # ------------------------------------------------------------------ derived values
    def c_compiler(self) -> list:
        """The C compiler command: ``ASP_GMM_CC``, else ``CC``, else ``gcc`` (split on spaces)."""
        return (self.cc or self.env_cc or "gcc").split()

    def c_compiler_origin(self) -> str:
        """Where :meth:`c_compiler` comes from, for messages."""
        return (
            "from ASP_GMM_CC" if self.cc else "from CC" if self.env_cc else "the default; ASP_GMM_CC and CC are not set"
        )

    def threads(self) -> int | None:
        """Threads asked for (``ASP_GMM_NUM_THREADS``, else ``OMP_NUM_THREADS``), ``None`` when unset or
        not a number (then all cores are used)."""
        text = self.num_threads or self.omp_num_threads
        try:
            return int(text.split(",")[0])
        except ValueError:
            return None

    def names(self) -> list:
        return [f.name for f in fields(self)]

    def nbytes(self, name: str, default):
        """The byte setting ``name`` (``"ASP_GMM_BLOCK_BYTES"``, ``"ASP_GMM_CHUNK_BYTES"``,
        ``"ASP_GMM_DEVICE_BUDGET"``) as an int: a number with an optional ``k``/``M``/``G``/``T``
        suffix (``"2e9"``, ``"512M"``, ``"8G"``); ``default`` when unset. The one parser of byte
        settings; a bad value raises :class:`~asp_gmm.errors.SettingError` naming it."""
        raw = getattr(self, _BYTE_SETTINGS[name])
        if not raw:
            return default
        scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(raw[-1].lower(), 1)
        try:
            val = float(raw[:-1] if scale != 1 else raw) * scale
        except ValueError:
            val = float("nan")
        if not (math.isfinite(val) and val > 0):
            from .errors import SettingError

            raise SettingError(
                f"{name}={raw!r} is not a positive number of bytes; give e.g. 2e9, 512M or 8G, or unset it"
            )
        return int(val)


#: The byte settings :meth:`Settings.nbytes` parses, by environment name.
_BYTE_SETTINGS = {
    "ASP_GMM_DEVICE_BUDGET": "device_budget",
    "ASP_GMM_BLOCK_BYTES": "block_bytes",
    "ASP_GMM_CHUNK_BYTES": "chunk_bytes",
}


#: The names :meth:`Settings.from_environ` reads, in order (the key of :func:`settings`' memo).
_NAMES = (
    "ASP_GMM_CACHE_DIR",
    "ASP_GMM_CACHE_TRUST",
    "ASP_GMM_DB",
    "ASP_GMM_AUTOTUNE",
    "ASP_GMM_DETERMINISTIC",
    "ASP_GMM_CC",
    "ASP_GMM_NUM_THREADS",
    "ASP_GMM_NVCC",
    "ASP_GMM_NVRTC",
    "ASP_GMM_CUDA_DEVICE",
    "ASP_GMM_CUDA_ESTEP",
    "ASP_GMM_CUDA_SYNC",
    "ASP_GMM_DEBUG",
    "ASP_GMM_DEVICE_BUDGET",
    "ASP_GMM_MEMORY_FRACTION",
    "ASP_GMM_BLOCK_BYTES",
    "ASP_GMM_CHUNK_BYTES",
    "ASP_GMM_PROGRESS",
    "CC",
    "OMP_NUM_THREADS",
)
_memo: tuple = (None, None)  # (key, Settings), replaced whole (threads read one or the other)


def _environ_key():
    """The raw values of :data:`_NAMES` in ``os.environ`` now: a tuple compared by identity-cheap
    lookups in the mapping's own dict (about a microsecond), so that :func:`settings`, asked
    hundreds of times a call, parses the environment only when one of its values changed."""
    data = getattr(os.environ, "_data", None)
    enc = getattr(os.environ, "encodekey", None)
    if data is None or enc is None:
        return None
    keys = _KEYS.get(id(enc))
    if keys is None:
        keys = _KEYS[id(enc)] = tuple(enc(n) for n in _NAMES)
    return tuple(map(data.get, keys))


_KEYS: dict = {}


def settings() -> Settings:
    """The settings as the environment holds them now (parsed again only when a value changed)."""
    global _memo
    key = _environ_key()
    memo = _memo
    if key is not None and memo[0] == key:
        return memo[1]
    out = Settings.from_environ()
    if key is not None:
        _memo = (key, out)
    return out


def cache_root():
    """``(folder, origin)`` of the compile cache as configured: ``$ASP_GMM_CACHE_DIR`` (origin
    ``"ASP_GMM_CACHE_DIR"``) or the user cache folder of platformdirs (``"default"``). Only where it
    is: :func:`asp_gmm.cache.cache_dir` creates and checks it."""
    from pathlib import Path

    env = settings().cache_dir
    if env:
        return Path(env).expanduser().absolute(), "ASP_GMM_CACHE_DIR"
    return default_cache_dir(), "default"


def default_cache_dir():
    """The user cache folder of platformdirs (the compile cache without ``$ASP_GMM_CACHE_DIR``)."""
    from pathlib import Path

    import platformdirs

    return Path(platformdirs.user_cache_dir("asp_gmm")).absolute()
