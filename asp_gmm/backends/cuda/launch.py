"""Manifest-driven launches: how a variant's kernels are described, checked and launched.

How a covariance variant plugs in
---------------------------------
A variant is a manifest ``variants/cuda/<name>.toml`` (``phase = "covariance"``) and a Jinja2
template ``variants/cuda/<template>.cu.j2`` that includes ``common.cuh.j2`` and defines ``extern "C"``
kernels, every one with the signature ``ASP_COV_ARGS``::

    (const real *xt, const real *resp, const real *means, const double *nk,
     double *acc, double *scratch, int n, int ldn)

The template is rendered with ``real``, ``D``, ``M``, ``cells``, ``cvtype``, ``dtype`` and the
variant's tunables as constants (``N`` is *not* a constant: it is the ``n`` argument), compiled with
nvcc for the present GPU and cached. The manifest describes how to launch it::

    scratch = "blocks * M * cells * 8"     # optional: bytes of the scratch buffer it needs
    [[launch]]                             # one table per kernel, run in order on one stream
    kernel = "asp_cov_v4_partial"
    grid = "blocks"                        # an expression or a list of up to 3 expressions
    block = "threads"
    shared = "0"                           # optional: dynamic shared memory bytes
    args = ["xt", "resp", "means", "acc", "n", "m"]   # optional: another argument list (ARG_TYPES)

and ``zero_acc = true`` (top level) has ``acc`` zeroed before the launches (for kernels that add to
it atomically). A variant without ``[[launch]]`` tables is not offered by this backend.

Expressions are evaluated like limits (asp_gmm.registry.evaluate) over N, D, M, cells, cvtype,
dtype, ldn, the tunables and the device quantities of :meth:`CudaBackend.limit_context`
(max_threads, smem_per_block, smem_optin: the opt-in maximum, asked for automatically when a launch's
``shared`` exceeds 48 KiB, sm_count, cc: the compute capability as 10 major + minor). After the launches, ``acc`` must hold every component's
sums (components with ``nk[c] == 0`` may hold anything finite). Limits (``[[limits]]``) exclude
problems the mapping cannot run. The E-step is selected the same way from ``phase = "estep"``
variants (signature ``(xt, means, prec, logc, resp, logp, stat, n, ldn)``; it writes ``resp``,
``logp`` and adds the log-likelihood to ``stat[0]``); :meth:`asp_gmm.selection.Policy.choose_estep` chooses
one (measured timings, else :data:`asp_gmm.selection.ESTEP_PREFERENCE`) and ``ASP_GMM_CUDA_ESTEP``
pins one.

A ``[derived]`` table names quantities computed from the others, in order (see
:meth:`asp_gmm.registry.Variant.derive`); the limits, the launch expressions and the template all see
them, so a geometry is defined once. A launch table's ``phase`` says where its kernel runs in the
EM iteration: ``"covariance"`` (the default), ``"means"`` (instead of the core's moments and means) or
``"estep"`` (instead of the E-step). A variant with an ``"estep"`` launch fuses the next M-step's sums
into its E-step (V7): its means launch must write ``nk``, ``mu64``, ``mu`` and clear the status as
``asp_means`` does, and its E-step must back the parameters up (``params`` -> ``backup``, ``pvec``
16-byte words) and write what the E-step signature above writes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ... import registry


@dataclass(frozen=True)
class Launch:
    """One kernel of a variant: name and grid/block/shared expressions (see the module docstring)."""

    kernel: str
    grid: tuple
    block: tuple
    shared: str = "0"
    args: tuple = ()  # argument names (ARG_TYPES); empty: the phase's standard signature
    #: where a covariance variant's kernel runs in the EM iteration: "covariance" (default, after the
    #: core's moments and means), "means" (instead of them) or "estep" (instead of the E-step). A
    #: variant with an "estep" launch fuses its sums into the E-step and brings its own means.
    phase: str = "covariance"

    @classmethod
    def parse(cls, table: dict) -> "Launch":
        def dims(v):
            v = v if isinstance(v, (list, tuple)) else [v]
            return tuple(str(e) for e in v)

        args = tuple(table.get("args", ()))
        unknown = [a for a in args if a not in ARG_TYPES]
        if unknown:
            raise ValueError(
                f"launch of {table['kernel']!r} names unknown arguments {unknown}; known: {sorted(ARG_TYPES)}"
            )
        phase = table.get("phase", "covariance")
        if phase not in ("covariance", "means", "estep"):
            raise ValueError(f"launch of {table['kernel']!r}: unknown phase {phase!r} (covariance, means or estep)")
        return cls(
            table["kernel"],
            dims(table.get("grid", "1")),
            dims(table.get("block", "threads")),
            str(table.get("shared", "0")),
            args,
            phase,
        )

    def signature(self, default: tuple) -> str:
        return "".join(ARG_TYPES[a] for a in (self.args or default))

    def config(self, env: dict):
        grid = tuple(int(registry.evaluate(e, env)) for e in self.grid)
        block = tuple(int(registry.evaluate(e, env)) for e in self.block)
        grid = (grid + (1, 1))[:3]
        block = (block + (1, 1))[:3]
        return grid, block, int(registry.evaluate(self.shared, env))


#: Names a launch table's ``args`` may use, with their pycuda types (P: device pointer, i: int32).
ARG_TYPES = {
    "xt": "P",
    "resp": "P",
    "means": "P",
    "nk": "P",
    "acc": "P",
    "scratch": "P",
    "prec": "P",
    "logc": "P",
    "logp": "P",
    "stat": "P",
    "n": "i",
    "ldn": "i",
    "d": "i",
    "m": "i",
    "mu64": "P",
    "w64": "P",
    "params": "P",
    "backup": "P",
    "pvec": "i",
    "bmu64": "P",
    "bprec": "P",
    "blogc": "P",
}
#: The standard argument lists (the order of ASP_COV_ARGS and of the E-step kernels).
COV_ARGS = ("xt", "resp", "means", "nk", "acc", "scratch", "n", "ldn")
ESTEP_ARGS = ("xt", "means", "prec", "logc", "resp", "logp", "stat", "n", "ldn")


def pluggable(variant: registry.Variant) -> bool:
    """Whether a variant follows this backend's convention (declares its launches)."""
    return bool(variant.extra.get("launch")) and bool(variant.template)


