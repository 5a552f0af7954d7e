"""Measuring variants outside ``train``: what ``asp-gmm tune`` and ``benchmarks/selection.py`` run.

For one problem (exact N, D, M, cvtype, dtype) on random mixture data, every configuration runs
``repeats`` single EM iterations from the same initial parameters through the backend
(``session.em(kernel, min_iters=1, max_iters=1, tol=0.0, reg_covar=reg)``), timed by the backend's own timer; the median is the
configuration's seconds per EM iteration. It is backend-agnostic: only
``backend.covariance_variants``, ``backend.kernel`` and ``backend.open(...).em`` are used.

A configuration that fails to compile is ``compile-failed``, one that fails at run time
``launch-failed``; one whose parameters after the first iteration disagree with most of the others
(every variant computes the same function) is ``invalid``, so a wrong kernel is never selected.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field

import numpy as np

from .errors import CompileError, KernelError
from .problem import Problem
from .selection import Config

#: Relative tolerance of the agreement check, by working precision (scaled by each array's size).
AGREE_RTOL = {"float32": 2e-2, "float64": 1e-6}


@dataclass
class Measurement:
    config: Config
    status: str  # ok, compile-failed, launch-failed, invalid
    seconds: float | None = None  # median seconds per EM iteration
    cov_seconds: float | None = None
    repeats: int = 0
    samples: list = field(default_factory=list)
    error: str = ""

    @property
    def label(self) -> str:
        """The variant's name, with its tunables only when they are not the defaults."""
        return short_label(self.config)


def short_label(config: Config) -> str:
    return config.variant.name if config == Config.of(config.variant) else config.label


def parse_grid(text: str) -> list:
    """``"10000,100000"`` or ``"1e4,1e5"`` -> ``[10000, 100000]``."""
    out = []
    for part in str(text).split(","):
        part = part.strip().replace("_", "")
        if part:
            v = float(part)
            if v != int(v) or v < 1:
                raise ValueError(f"grid values must be positive integers, got {part!r}")
            out.append(int(v))
    if not out:
        raise ValueError("empty grid")
    return out


def configs_for(backend, problem: Problem, tunables: bool = False, variants=None) -> list:
    """Configurations to measure: each allowed variant with the tunables it runs unless told otherwise
    (``backend.tunables_for``: the defaults where its limits allow them), or (``tunables``)
    every combination its limits allow; ``variants`` restricts the names."""
    out = []
    ctx = backend.limit_context()
    for v in backend.covariance_variants():
        if variants and v.name not in variants:
            continue
        first = backend.tunables_for(v, problem)  # None: the variant cannot run the problem
        if first is None:
            continue
        if tunables and v.tunables:
            for t in v.tunable_space():
                if v.allows(problem, t, extra=ctx):
                    out.append(Config.of(v, t))
        else:
            out.append(Config.of(v, first))
    return out


