"""Many models of one shape as stacked arrays: :class:`GMMBatch`.

:func:`asp_gmm.train_many` takes a list of :class:`~asp_gmm.GMM` objects, each with its own M and
its own data; for many problems of one shape (a thousand small clustering problems, one model per
image patch or per sensor) a list of a thousand models costs more Python than the GPU spends on
their EM. A :class:`GMMBatch` holds B models of one M, D and cvtype as arrays (member ``b`` is row
``b`` of ``weights``, ``means``, ``covars``) and trains them through the same batched variants and
selection as :func:`train_many`, with parameters and results exchanged as whole arrays:

    import numpy as np
    from asp_gmm import GMMBatch
    X = np.random.default_rng(0).normal(size=(1000, 400, 2)).astype(np.float32)  # 1 000 problems
    batch = GMMBatch(1000, 2, 2, cvtype="full")
    loglik = batch.train(X, max_em_iters=10)        # (1000,)
    batch.means.shape                               # (1000, 2, 2)

Each member's results are those of ``GMM(M, D, ...).train`` on its own data (the same seeding,
iterations and convergence rule).
"""

from __future__ import annotations

import importlib
import numbers

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from . import cuda_arrays
from .backends.batch_base import DeviceStack
from .batch_driver import BatchSpecializer
from .errors import BatchMemberError
from .fit.data import Data, check_data
from .gmm import GMM
from .many import _check_iters, _member, _on_host, _problems

__all__ = ["GMMBatch"]

#: values checked for NaN/inf at a time across members (no temporary of the whole batch)
_CHUNK = 1 << 20


