"""The package's exceptions: one family under :class:`ASPGMMError`.

Every class also derives from the built-in (or NumPy) exception that users already catch, so that
``except ValueError``, ``except FloatingPointError`` or ``except numpy.linalg.LinAlgError`` keeps working.
Each message says what went wrong and what to do.

Two families live in modules that may not import this one, and this module derives from them:

* :mod:`asp_gmm.reference` imports nothing of the project, so it defines its own
  ``NotPositiveDefiniteError`` and ``NonFiniteError``; the classes here subclass them, and the backends
  raise the classes here (:func:`from_reference` translates what the reference raised).
* :mod:`asp_gmm.tuning_db` imports nothing of ``asp_gmm``; its ``HistoryError`` (and
  ``SchemaMismatchError``) are subclassed here, and :func:`from_history` translates at the callers.

Hierarchy::

    ASPGMMError
    ├── NotPositiveDefiniteError   (numpy.linalg.LinAlgError, ValueError)
    ├── NonFiniteError             (FloatingPointError, ValueError)
    ├── NonFiniteInputError        (ValueError)
    ├── VariantNotApplicableError  (ValueError)
    ├── ManifestError              (ValueError)
    ├── CompileError
    ├── BackendUnavailableError
    ├── KernelError                (RuntimeError)
    ├── HistoryError               (tuning_db.HistoryError)
    │   └── SchemaMismatchError    (tuning_db.SchemaMismatchError)
    └── CacheError                 (OSError)
        └── UnsafeCacheError       (PermissionError)
"""

from __future__ import annotations

from . import reference as _reference
from .tuning_db import errors as _store


class ASPGMMError(Exception):
    """Base class of the package's own errors."""


class NotPositiveDefiniteError(ASPGMMError, _reference.NotPositiveDefiniteError):
    """A covariance matrix is not (numerically) positive definite.

    Also a :class:`numpy.linalg.LinAlgError` and a :class:`ValueError`.

    Attributes
    ----------
    component : int
        Index of the offending component.
    """


class NonFiniteError(ASPGMMError, _reference.NonFiniteError):
    """The log-likelihood or a parameter became NaN or infinite (never returned silently).

    Also a :class:`FloatingPointError` and a :class:`ValueError`.
    """


class NonFiniteInputError(ASPGMMError, ValueError):
    """The data holds NaN or infinity, found where it was uploaded (on the GPU, during the transpose).

    Attributes
    ----------
    row, column : int
        The first such event (the lowest row; the first bad column of that row, or -1 when the
        host copy of that row is finite: the value overflowed the working precision on the way).
    call : str
        The public call that got the data (``"train"``, ``"score"``...), or "" when not known.
    """

    def __init__(self, row: int, column: int, call: str = "", beyond: str = ""):
        self.row, self.column, self.call, self.beyond = int(row), int(column), call, beyond
        before = ("training" if call == "train" else f"{call}()") if call else "the call"
        if beyond:
            msg = (
                f"X has values beyond the {beyond} range (first at row {row}, column {column}); scale the data "
                "or use dtype=np.float64"
            )
        else:
            msg = (
                f"X contains NaN or infinity (first at row {row}, column {column}); remove or impute those "
                f"events before {before}"
            )
        super().__init__(msg)

    @classmethod
    def at(cls, X, row: int, dtype=None, line=None) -> "NonFiniteInputError":
        """The error for X's first bad row ``row`` (its column looked up in that row alone, or in
        ``line``, that row on the host, when X is not a host array)."""
        import numpy as np

        line = np.asarray(X[row] if line is None else line)
        bad = np.flatnonzero(~np.isfinite(line))
        if bad.size:
            return cls(row, int(bad[0]), "")
        # finite on the host: a value beyond the working precision (float64 data as float32)
        with np.errstate(over="ignore"):
            conv = line.astype(dtype or np.float32)
        over = np.flatnonzero(~np.isfinite(conv))
        return cls(row, int(over[0]) if over.size else -1, "", np.dtype(dtype or np.float32).name)

    def for_call(self, call: str, within=None) -> "NonFiniteInputError":
        """The same error, its message naming the public call; with ``within`` (the array the
        caller passed), the row counted in that array when the data checked was a strided view of it
        (a sample of every k-th event, as the specializer explores on)."""
        return NonFiniteInputError(self._row_in(within), self.column, call, self.beyond)

    def _row_in(self, base) -> int:
        import numpy as np

        src = getattr(self, "source", None)
        if base is None or src is None or src is base:
            return self.row
        if not (isinstance(src, np.ndarray) and isinstance(base, np.ndarray)) or src.ndim != 2 or base.ndim != 2:
            return self.row
        step = base.strides[0]
        start = src.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        if not np.may_share_memory(src, base) or step <= 0 or start % step or src.strides[0] % step:
            return self.row
        return start // step + self.row * (src.strides[0] // step)


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
    variant : str
        Name of the variant ("" when unknown).
    """

    def __init__(self, command, output: str, source_path: str, variant: str = ""):
        self.command, self.output, self.source_path, self.variant = list(command), output, source_path, variant
        what = f"variant {variant}" if variant else "rendered source"
        super().__init__(
            f"compiling {what} failed.\n  command: {' '.join(map(str, self.command))}\n"
            f"  rendered source: {source_path}\n  compiler output:\n{output.rstrip()}"
        )


class BackendUnavailableError(ASPGMMError):
    """The requested backend cannot run here (missing package, no device)."""


class VariantNotApplicableError(ASPGMMError, ValueError):
    """A pinned variant's declared limits exclude the problem."""


class ManifestError(ASPGMMError, ValueError):
    """A variant manifest (``variants/<backend>/*.toml``) breaks its schema; the message names the
    file, the key and the keys that are known."""


class KernelError(ASPGMMError, RuntimeError):
    """A compiled kernel reported a failure at run time (launch failure, allocation failure...)."""


class HistoryError(ASPGMMError, _store.HistoryError):
    """The tuning history cannot be used; the message names the database and what to do."""


class SchemaMismatchError(HistoryError, _store.SchemaMismatchError):
    """A history database or export file of another schema version."""


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


def from_reference(exc: BaseException) -> BaseException:
    """The package's class for an exception :mod:`asp_gmm.reference` raised (others unchanged).

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    BaseException
        A :class:`NotPositiveDefiniteError` / :class:`NonFiniteError` carrying the same message and
        attributes, or ``exc`` itself.
    """
    if isinstance(exc, ASPGMMError):
        return exc
    if isinstance(exc, _reference.NotPositiveDefiniteError):
        return NotPositiveDefiniteError(exc.component, getattr(exc, "reg_covar", None), getattr(exc, "detail", ""))
    if isinstance(exc, _reference.NonFiniteError):
        return NonFiniteError(*exc.args)
    return exc


def from_history(exc: BaseException) -> BaseException:
    """The package's class for an exception :mod:`asp_gmm.tuning_db` raised (others unchanged)."""
    if isinstance(exc, ASPGMMError):
        return exc
    if isinstance(exc, _store.SchemaMismatchError):
        return SchemaMismatchError(*exc.args)
    if isinstance(exc, _store.HistoryError):
        return HistoryError(*exc.args)
    return exc