def launches(variant: registry.Variant) -> list:
    """The launch description of a covariance or E-step variant."""
    tables = variant.extra.get("launch", [])
    if not tables:
        raise ValueError(f"{variant.key} has no [[launch]] table in its manifest")
    return [Launch.parse(t) for t in tables]


#: Signatures of the EM core's kernels (``variants/cuda/core``), which have no launch tables.
CORE_SIGNATURES = {
    "asp_transpose": "PPii",
    "asp_upload_chunk": "PPiiiiP",
    "asp_reset": "P",
    "asp_weight_rows": "PPPPii",
    "asp_moments": "PPPiiPPi",
    "asp_means": "PiPPPPPi",
    "asp_factor": "PPPPPPPPPdii",
}


@dataclass(eq=False)
class _Module:
    """A loaded cubin: prepared functions with their launch descriptions."""

    module: object
    funcs: list  # [(Launch, function)]
    scratch: str = "0"
    tunables: dict = None
    zero_acc: bool = False  # the manifest asks for acc to be zeroed before the launches
    variant: object = None  # the registry.Variant (its [derived] quantities enter the launch expressions)

    @property
    def fused(self) -> bool:
        """Whether the variant brings its own E-step with the M-step sums fused into it."""
        return any(spec.phase == "estep" for spec, _ in self.funcs)


def plan_launches(mod: _Module, env: dict, default_args: tuple, scratch_bytes: bool = False, phase=None):
    """``(scratch bytes, [(kernel, function, grid, block, shared, argument names)])`` of a loaded
    module's launches (those of ``phase`` when given), their expressions evaluated over ``env`` (the
    problem, ``ldn`` and the device quantities) with the module's tunables and derived quantities."""
    env = dict(env)
    env.update(mod.tunables)
    if mod.variant is not None:
        mod.variant.derive(env)
    nbytes = int(registry.evaluate(mod.scratch, env)) if scratch_bytes else 0
    confs = [
        (spec.kernel, fn) + spec.config(env) + (spec.args or default_args,)
        for spec, fn in mod.funcs
        if phase is None or spec.phase == phase
    ]
    return nbytes, confs