class GMMBatch:
    """B independent Gaussian mixtures of one M, D, cvtype and dtype, trained together.

    Parameters
    ----------
    B : int
        Number of members.
    M, D : int
        Components and dimensions of every member.
    means : array (B, M, D), optional
    covars : array, optional
        ``(B, M, D, D)`` for "full", ``(B, M, D)`` "diag", ``(B, D, D)`` "tied", ``(B, M)``
        "spherical".
    weights : array (B, M), optional
        Each row non-negative and summing to 1.
    cvtype, dtype, reg_covar, backend, seed
        As for :class:`asp_gmm.GMM`, shared by every member. Parameters not given are seeded
        from each member's data at the first :meth:`train`, as ``GMM.train`` seeds them.

    Attributes
    ----------
    weights : ndarray (B, M)
    means : ndarray (B, M, D)
    covars : ndarray (B, ...)
        Member ``b``'s parameters are row ``b``; ``None`` until given or trained. A member that
        failed at its first ``train`` before it could be seeded (bad data) has NaN rows.
    loglik : ndarray (B,) or None
        Each member's total log-likelihood from the last :meth:`train` (NaN for a failed member).
    n_events, n_iter : ndarray of int (B,) or None
    converged : ndarray of bool (B,) or None
    loglik_trace : ndarray (B, max_em_iters + 1) or None
        Each member's log-likelihood after 0, 1, ... iterations of the last train; NaN past its
        ``n_iter``.
    last_variant : str or None
        The configuration that ran the last train.

    Examples
    --------
    >>> import numpy as np
    >>> from asp_gmm import GMMBatch
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(3, 500, 2)) + np.repeat([[0.0, 0.0], [6.0, 6.0]], 250, axis=0)
    >>> batch = GMMBatch(3, 2, 2, cvtype="diag", dtype=np.float64)
    >>> batch.train(X, max_em_iters=50).shape
    (3,)
    >>> np.sort(batch.means[:, :, 0], axis=1).round().astype(int).tolist()
    [[0, 6], [0, 6], [0, 6]]
    >>> batch[1].means.shape
    (2, 2)
    """

    def __init__(
        self,
        B: int,
        M: int,
        D: int,
        means: ArrayLike | None = None,
        covars: ArrayLike | None = None,
        weights: ArrayLike | None = None,
        cvtype: str = "full",
        dtype: DTypeLike = np.float32,
        reg_covar: float = 1e-6,
        backend: str = "auto",
        seed: int | None = None,
    ) -> None:
        if not isinstance(B, numbers.Integral) or isinstance(B, bool) or B <= 0:
            raise ValueError(f"B must be a positive integer (the number of members), got {B!r}")
        self.B = int(B)
        # the members' shared settings, checks and seeding: one GMM, its parameters set per member
        self._proto = GMM(M, D, cvtype=cvtype, dtype=dtype, reg_covar=reg_covar, backend=backend, seed=seed)
        g = self._proto
        self.M, self.D, self.cvtype, self.dtype = g.M, g.D, g.cvtype, g.dtype
        self.reg_covar, self.seed, self.backend = g.reg_covar, g.seed, g.backend
        self.means = self.covars = self.weights = None
        if means is not None:
            self.means = self._check_param("means", means, (self.B, self.M, self.D))
        if covars is not None:
            self.covars = self._check_param("covars", covars, (self.B,) + g._problem(0).covars_shape())
        if weights is not None:
            w = self._check_param("weights", weights, (self.B, self.M))
            sums = w.sum(axis=1, dtype=np.float64)
            bad = np.flatnonzero((w < 0).any(axis=1) | ~np.isclose(sums, 1.0, rtol=1e-4))
            if bad.size:
                raise ValueError(
                    f"weights of member {int(bad[0])} (and {bad.size - 1} more) are negative or do not sum to 1; "
                    "each row of weights must be non-negative and sum to 1"
                )
            self.weights = w
        self.loglik = self.n_events = self.n_iter = self.converged = self.loglik_trace = None
        self.last_variant = None

    def _check_param(self, name, value, shape):
        # a copy: training never writes the caller's array
        return self._proto._check_param(name, value, shape, copy=True, hint=" (B members first)")

    def __len__(self) -> int:
        return self.B

    def __repr__(self) -> str:
        return (
            f"GMMBatch(B={self.B}, M={self.M}, D={self.D}, cvtype={self.cvtype!r}, "
            f"dtype={self.dtype.name}, backend={self.backend!r})"
        )

    def __getitem__(self, b) -> GMM:
        """Member ``b`` as a :class:`asp_gmm.GMM` (a copy of its parameters and results)."""
        if not isinstance(b, numbers.Integral) or isinstance(b, bool):
            raise TypeError(f"a GMMBatch is indexed by a member number, got {b!r}")
        if not -self.B <= b < self.B:
            raise IndexError(f"member {b} of a batch of {self.B}")
        b = int(b) % self.B
        have = self.means is not None and self.covars is not None and self.weights is not None
        have = have and np.isfinite(self.weights[b]).all()
        g = GMM(
            self.M,
            self.D,
            means=self.means[b] if have else None,
            covars=self.covars[b] if have else None,
            weights=self.weights[b] if have else None,
            cvtype=self.cvtype,
            dtype=self.dtype,
            reg_covar=self.reg_covar,
            backend=self.backend,
            seed=self.seed,
        )
        if self.loglik is not None and np.isfinite(self.loglik[b]):
            g.loglik, g.n_events = float(self.loglik[b]), int(self.n_events[b])
            g.n_iter, g.converged, g.last_variant = int(self.n_iter[b]), bool(self.converged[b]), self.last_variant
        return g

    def models(self) -> list:
        """Every member as a :class:`asp_gmm.GMM` (see :meth:`__getitem__`)."""
        return [self[b] for b in range(self.B)]

    # ------------------------------------------------------------------ data
    def _members(self, X, method: str):
        """``(members, errors)``: each member's data checked as ``GMM.train`` checks its X (an
        array, a :class:`asp_gmm.Concat` or :class:`asp_gmm.Rows`), and the members refused.
        ``members`` is the (B, N, D) array itself (C-contiguous, the batch's dtype) when X is one,
        else a list."""
        need = self.M if method == "train" else 1
        if cuda_arrays.is_cuda_array(X):
            if self.backend == "cuda" and len(cuda_arrays.describe(X)["shape"]) == 3 and not self._needs_seed():
                return self._device_members(X, method, need)
            X = cuda_arrays.to_host(X)  # another backend, a ragged form, or seeding (reads the data on the host)
        if isinstance(X, np.ndarray) and X.ndim == 3:
            if X.shape[0] != self.B:
                raise ValueError(f"{method}(): X holds {X.shape[0]} members' data but the batch has B={self.B}")
            if X.dtype.kind != "f":
                raise TypeError(
                    f"X has dtype {X.dtype}; {method}() needs floating-point data. "
                    f"Convert it with X.astype(np.{self.dtype.name})."
                )
            if X.shape[2] != self.D:
                raise ValueError(f"{method}(): X has {X.shape[2]} dimensions but the members have D={self.D}")
            if X.shape[1] < need:
                raise ValueError(
                    f"{method}(): every member has N={X.shape[1]} events, fewer than the M={self.M} components; "
                    "use fewer components or more data"
                )
            with np.errstate(over="ignore"):
                A = np.ascontiguousarray(X, dtype=self.dtype)
            ok = _finite_members(A)
            errors = {}
            for b in np.flatnonzero(~ok):  # the member's own message (row, column; range or NaN)
                try:
                    check_data(X[b], self.D, self.dtype, need, name=f"X[{b}]", method=method)
                except (ValueError, TypeError) as exc:
                    errors[int(b)] = exc
            return A, errors
        if isinstance(X, (list, tuple)):
            if len(X) != self.B:
                raise ValueError(f"{method}(): {len(X)} data sets for a batch of B={self.B}; pass one per member")
            out, errors, seen = [], {}, {}
            for b, x in enumerate(X):
                try:
                    x = _member(x, self._proto, b, seen, method, need)
                except (ValueError, TypeError) as exc:
                    errors[b] = exc
                    x = None
                out.append(x)
            return out, errors
        raise TypeError(
            f"{method}(): X must be an array (B, N, D) or a sequence of B arrays (N_b, D), got {type(X).__name__}"
        )

    def _device_members(self, X, method: str, need: int):
        """A (B, N, D) CUDA array checked on its device (shape, dtype, NaN/inf per member) and kept
        there: the CUDA batch copies it device to device."""
        X = cuda_arrays.in_dtype(X, self.dtype)
        info = cuda_arrays.describe(X)
        B, N, D = info["shape"]
        if B != self.B:
            raise ValueError(f"{method}(): X holds {B} members' data but the batch has B={self.B}")
        if D != self.D:
            raise ValueError(f"{method}(): X has {D} dimensions but the members have D={self.D}")
        if N < need:
            raise ValueError(
                f"{method}(): every member has N={N} events, fewer than the M={self.M} components; "
                "use fewer components or more data"
            )
        errors = {}
        for b in np.flatnonzero(~cuda_arrays.finite_members(X)):
            row, col = cuda_arrays.first_non_finite(X[int(b)])
            errors[int(b)] = ValueError(
                f"X[{b}] contains NaN or infinity (first at row {row}, column {col}); remove or impute those "
                "events before " + ("training" if method == "train" else f"{method}()")
            )
        return DeviceStack(X, info["ptr"], (B, N, D), self.dtype), errors

    def _needs_seed(self) -> bool:
        if self.means is None or self.covars is None or self.weights is None:
            return True
        return not np.isfinite(self.weights).all()

    def _seed_missing(self, Xs, errors) -> None:
        """Seed the parameters not given, each member from its own data as ``GMM.train`` does
        (a member refused before it was ever seeded keeps NaN rows until a later train seeds it)."""
        g = self._proto
        shapes = {
            "weights": (self.B, self.M),
            "means": (self.B, self.M, self.D),
            "covars": (self.B,) + g._problem(0).covars_shape(),
        }
        for name, shape in shapes.items():
            if getattr(self, name) is None:
                setattr(self, name, np.full(shape, np.nan, self.dtype))
        have = np.ones(self.B, bool)
        for name in shapes:
            have &= np.isfinite(getattr(self, name).reshape(self.B, -1)).all(axis=1)
        for b in np.flatnonzero(~have):
            if b in errors:
                continue
            for name in shapes:
                row = getattr(self, name)[b]
                setattr(g, name, row.copy() if np.isfinite(row).all() else None)
            host = _on_host(Xs[b])
            try:
                g._seed(Data("host", host, host.shape[0]))
            except (ValueError, TypeError) as exc:
                errors[int(b)] = exc
                continue
            for name in shapes:
                getattr(self, name)[b] = getattr(g, name)
        g.means = g.covars = g.weights = None

    # ------------------------------------------------------------------ training
    def train(self, X, min_em_iters: int = 1, max_em_iters: int = 10, tol: float = 1e-3, variant: str | None = None):
        """Train every member on its own data in one batched call.

        Parameters
        ----------
        X : array (B, N, D), or a sequence of B arrays (N_b, D), :class:`asp_gmm.Concat` or :class:`asp_gmm.Rows`
            Member ``b`` trains on ``X[b]`` (at least M events). A 3-D array is checked for NaN
            and infinity in one pass over the batch.
        min_em_iters, max_em_iters, tol
            As in :meth:`asp_gmm.GMM.train`, for every member.
        variant : str, optional
            Pin a batched variant (see ``asp-gmm info``); by default the selection chooses.

        Returns
        -------
        ndarray (B,)
            Each member's total log-likelihood of its data under its trained parameters.

        Raises
        ------
        BatchMemberError
            Some members failed (bad data, too few events, not positive definite): the others
            were trained and their results set; ``errors`` maps each failed member to its
            exception, ``results`` holds every member's log-likelihood (``None`` if failed). A
            failed member keeps its parameters from before the call.
        """
        what = "GMMBatch.train()"
        _check_iters(min_em_iters, max_em_iters, tol, what)
        Xs, errors = self._members(X, "train")
        self._seed_missing(Xs, errors)
        keep = np.ones(self.B, bool)
        keep[list(errors)] = False
        run = np.flatnonzero(keep)
        for name in ("loglik", "n_events", "n_iter", "converged"):
            if getattr(self, name) is None:
                kind = {"loglik": np.float64, "converged": bool}.get(name, np.int64)
                setattr(self, name, np.full(self.B, np.nan) if kind is np.float64 else np.zeros(self.B, kind))
        self.loglik[list(errors)] = np.nan
        self.loglik_trace = np.full((self.B, int(max_em_iters) + 1), np.nan)
        if run.size:
            whole = run.size == self.B
            if isinstance(Xs, DeviceStack):  # on the GPU: the members that run, gathered there
                members = Xs if whole else _device_subset(Xs, run)
                Ns = [Xs.shape[1]] * run.size
            elif isinstance(Xs, np.ndarray):  # (B, N, D) stays one array: a backend may take it in one copy
                members = Xs if whole else Xs[run]
                Ns = [Xs.shape[1]] * run.size
            else:
                members = Xs if whole else [Xs[b] for b in run]
                Ns = [x.shape[0] for x in members]
            problems = _problems([self._proto] * run.size, Ns)

            def sel(a):
                a = a.astype(np.float64)
                return a if whole else a[run]

            spec = BatchSpecializer(self._proto._specializer)
            fit = spec.train_stacked(
                members,
                sel(self.weights),
                sel(self.means),
                sel(self.covars),
                problems,
                np.full(run.size, self.reg_covar),
                int(min_em_iters),
                int(max_em_iters),
                float(tol),
                variant,
            )
            good = np.ones(run.size, bool)
            good[list(fit.errors)] = False
            at = run[good]
            # new arrays (as GMM.train sets new ones): an array the caller holds is not written
            for name, got in (("weights", fit.weights), ("means", fit.means), ("covars", fit.covars)):
                new = getattr(self, name).copy()
                new[at] = got[good]
                setattr(self, name, new)
            r = fit.runs
            self.loglik[at], self.n_iter[at], self.converged[at] = r.loglik[good], r.iters[good], r.converged[good]
            self.n_events[at] = np.asarray(Ns)[good]
            self.loglik_trace[at] = r.trace[good]
            self.last_variant = fit.variant
            for j, e in fit.errors.items():
                errors[int(run[j])] = e
            self.loglik[run[~good]] = np.nan
        if errors:
            raise BatchMemberError(
                errors, [None if b in errors else float(self.loglik[b]) for b in range(self.B)], what
            )
        return self.loglik.copy()

    def score(self, X):
        """Per-event log-likelihood of every member.

        Parameters
        ----------
        X : array (N, D), array (B, N, D), or a sequence of B arrays (N_b, D)
            One (N, D) array: every member scores it; otherwise member ``b`` scores ``X[b]``.

        Returns
        -------
        ndarray (B, N), or a list of B arrays (N_b,) for a sequence
            In the batch's dtype.
        """
        what = "GMMBatch.score()"
        if self.means is None or self.covars is None or self.weights is None:
            raise RuntimeError("the batch has no parameters yet: call train(X) first or pass means, covars and weights")
        shared = not isinstance(X, (list, tuple)) and np.ndim(X) == 2
        if shared:
            one = check_data(X, self.D, self.dtype, 1, name="X", method="score")
            Xs, errors = [one] * self.B, {}
        else:
            Xs, errors = self._members(X, "score")
            if isinstance(Xs, DeviceStack):  # scoring reads each member's rows on the host
                Xs = np.ascontiguousarray(cuda_arrays.to_host(Xs.X), dtype=self.dtype)
        for b in np.flatnonzero(~np.isfinite(self.weights).all(axis=1)):
            errors.setdefault(int(b), RuntimeError(f"member {b} has no parameters (its first train failed)"))
        run = [b for b in range(self.B) if b not in errors]
        out = [None] * self.B
        if run:
            problems = _problems([self._proto] * len(run), [Xs[b].shape[0] for b in run])
            W, MU, CV = (a.astype(np.float64) for a in (self.weights, self.means, self.covars))
            res = BatchSpecializer(self._proto._specializer).score(
                [Xs[b] for b in run], [(W[b], MU[b], CV[b]) for b in run], problems, [self.reg_covar] * len(run)
            )
            for b, r in zip(run, res):
                if isinstance(r, BaseException):
                    errors[b] = r
                else:
                    out[b] = r
        if errors:
            raise BatchMemberError(errors, out, what)
        if isinstance(X, (list, tuple)):
            return out
        return np.stack(out)