def problem_data(problem: Problem, seed: int = 0, reg_covar: float = 1e-3):
    """Random mixture data of the exact size and initial parameters (float64)."""
    rng = np.random.default_rng(seed)
    N, D, M = problem.N, problem.D, problem.M
    centres = rng.normal(0.0, 3.0, (M, D))
    X = centres[rng.integers(0, M, N)] + rng.standard_normal((N, D))
    X = np.ascontiguousarray(X, dtype=problem.np_dtype)
    means = X[(np.arange(M) * N) // M].astype(np.float64)
    cov = np.atleast_2d(np.cov(X.astype(np.float64), rowvar=False, bias=True)) + reg_covar * np.eye(D)
    covars = {
        "full": lambda: np.repeat(cov[None], M, 0),
        "tied": lambda: cov,
        "diag": lambda: np.repeat(np.diag(cov)[None], M, 0),
        "spherical": lambda: np.full(M, np.trace(cov) / D),
    }[problem.cvtype]()
    return X, (np.full(M, 1.0 / M), means, covars)


def measure(
    backend,
    problem: Problem,
    configs: list,
    repeats: int = 5,
    seed: int = 0,
    reg_covar: float = 1e-3,
    max_seconds: float | None = None,
    min_repeats: int = 1,
    record=None,
    on_config=None,
    data=None,
) -> list:
    """Measure ``configs`` on ``problem``; return a :class:`Measurement` per configuration.

    The configurations take turns (one iteration each per round, ``repeats`` rounds), each
    iteration starting from the same initial parameters, so that a change of load on the machine
    falls on all of them alike. ``max_seconds`` caps the time spent per configuration (after
    ``min_repeats`` iterations); ``record(problem, config, status, seconds, cov_seconds, repeats)``
    receives every result; ``on_config(config)`` is called once per configuration (progress).
    """
    X, params = data or problem_data(problem, seed, reg_covar)
    out = [Measurement(cfg, "ok") for cfg in configs]
    after, kernels, covs = {}, {}, {}
    session = backend.open(X, problem)
    try:
        for m in out:
            try:
                kernels[m.config] = backend.kernel(m.config.variant, m.config.params, problem)
            except CompileError as exc:
                m.status, m.error = "compile-failed", str(exc).splitlines()[0]
                if on_config:
                    on_config(m.config)
        live = [m for m in out if m.status == "ok"]
        rounds = max(int(repeats), 1)
        for r in range(rounds):
            for m in list(live):
                session.set_params(*params, reg_covar)
                try:
                    run = session.em(kernels[m.config], min_iters=1, max_iters=1, tol=0.0, reg_covar=reg_covar)
                except KernelError as exc:
                    m.status, m.error = "launch-failed", str(exc)
                    live.remove(m)
                    if on_config:
                        on_config(m.config)
                    continue
                m.samples.append(run.iter_seconds[0])
                covs.setdefault(m.config, []).append(run.cov_seconds[0])
                if r == 0:
                    after[m.config] = session.params()
                done = r == rounds - 1 or (
                    max_seconds is not None and len(m.samples) >= min_repeats and sum(m.samples) >= max_seconds
                )
                if done:
                    live.remove(m)
                    if on_config:
                        on_config(m.config)
        for m in out:
            if m.status == "ok":
                m.seconds, m.cov_seconds = statistics.median(m.samples), statistics.median(covs[m.config])
                m.repeats = len(m.samples)
    finally:
        session.close()
    _check_agreement(out, after, problem)
    if record is not None:
        for m in out:
            record(problem, m.config, m.status, m.seconds, m.cov_seconds, max(m.repeats, 1))
    return out


def _check_agreement(out, after, problem):
    """Mark ``invalid`` the configurations whose first-iteration parameters disagree with most."""
    ok = [m for m in out if m.status == "ok" and m.config in after]
    if len(ok) < 3:
        return
    rtol = AGREE_RTOL[problem.dtype]

    def close(a, b):
        return all(np.allclose(x, y, rtol=rtol, atol=rtol * max(float(np.max(np.abs(y))), 1e-30)) for x, y in zip(a, b))

    for m in ok:
        agree = sum(close(after[m.config], after[o.config]) for o in ok if o is not m)
        if agree < (len(ok) - 1) / 2:
            m.status, m.error = "invalid", "its parameters after one iteration disagree with the other variants'"


def best(ms: list):
    """The fastest ``ok`` measurement, or ``None``."""
    ok = [m for m in ms if m.status == "ok"]
    return min(ok, key=lambda m: m.seconds) if ok else None


def seconds_of(ms: list, name: str):
    """Seconds of variant ``name`` with its default tunables (the first ok one of that name)."""
    for m in ms:
        if m.status == "ok" and m.config.variant.name == name and m.config == Config.of(m.config.variant):
            return m.seconds
    return None


def grid(Ns, Ds, Ms, cvtype="full", dtype="float32") -> list:
    return [Problem(N, D, M, cvtype, dtype) for N, D, M in itertools.product(Ns, Ds, Ms)]


def ms_text(seconds: float) -> str:
    """Milliseconds per EM iteration as the table and the heat map write them."""
    return f"{1e3 * seconds:.3f}"


def gain_text(ms: list, baseline: str = "V1") -> str:
    """The winner's speed-up over always running ``baseline``, as the table and the heat map show it
    ("2.31x"), or "-" when either is missing."""
    w, base = best(ms), seconds_of(ms, baseline)
    return f"{base / w.seconds:.2f}x" if w and base else "-"


def table(results: dict, baseline: str = "V1") -> str:
    """Text table: seconds per EM iteration (ms) of every configuration, the winner and its gain."""
    labels = []
    for ms in results.values():
        for m in ms:
            if m.label not in labels:
                labels.append(m.label)
    head = ["N", "D", "M"] + labels + ["winner", f"speed-up vs {baseline}"]
    rows = []
    for p, ms in results.items():
        by = {m.label: m for m in ms}
        cells = [str(p.N), str(p.D), str(p.M)]
        for lab in labels:
            m = by.get(lab)
            cells.append("-" if m is None else (ms_text(m.seconds) if m.status == "ok" else m.status))
        w = best(ms)
        cells.append(w.label if w else "none")
        cells.append(gain_text(ms, baseline))
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.rjust(w) for c, w in zip(r, widths))  # noqa: E731
    return (
        "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])
        + "\n(milliseconds per EM iteration; the winner's speed-up over always using "
        + baseline
        + ")"
    )


