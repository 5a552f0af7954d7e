"""Many small models in one call: ``train_many``, ``score_many`` and ``compute_distance_BIC_many``.

The batched Face: each member is validated and seeded exactly as :meth:`asp_gmm.GMM.train` does
it, then all members run in one batched call of the backend (:mod:`asp_gmm.batch_driver`):

    from asp_gmm import GMM, train_many
    models = [GMM(8, 19, cvtype="diag") for _ in range(32)]
    logliks = train_many(models, datasets, min_em_iters=5, max_em_iters=5)

The results equal training each model alone (the same EM iterations; float64 to about 1e-10,
float32 to its usual tolerance). A bad member (NaN in its data, fewer events than components, a
covariance that is not positive definite) does not stop the others: they are trained, and then
:class:`asp_gmm.errors.BatchMemberError` is raised naming every bad member (``.errors``) and
carrying the others' results (``.results``).
"""

from __future__ import annotations

import numbers

import numpy as np

from . import cuda_arrays, streaming
from .batch_driver import BatchSpecializer
from .errors import BatchMemberError, NonFiniteError
from .fit.data import Data
from .gmm import GMM, check_data, merged_model

__all__ = ["Concat", "Rows", "train_many", "score_many", "compute_distance_BIC_many", "prepare_many"]


class Concat:
    """The rows of several arrays, in order, as one member's data set of :func:`train_many` or
    :func:`compute_distance_BIC_many` (e.g. the frames of two clusters for their merged model).

    Where the backend can, no concatenated copy is made on the host: the CUDA backend uploads each
    distinct array once per call (an array in several members' Concats is uploaded once) and
    assembles every member's rows on the device; the other backends concatenate. The result is that
    of the concatenated array. Each distinct array is checked once per call.

    Parameters
    ----------
    *parts : array (N_i, D)
        One or more arrays of the model's D.
    """

    __slots__ = ("parts",)

    def __init__(self, *parts):
        if not parts:
            raise ValueError("Concat() needs at least one array")
        self.parts = tuple(parts)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    @property
    def shape(self) -> tuple:
        """``(sum of the parts' N, D)`` (D of the first part)."""
        return (len(self), np.shape(self.parts[0])[1] if np.ndim(self.parts[0]) == 2 else 0)

    def concatenate(self) -> np.ndarray:
        """One array of all the rows (the first part itself when there is one)."""
        return self.parts[0] if len(self.parts) == 1 else np.concatenate(self.parts)

    def __repr__(self) -> str:
        return f"Concat({', '.join(f'<{np.shape(p)}>' for p in self.parts)})"


def _check_iters(min_em_iters, max_em_iters, tol, what: str):
    for name, val in (("min_em_iters", min_em_iters), ("max_em_iters", max_em_iters)):
        if not isinstance(val, numbers.Integral) or val < 0:
            raise ValueError(f"{what}: {name} must be an integer >= 0, got {val!r}")
    if min_em_iters > max(max_em_iters, 1):
        raise ValueError(
            f"{what}: min_em_iters={min_em_iters} is larger than max_em_iters={max_em_iters}; "
            "pass min_em_iters <= max_em_iters"
        )
    if not (isinstance(tol, numbers.Real) and tol >= 0):
        raise ValueError(f"{what}: tol must be a number >= 0, got {tol!r}")


def _check_models(models, what: str) -> list:
    models = list(models)
    if not models:
        return models
    g0 = models[0]
    for b, g in enumerate(models):
        if not isinstance(g, GMM):
            raise TypeError(f"{what}: member {b} is a {type(g).__name__}, not an asp_gmm.GMM")
        if (g.D, g.cvtype, g.dtype, g.backend) != (g0.D, g0.cvtype, g0.dtype, g0.backend):
            raise ValueError(
                f"{what}: member {b} is {g!r} but member 0 is {g0!r}; the models of one call share D, cvtype, "
                "dtype and backend (call once per kind)"
            )
    return models


