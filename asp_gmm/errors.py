"""Exceptions the package raises; each message says what went wrong and what to do."""
from __future__ import annotations

from .reference import NotPositiveDefiniteError  # noqa: F401  (re-exported: part of the public API)


class ASPGMMError(Exception):
    """Base class of the package's own errors."""


class CompileError(ASPGMMError):
    """A rendered variant failed to compile.

    Attributes
    ----------
    command : list[str]
        The compiler command that was run.
    output : str
        What the compiler printed.
    source_path : str
        Path of the rendered source, kept for inspection.
    """

    def __init__(self, command, output: str, source_path: str, variant: str = ""):
        self.command, self.output, self.source_path, self.variant = list(command), output, source_path, variant
        what = f"variant {variant}" if variant else "rendered source"
        super().__init__(
            f"compiling {what} failed.\n  command: {' '.join(map(str, self.command))}\n"
            f"  rendered source: {source_path}\n  compiler output:\n{output.rstrip()}")


class BackendUnavailableError(ASPGMMError):
    """The requested backend cannot run here (missing package, no device)."""


class VariantNotApplicableError(ASPGMMError, ValueError):
    """A pinned variant's declared limits exclude the problem."""


class KernelError(ASPGMMError, RuntimeError):
    """A compiled kernel reported a failure at run time (launch failure, allocation failure...)."""


class CacheError(ASPGMMError, OSError):
    """The compile cache folder cannot be used (not a folder, cannot be created, read-only where a
    binary must be compiled); the message names the folder and ``ASP_GMM_CACHE_DIR``."""


class UnsafeCacheError(CacheError, PermissionError):
    """A compile cache folder or entry that another user could have written (writable by group or
    others, or owned by someone else): its binaries are not loaded. The message names the path,
    what is wrong and the fix."""


class StreamError(ASPGMMError, ValueError):
    """A chunk source (a memmap, an h5py/zarr dataset, a callable yielding row chunks) gave data that
    cannot be trained on: a chunk of the wrong width or type, NaN or infinity (the message names the
    chunk and the row), no rows at all, or different rows on a later pass."""


class SettingError(ASPGMMError, ValueError):
    """An ``ASP_GMM_*`` environment setting has a value that cannot be used; the message names the
    setting, the value and what it accepts."""