def heatmap(results: dict, path, baseline: str = "V1", title: str = "") -> None:
    """PNG: per (D, M) the winning variant (colour), its speed-up over ``baseline`` as the table
    writes it (:func:`gain_text`) and its milliseconds per EM iteration (text), one panel per N."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    Ns = sorted({p.N for p in results})
    Ds = sorted({p.D for p in results})
    Ms = sorted({p.M for p in results})
    # a colour per measured variant (stable across panels and runs of the same variants)
    names = sorted({m.config.variant.name for ms in results.values() for m in ms})
    colours = plt.get_cmap("tab10").colors
    cmap = ListedColormap([colours[i % 10] for i in range(max(len(names), 1))])
    fig, axes = plt.subplots(
        1, len(Ns), figsize=(1.0 + 0.9 * len(Ms) * len(Ns) + 1.5, 1.2 + 0.55 * len(Ds)), squeeze=False
    )
    for ax, N in zip(axes[0], Ns):
        img = np.full((len(Ds), len(Ms)), np.nan)
        for (i, D), (j, M) in itertools.product(enumerate(Ds), enumerate(Ms)):
            ms = results.get(next((p for p in results if (p.N, p.D, p.M) == (N, D, M)), None))
            w = best(ms) if ms else None
            if w is None:
                continue
            img[i, j] = names.index(w.config.variant.name)
            gain = gain_text(ms, baseline)
            ax.text(
                j,
                i,
                f"{w.config.variant.name}\n{gain if gain != '-' else ''}\n{ms_text(w.seconds)} ms",
                ha="center",
                va="center",
                fontsize=7,
            )
        ax.imshow(img, cmap=cmap, vmin=-0.5, vmax=len(names) - 0.5, aspect="auto", origin="lower")
        ax.set_xticks(range(len(Ms)), [str(m) for m in Ms])
        ax.set_yticks(range(len(Ds)), [str(d) for d in Ds])
        ax.set_xlabel("M")
        ax.set_ylabel("D")
        ax.set_title(f"N = {N:,}")
    won = sorted({best(ms).config.variant.name for ms in results.values() if best(ms)})
    fig.legend(handles=[Patch(color=cmap(names.index(n)), label=n) for n in won], loc="center right", title="winner")
    fig.suptitle(title or f"winning variant, its speed-up over always {baseline}, its ms per EM iteration", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 1.2 / fig.get_figwidth(), 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