def _host(X, g: GMM, b: int, method: str, min_events: int, device_checks: bool = False):
    """Member ``b``'s data checked like ``GMM.train``/``score`` does, its messages naming the member
    (``device_checks``: no host pass for NaN/inf, see :func:`_recheck`)."""
    if streaming.is_source(X) and not isinstance(X, np.ndarray):
        raise ValueError(
            f"datasets[{b}] is a chunk source; a batched call takes in-memory arrays (train it alone with GMM.train)"
        )
    if cuda_arrays.is_cuda_array(X):
        X = cuda_arrays.to_host(X)
    return check_data(X, g.D, g.dtype, min_events, name=f"datasets[{b}]", method=method, device_checks=device_checks)


class Rows:
    """Rows of an immutable array (:func:`asp_gmm.freeze`), as one member's data set of
    :func:`train_many` or :func:`compute_distance_BIC_many` (e.g. a cluster's frames of a recording).

    The array is checked for NaN and infinity once (it cannot change), so its rows need no check;
    the CUDA backend keeps the array on the GPU and gathers each member's rows there (no host
    gather, no upload per call); the other backends take ``X[index]``. The result is that of
    ``X[index]``.

    Parameters
    ----------
    X : array (N, D)
        An immutable array: the result of :func:`asp_gmm.freeze`.
    index : array of int (n,)
        Row numbers, each in ``0 .. N - 1`` (repeats allowed), in the order the member sees them.

    Raises
    ------
    ValueError
        X is not immutable (freeze it), or not 2-D; ``index`` is not 1-D integers within range.
    """

    __slots__ = ("X", "index")

    def __init__(self, X, index):
        from .frozen import identity

        if not isinstance(X, np.ndarray) or identity(X) is None:
            raise ValueError("Rows(X, index) needs an immutable X; pass asp_gmm.freeze(X)")
        if X.ndim != 2:
            raise ValueError(f"Rows(X, index): X must be 2-D (N events, D dimensions), got shape {X.shape}")
        idx = np.asarray(index)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise ValueError("Rows(X, index): index must be a 1-D array of integer row numbers")
        idx = idx.astype(np.intp, copy=False)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= X.shape[0]):
            raise ValueError(
                f"Rows(X, index): row numbers must be in 0 .. {X.shape[0] - 1}, got {int(idx.min())} .. {int(idx.max())}"
            )
        self.X, self.index = X, idx

    def __len__(self) -> int:
        return len(self.index)

    @property
    def shape(self) -> tuple:
        return (len(self.index), self.X.shape[1])

    def take(self) -> np.ndarray:
        """``X[index]``: the rows as one (writeable) array."""
        return self.X[self.index]

    def __repr__(self) -> str:
        return f"Rows(<{self.X.shape}>, {len(self.index)} rows)"


def _rows(X: Rows, g: GMM, b: int, seen: dict):
    """Member ``b``'s Rows with its array checked (once per call; an immutable array once ever); a
    copy of the rows when the array had to be converted (another dtype) and so is not the one
    frozen."""
    got = seen.get(id(X.X))
    if got is None or got[0] is not X.X:
        got = seen[id(X.X)] = (X.X, _host(X.X, g, b, "train", 1))
    return X if got[1] is X.X else got[1][X.index]


def _problems(models: list, Ns: list) -> list:
    """Each member's Problem; members of equal (N, M) share one (the models of a call share D,
    cvtype and dtype): a batch of 1 000 small models spent 10 ms building identical Problems."""
    if models and models.count(models[0]) == len(models) and Ns.count(Ns[0]) == len(Ns):
        return [models[0]._problem(Ns[0])] * len(models)  # one model, one N (a GMMBatch): one Problem
    made: dict = {}
    out = []
    for g, n in zip(models, Ns):
        p = made.get((n, g.M))
        if p is None:
            p = made[(n, g.M)] = g._problem(n)
        out.append(p)
    return out


def _concat(X: Concat, g: GMM, b: int, seen: dict) -> Concat:
    """Member ``b``'s Concat with every part checked (each distinct array once per call)."""
    parts = []
    for j, part in enumerate(X.parts):
        got = seen.get(id(part))
        if got is None or got[0] is not part:
            try:
                got = seen[id(part)] = (part, _host(part, g, b, "train", 1))
            except ValueError as exc:
                raise ValueError(f"{exc} (part {j} of its Concat)") from None
        parts.append(got[1])
    return Concat(*parts)


