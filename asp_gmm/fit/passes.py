"""The one pass-based EM loop (:func:`em`): an M-step from the statistics of a pass, then the
statistics of the new parameters, until :func:`asp_gmm.reference.converged` says stop; with the
progress bar and the INFO line per pass. It runs every fit whose data is a chunk source, larger than
the device budget, or weighted.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from .. import config
from .. import reference as ref
from ..errors import NonFiniteError, NonFiniteInputError, SettingError, StreamError
from ..problem import Problem, as_cvtype, per_component
from .result import TrainResult
from .sources import ArraySource, ChunkSource, as_source, as_weights, blocks, weighted_blocks
from .stats import SuffStats, reduced_mstep

log = logging.getLogger("asp_gmm")


def _setting(name: str) -> str:
    return getattr(config.settings(), name)


# ------------------------------------------------------------------------------ progress
class _Progress:
    """A tqdm bar per pass (events/s, pass, log-likelihood) and an INFO line per pass."""

    def __init__(self, enabled, n_rows):
        self.bar = None
        if enabled is None:
            mode = _setting("progress").lower() or "auto"
            if mode not in ("auto", "0", "1"):
                raise SettingError(f"ASP_GMM_PROGRESS={mode!r} must be auto, 1 or 0")
            enabled = mode == "1" or (
                mode == "auto"
                and sys.stderr is not None
                and sys.stderr.isatty()
                and (n_rows is None or n_rows >= 10_000_000)
            )
        self.enabled = enabled
        if enabled:
            try:
                import tqdm  # noqa: F401
            except ImportError:
                log.info("asp_gmm: install tqdm for a progress bar (pip install asp_gmm[stream])")
                self.enabled = False

    def start(self, k, n_rows):
        self.t0 = time.perf_counter()
        if self.enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=n_rows, desc=f"EM pass {k}", unit="ev", unit_scale=True, leave=False)

    def advance(self, rows):
        if self.bar is not None:
            self.bar.update(rows)

    def end(self, k, st, iters):
        sec = time.perf_counter() - self.t0
        rate = st.n / sec if sec > 0 else float("inf")
        if self.bar is not None:
            self.bar.set_postfix(loglik=f"{st.loglik / st.n:.6g}/ev")
            self.bar.close()
            self.bar = None
        log.info(
            "asp_gmm: streamed pass %d (after %d iterations): %d events in %.3f s (%.3g events/s), "
            "log-likelihood %.10g (%.6g per event)",
            k,
            iters,
            st.n,
            sec,
            rate,
            st.loglik,
            st.loglik / st.n,
        )
        return sec


# ------------------------------------------------------------------------------ EM
@dataclass
class StreamPlan:
    """What a streamed fit runs: the block problem, the covariance configuration and why."""

    problem: Problem
    config: object
    kernel: object
    reason: str


def plan(spec, problem: Problem, variant: str | None = None, weighted: bool = False) -> StreamPlan:
    """Choose the covariance configuration for ``problem``'s blocks through ``spec``'s selection (on
    the block's problem shape), falling back past configurations that fail to compile. ``weighted``:
    on a backend whose kernels take sample weights, among the variants that declare they can."""
    from .. import selection

    rows = spec.backend.stream_block_rows(problem)
    if problem.N:
        rows = min(rows, problem.N)
    bp = Problem(int(rows), problem.D, problem.M, problem.cvtype, problem.dtype)
    cands = spec.candidates(bp, variant)
    if weighted and variant is None and getattr(spec.backend, "weights_in_kernels", False):
        cands = [c for c in cands if c.variant.takes_weights] or cands  # (none: the default runner folds them)
    p = spec.policy.choose(spec.backend, bp, cands, pinned=variant is not None, tuning=False)
    order = [p.primary] + [c for c in selection.rule_order(spec.backend, cands, bp.kernel_cvtype) if c != p.primary]
    for cfg in order:
        kernel = spec._kernel(cfg, bp, spec.policy, reraise=variant is not None)
        if kernel is not None:
            return StreamPlan(bp, cfg, kernel, p.reason)
    from ..errors import KernelError

    raise KernelError("every candidate variant failed to compile; see the warnings above")


def _open_runner(spec, sp: StreamPlan, sample_weight, resident: bool = False):
    """The backend's statistics runner for the plan's blocks (the weighted one with weights;
    ``resident``: see :func:`_resident`)."""
    if sample_weight is None:
        return spec.backend.open_stats(sp.problem, sp.kernel)
    return spec.backend.open_weighted_stats(sp.problem, sp.kernel, resident=resident)


def _resident(spec, source: ChunkSource, problem: Problem) -> bool:
    """Whether the rows of a weighted fit may stay on the device between passes: they are an
    in-memory NumPy array (not a memmap, not a callable: the same rows every pass, unchanged during
    the fit) and a session of all of them plus a copy of the rows and their weights fits the device
    budget (:func:`asp_gmm.fit.sources.device_budget`; small data: without asking the device)."""
    from . import sources

    X = getattr(source, "X", None) if isinstance(source, ArraySource) else None
    if not isinstance(X, np.ndarray) or isinstance(X, np.memmap):
        return False
    p = dataclasses.replace(problem, N=source.n_rows)
    need = spec.backend.session_bytes(p) + p.N * (p.D * p.np_dtype.itemsize + 8)
    if need <= sources._NEVER_STREAM_BYTES and sources._bytes_setting("ASP_GMM_DEVICE_BUDGET", None) is None:
        return True
    budget = sources.device_budget(spec.backend)
    return budget is None or need <= budget


def pass_stats(
    runner,
    source: ChunkSource,
    problem: Problem,
    weights,
    means,
    covars,
    reg_covar,
    expect_rows=None,
    progress=None,
    sample_weight=None,
) -> SuffStats:
    """One pass over ``source``: the statistics of every block under the given parameters
    (``sample_weight``: a :class:`~asp_gmm.fit.sources.WeightSource` aligned with the rows, folded
    into the posteriors; ``expect_rows``: the rows every pass must yield)."""
    runner.set_params(weights, means, covars, reg_covar)
    st = SuffStats(problem.M, problem.D, problem.cvtype, means)
    on_device = getattr(runner, "checks_finite", False)  # NaN/inf found by the runner (the GPU)
    cut = dict(check_finite=not on_device, pieces=on_device and isinstance(source, ArraySource))
    starts, counts = [], []
    if sample_weight is None:

        def rows():
            for start, blk in blocks(source, problem.D, problem.np_dtype, runner.problem.N, expect_rows, **cut):
                starts.append(start)
                yield blk

        results = runner.stats_many(rows())
    else:

        def pairs():
            for start, blk, w in weighted_blocks(
                source, sample_weight, problem.D, problem.np_dtype, runner.problem.N, expect_rows, **cut
            ):
                starts.append(start)
                counts.append(w.shape[0])
                yield blk, w

        many = getattr(runner, "stats_weighted_many", None)  # (pipelined on the GPU)
        results = many(pairs()) if many is not None else (runner.stats_weighted(b, w) for b, w in pairs())
    try:
        for k, bs in enumerate(results):
            rows_k = counts[k] if sample_weight is not None else bs.n
            st.add_block(bs, rows_k)
            if progress is not None:
                progress.advance(rows_k)
    except NonFiniteInputError as exc:
        row = starts[exc.block] + exc.row if getattr(exc, "block", None) is not None else exc.row
        what = f"values beyond the {exc.beyond} range" if exc.beyond else "NaN or infinity"
        raise StreamError(
            f"X has {what} at row {row}, column {exc.column}; remove or impute those events"
            + (" or use dtype=np.float64" if exc.beyond else "")
        ) from None
    if sample_weight is not None and not st.n > 0:
        raise ValueError("sample_weight sums to zero: at least one event needs a positive weight")
    if not math.isfinite(st.loglik):
        raise NonFiniteError(
            f"the log-likelihood is not finite ({st.loglik}): increase reg_covar, use fewer components, "
            "or scale the data"
        )
    return st


def em(
    spec,
    source,
    weights,
    means,
    covars,
    problem: Problem,
    reg_covar: float,
    min_iters: int,
    max_iters: int,
    tol: float,
    variant: str | None = None,
    progress: bool | None = None,
    sample_weight=None,
) -> TrainResult:
    """Pass-based EM through ``spec`` (a :class:`~asp_gmm.specializer.Specializer`): the same
    iterations as the in-memory loop (an M-step, then the statistics of the new parameters), one
    pass over the source per iteration plus the first, stopped by :func:`asp_gmm.reference.converged`
    on the change of the log-likelihood per event (per unit of weight with ``sample_weight``).
    "tied" and "spherical" pass the per-component statistics of the "full" and "diag" problem and
    reduce each M-step to their type (:func:`asp_gmm.fit.stats.reduced_mstep`).

    Parameters
    ----------
    source : chunk source or array (N, D)
    weights, means, covars : ndarray (M,), (M, D), and (M, D, D), (D, D), (M, D) or (M,)
        Starting parameters (covariances of ``problem.cvtype``).
    sample_weight : WeightSource or array (N,), optional
        Sample weights aligned with the rows (:func:`asp_gmm.fit.sources.as_weights`).
    """
    t_start = time.perf_counter()
    source = as_source(source)
    sample_weight = as_weights(sample_weight, source.n_rows)
    cvtype = problem.cvtype
    problem = dataclasses.replace(problem, cvtype=problem.kernel_cvtype)
    covars = per_component(covars, cvtype, problem.M, problem.D)
    sp = plan(spec, problem, variant, weighted=sample_weight is not None)
    bar = _Progress(progress, problem.N or source.n_rows)
    resident = sample_weight is not None and _resident(spec, source, problem)
    runner = _open_runner(spec, sp, sample_weight, resident)
    w = np.array(weights, np.float64)
    mu = np.array(means, np.float64)
    cv = np.array(covars, np.float64)
    try:
        bar.start(0, source.n_rows)
        st = pass_stats(runner, source, problem, w, mu, cv, reg_covar, None, bar, sample_weight)
        bar.end(0, st, 0)
        rows, total = st.rows, st.n
        ll = st.loglik
        trace, iters, converged = [ll], 0, False
        while iters < max_iters:
            w, mu, cv = reduced_mstep(st, mu, cv, reg_covar, cvtype)
            cv = per_component(cv, cvtype, problem.M, problem.D)
            bar.start(iters + 1, rows)
            st = pass_stats(runner, source, problem, w, mu, cv, reg_covar, rows, bar, sample_weight)
            iters += 1
            bar.end(iters, st, iters)
            change, ll = ref.change_per_event(st.loglik, ll, total), st.loglik
            trace.append(ll)
            if ref.converged(iters, min_iters, change, tol):
                converged = True
                break
    finally:
        runner.close()
    return TrainResult(
        w,
        mu,
        as_cvtype(cv, cvtype),
        ll,
        iters,
        converged,
        sp.config.label + (" (streamed)" if sample_weight is None else " (weighted passes)"),
        [],
        sp.reason,
        time.perf_counter() - t_start,
        trace,
        n_events=rows,
        weight_sum=0.0 if sample_weight is None else float(total),
    )


def source_stats(
    spec,
    source,
    problem: Problem,
    weights,
    means,
    covars,
    reg_covar: float,
    variant: str | None = None,
    sample_weight=None,
) -> SuffStats:
    """One pass of :func:`pass_stats` over ``source`` through ``spec``'s selected kernels (the online
    EM of ``GaussianMixture.partial_fit``): the statistics of every row under the given parameters."""
    source = as_source(source)
    sample_weight = as_weights(sample_weight, source.n_rows)
    sp = plan(spec, problem, variant, weighted=sample_weight is not None)
    runner = _open_runner(spec, sp, sample_weight)
    try:
        return pass_stats(runner, source, problem, weights, means, covars, reg_covar, sample_weight=sample_weight)
    finally:
        runner.close()