def _device_subset(S: DeviceStack, run: np.ndarray) -> DeviceStack:
    """The members ``run`` of a device stack, gathered on the device (a new contiguous array)."""
    X = S.X
    lib = cuda_arrays._lib(X)
    if lib == "torch":
        import torch

        sub = X[torch.as_tensor(run, device=X.device)].contiguous()
    else:
        xp = importlib.import_module(lib)
        sub = xp.ascontiguousarray(X[xp.asarray(run)])
    info = cuda_arrays.describe(sub)
    return DeviceStack(sub, info["ptr"], info["shape"], S.dtype)


def _finite_members(A: np.ndarray) -> np.ndarray:
    """Per member of the C-contiguous (B, N, D) array, whether all its values are finite (chunks
    of whole members; no temporary of the whole batch)."""
    B = A.shape[0]
    flat = A.reshape(B, -1)
    if flat.size and np.isfinite(flat.min()) and np.isfinite(flat.max()):
        # the usual case in one pass each over the whole (contiguous) batch: 0.09 against 0.22 ms for
        # the members' rows one by one at gmm-gpu's (1 000, 400, 2)
        return np.ones(B, bool)
    step = max(1, _CHUNK // max(flat.shape[1], 1))
    ok = np.empty(B, bool)
    for i in range(0, B, step):  # finite minimum and maximum: every value finite (see fit.data)
        part = flat[i : i + step]
        ok[i : i + step] = np.isfinite(part.min(axis=1)) & np.isfinite(part.max(axis=1))
    return ok