def _member(
    X,
    g: GMM,
    b: int,
    seen: dict,
    method: str = "train",
    need: int | None = None,
    checked: bool = False,
    device_checks: bool = False,
):
    """Member ``b``'s data checked as ``GMM.train`` checks its X (a :class:`Concat`'s parts and a
    :class:`Rows`' array once per call through ``seen``; ``checked``: a plain array already
    checked; ``device_checks``: a plain array's NaN/inf left to the batch, see :func:`_recheck`),
    with at least ``need`` (default M) events; messages name the member."""
    need = g.M if need is None else need
    if isinstance(X, Concat):
        X = _concat(X, g, b, seen)
    elif isinstance(X, Rows):
        X = _rows(X, g, b, seen)
    elif not checked:
        X = _host(X, g, b, method, need, device_checks)
    if X.shape[0] < need:
        raise ValueError(
            f"datasets[{b}] has N={X.shape[0]} events, fewer than the M={g.M} components; "
            "use fewer components or more data"
        )
    return X


def _on_host(X) -> np.ndarray:
    """A checked member's rows as one host array (a Concat's parts joined, a Rows' rows taken)."""
    return X.concatenate() if isinstance(X, Concat) else X.take() if isinstance(X, Rows) else X


def _members(datasets, models):
    """``(list of the members' data, checked)``: a 3-D float array (B, N, D) of the models' dtype
    and D, all finite, is checked in one pass here (``checked``: its rows need only the N >= M
    test); anything else is checked member by member, as ``GMM.train`` checks its X."""
    if isinstance(datasets, np.ndarray) and datasets.ndim == 3 and models:
        g = models[0]
        if datasets.dtype == g.dtype and datasets.shape[2] == g.D:
            X = np.ascontiguousarray(datasets)
            if np.isfinite(X).all():
                return [X[b] for b in range(X.shape[0])], True
        return [datasets[b] for b in range(datasets.shape[0])], False
    return list(datasets), False


def _defer_finite_check(X, g: GMM, checked: bool) -> bool:
    """Whether member data X is left unscanned for NaN/inf on the host: a plain array of a model
    whose backend checks on the device (CUDA, parameters given: no seeding reads X first). A bad
    value then makes the member's first log-likelihood non-finite, and :func:`_recheck` names it."""
    return not checked and isinstance(X, np.ndarray) and g._device_checks(True)


def _recheck(given, g: GMM, b: int, exc: BaseException) -> BaseException:
    """A member that failed non-finite after its data went unscanned: the host's message when the
    data holds NaN/inf (or values beyond the dtype), else ``exc``. Scans only failed members."""
    if not isinstance(exc, NonFiniteError):
        return exc
    try:
        check_data(given, g.D, g.dtype, 1, name=f"datasets[{b}]", method="train")
    except ValueError as bad:
        return bad
    return exc


def _raise_if(errors: dict, results: list, what: str):
    if errors:
        raise BatchMemberError(errors, results, what)


def train_many(
    models,
    datasets,
    min_em_iters: int = 1,
    max_em_iters: int = 10,
    tol: float = 1e-3,
    variant: str | None = None,
) -> list:
    """Train every model on its own data, all in one batched call.

    Parameters
    ----------
    models : sequence of GMM
        Models of one D, cvtype, dtype and backend; M may differ. Each is seeded (first call) or
        warm-started exactly as :meth:`GMM.train` would do it.
    datasets : sequence of array (N_b, D), :class:`Concat` or :class:`Rows`, or one array (B, N, D)
        ``datasets[b]`` trains ``models[b]``; each its own N_b (at least M_b events). One 3-D
        array (members of equal N) is checked in one pass; a :class:`Concat` member is the rows
        of its parts (each distinct part checked once per call); a :class:`Rows` member is rows of
        an immutable array (checked once; on the GPU gathered where the array is kept).
    min_em_iters, max_em_iters, tol
        As in :meth:`GMM.train`, for every member.
    variant : str, optional
        Pin a batched variant of the backend (e.g. ``"CBE"``, see ``asp-gmm info``); by default the
        selection chooses.

    Returns
    -------
    list of float
        Per member, the total log-likelihood of its data under its trained parameters; every model's
        attributes (``means``, ``loglik``, ``n_iter``, ``last_train`` ...) are set as ``train`` sets them.

    Raises
    ------
    BatchMemberError
        Some members failed (bad data, too few events, not positive definite); the others were
        trained. Its ``errors`` maps each failed member to its exception.
    """
    what = "train_many()"
    _check_iters(min_em_iters, max_em_iters, tol, what)
    models = _check_models(models, what)
    datasets, checked = _members(datasets, models)
    if len(datasets) != len(models):
        raise ValueError(f"{what}: {len(models)} models but {len(datasets)} datasets; pass one data set per model")
    if not models:
        return []
    errors, ok, Xs = {}, [], []
    unscanned: dict = {}  # member -> its data as given, where NaN/inf is left to the device
    seen: dict = {}  # id(part) -> (part, checked part): an array in several members is checked once
    for b, (g, X) in enumerate(zip(models, datasets)):
        try:
            defer = _defer_finite_check(X, g, checked)
            if defer:
                unscanned[b] = X
            X = _member(X, g, b, seen, checked=checked, device_checks=defer)
            if g.means is None or g.covars is None or g.weights is None:  # seeded from the rows themselves
                g._seed(Data("host", _on_host(X), X.shape[0]))
        except (ValueError, TypeError) as exc:
            errors[b] = exc
            continue
        ok.append(b)
        Xs.append(X)
    spec = BatchSpecializer(models[0]._specializer)
    res = spec.train(
        Xs,
        [models[b]._params64() for b in ok],
        _problems([models[b] for b in ok], [X.shape[0] for X in Xs]),
        [models[b].reg_covar for b in ok],
        int(min_em_iters),
        int(max_em_iters),
        float(tol),
        variant,
    )
    out = [None] * len(models)
    for b, X, r in zip(ok, Xs, res):
        if isinstance(r, BaseException):
            errors[b] = _recheck(unscanned[b], models[b], b, r) if b in unscanned else r
            continue
        g = models[b]
        g.weights = r.weights.astype(g.dtype)
        g.means = r.means.astype(g.dtype)
        g.covars = r.covars.astype(g.dtype)
        g.loglik, g.n_events = r.loglik, X.shape[0]
        g.n_iter, g.converged, g.last_variant = r.iters, r.converged, r.variant
        g.last_train = r
        out[b] = r.loglik
    _raise_if(errors, out, what)
    return out


def score_many(models, datasets) -> list:
    """Per-event log-likelihood of every model on its data (or of every model on one data set), in
    one batched call.

    Parameters
    ----------
    models : sequence of GMM
        Trained models of one D, cvtype, dtype and backend.
    datasets : array (N, D), or a sequence of arrays (N_b, D)
        One array: every model scores it (e.g. the frames of a recording under every speaker's
        model); a sequence: ``datasets[b]`` is scored by ``models[b]``.

    Returns
    -------
    list of ndarray (N_b,)
        As :meth:`GMM.score` returns for each model.
    """
    what = "score_many()"
    models = _check_models(models, what)
    if not models:
        return []
    if isinstance(datasets, (list, tuple)):
        if len(datasets) != len(models):
            raise ValueError(f"{what}: {len(models)} models but {len(datasets)} datasets; pass one per model")
        Xs = list(datasets)
    else:
        Xs = None
    errors, ok, data = {}, [], []
    shared = None
    for b, g in enumerate(models):
        try:
            if Xs is None:
                if shared is None:
                    shared = _host(datasets, g, 0, "score", 1)
                X = shared
            else:
                X = _host(Xs[b], g, b, "score", 1)
            params = g._params64("score")
        except (ValueError, TypeError, RuntimeError) as exc:
            if Xs is None and shared is None:
                raise
            errors[b] = exc
            continue
        ok.append(b)
        data.append((X, params))
    spec = BatchSpecializer(models[0]._specializer)
    res = spec.score(
        [X for X, _ in data],
        [p for _, p in data],
        _problems([models[b] for b in ok], [X.shape[0] for X, _ in data]),
        [models[b].reg_covar for b in ok],
    )
    out = [None] * len(models)
    for b, r in zip(ok, res):
        if isinstance(r, BaseException):
            errors[b] = r
        else:
            out[b] = r
    _raise_if(errors, out, what)
    return out


def compute_distance_BIC_many(
    pairs,
    datasets,
    min_em_iters: int = 1,
    max_em_iters: int = 10,
    tol: float = 1e-3,
) -> list:
    """:func:`asp_gmm.compute_distance_BIC` for many pairs, the merged models trained in one batch.

    Parameters
    ----------
    pairs : sequence of (GMM, GMM)
        Trained models; each pair's L(gmm_i) and event counts are those of their last ``train``
        (as ``compute_distance_BIC`` without X1, X2).
    datasets : sequence of array (N_b, D), :class:`Concat` or :class:`Rows`
        Each pair's merged data (normally the union of both clusters' frames: ``Concat(X1, X2)``
        makes no concatenated copy where the backend can avoid it; ``Rows(Xf, index)`` of a frozen
        recording, none at all on the GPU).
    min_em_iters, max_em_iters, tol
        As in :meth:`GMM.train` for the merged models.

    Returns
    -------
    list of (GMM, float)
        Per pair, the merged model and ``L(merged on X) - L(gmm1) - L(gmm2)``, as
        ``compute_distance_BIC`` returns them.
    """
    what = "compute_distance_BIC_many()"
    pairs = [tuple(p) for p in pairs]
    datasets = list(datasets)
    if len(pairs) != len(datasets):
        raise ValueError(f"{what}: {len(pairs)} pairs but {len(datasets)} datasets; pass one data set per pair")
    merged, errors, idx = [], {}, []
    for b, pair in enumerate(pairs):
        if len(pair) != 2:
            raise ValueError(f"{what}: pair {b} has {len(pair)} models; pass (gmm1, gmm2)")
        g1, g2 = pair
        try:
            merged.append(_merged(g1, g2, b))
            idx.append(b)
        except (ValueError, TypeError) as exc:
            errors[b] = exc
    out = [None] * len(pairs)
    try:
        lls = train_many(merged, [datasets[b] for b in idx], min_em_iters, max_em_iters, tol)
    except BatchMemberError as exc:
        lls = exc.results
        for j, e in exc.errors.items():
            errors[idx[j]] = e
    for j, b in enumerate(idx):
        if lls[j] is None:
            continue
        g1, g2 = pairs[b]
        out[b] = (merged[j], lls[j] - g1.loglik - g2.loglik)
    _raise_if(errors, out, what)
    return out


def prepare_many(D: int, M, cvtype: str = "full", dtype=np.float32, backend: str = "auto", N: int = 10_000) -> int:
    """Compile, or load from the cache, what batched calls of models of these shapes run, and open
    the tuning history: :func:`asp_gmm.prepare` for :func:`train_many`, :func:`score_many` and
    :func:`compute_distance_BIC_many` (before a timed section).

    Parameters
    ----------
    D : int
    M : int or iterable of int
        The largest component count of a batch (each value: one batch class).
    cvtype, dtype, backend
        As for :class:`GMM`.
    N : int
        Events of a typical batch (all members together).

    Returns
    -------
    int
        Batched configurations ready.
    """
    Ms = [M] if isinstance(M, numbers.Integral) else list(M)
    for name, val in [("D", D), ("N", N)] + [("M", m) for m in Ms]:
        if not isinstance(val, numbers.Integral) or isinstance(val, bool) or val <= 0:
            raise ValueError(f"prepare_many(): {name} must be a positive integer, got {val!r}")
    g = GMM(1, int(D), cvtype=cvtype, dtype=dtype, backend=backend)
    from .problem import BatchProblem

    return BatchSpecializer(g._specializer).prepare(
        [BatchProblem(int(N), int(D), int(m), cvtype, g.dtype.name, B=2) for m in Ms]
    )


def _merged(gmm1: GMM, gmm2: GMM, b: int) -> GMM:
    """The merged model of compute_distance_BIC (M1 + M2 components, weights by data share)."""
    if not isinstance(gmm1, GMM) or not isinstance(gmm2, GMM):
        raise TypeError(f"pair {b}: both models must be asp_gmm.GMM")
    if gmm1.D != gmm2.D or gmm1.cvtype != gmm2.cvtype:
        raise ValueError(f"pair {b}: the two models must have the same D and cvtype to be merged")
    for name, g in (("gmm1", gmm1), ("gmm2", gmm2)):
        if g.loglik is None:
            raise ValueError(f"pair {b}: {name} has not been trained; train it first")
    return merged_model(gmm1, gmm2, gmm1.n_events, gmm2.n_events)
