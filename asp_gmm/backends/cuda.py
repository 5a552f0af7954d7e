"""CUDA backend through pycuda: the whole EM loop on the GPU, covariance by the selected variant.

Device data layout (one session = one data set; ``real`` is float or double, the problem's dtype;
``ldn`` = N rounded up to a multiple of 256; columns ``n >= N`` are zero in ``xt`` and ``resp``)::

    xt     real   [D][ldn]    events transposed (uploaded once, transposed on the device)
    resp   real   [M][ldn]    posteriors of the last E-step, resp[c*ldn + n]
    logp   real   [ldn]       per-event log-likelihood of the last E-step
    nk     double [M]         raw counts sum_n resp[c][n] of the running M-step
    means  real   [M][D]      means of the running M-step (covariances are centred on them)
    acc    double [M][cells]  covariance sums written by the covariance variant:
                              full: packed lower triangle, cell p = i*(i+1)/2 + j (j <= i);
                              diag: cell p = i.   acc[c][p] = sum_n resp[c][n] (x_i - mu_ci)(x_j - mu_cj)
    prec   real   [M][cells]  upper Cholesky factor U of each precision (inv(cov) = U U^T), packed by
                              columns: U[i][j] (i <= j) at j*(j+1)/2 + i; diag: 1/sigma_i
    logc   real   [M]         log w_c - D/2 log(2 pi) + log det U_c
    stat   double [2]         stat[0]: log-likelihood sum of the E-step; int at stat+1: first bad
                              component of the last factorisation (INT_MAX when none)
    params (w64, mu64, cov64 [M][D][D] or [M][D], logdet) in double, backed up before each M-step.

One EM iteration (five launches on one stream, one 16-byte read back):
``moments -> means -> covariance variant -> factor -> E-step``, then the host reads
``stat`` (the log-likelihood scalar and the bad-component word). A failed factorisation restores the
parameters of the previous iteration (device-to-device copy) and raises
:class:`~asp_gmm.errors.NotPositiveDefiniteError`.

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
``logp`` and adds the log-likelihood to ``stat[0]``); :attr:`CudaBackend.estep_preference` orders them
and ``ASP_GMM_CUDA_ESTEP`` pins one.

A ``[derived]`` table names quantities computed from the others, in order (see
:meth:`asp_gmm.registry.Variant.derive`); the limits, the launch expressions and the template all see
them, so a geometry is defined once. A launch table's ``phase`` says where its kernel runs in the
EM iteration: ``"covariance"`` (the default), ``"means"`` (instead of the core's moments and means) or
``"estep"`` (instead of the E-step). A variant with an ``"estep"`` launch fuses the next M-step's sums
into its E-step (V7): its means launch must write ``nk``, ``mu64``, ``mu`` and clear the status as
``asp_means`` does, and its E-step must back the parameters up (``params`` -> ``backup``, ``pvec``
16-byte words) and write what the E-step signature above writes.

Binaries are compiled per (D, M) class. A problem of less than :data:`PAD_BELOW_WORK` multiply-adds
per iteration runs on the binary of its *component class* (:func:`component_class`: M itself up to 8,
then steps of at most 1/4: 10, 12, 14, 16, 20, 24, ...): the extra components are padding with weight
exactly 0, so their posteriors are exactly 0 and the live components' results are unchanged. An
application that trains many small models of ever-new M (the diarization example) then loads a
handful of binaries instead of compiling one per M; the padding costs at most a quarter more work
where that work is small.

Data: an immutable array (:func:`asp_gmm.freeze`; :func:`asp_gmm.frozen.identity` says which arrays
are) stays on the GPU after its first session (LRU, :data:`RESIDENT_BYTES` at most) and is shared by
every later session on it, whatever the model's M: score a data set under many models without
uploading it again. Every other array is uploaded on every session: its contents may change between
calls, a merely read-only one too (its owner can make it writeable again). Session buffers are
pooled by (D, M, cvtype, dtype) and a capacity in events, so calls on data of varying N reuse them.

pycuda is imported lazily and CUDA initialised on first use (never at ``import asp_gmm``). Errors
from the driver are raised as :class:`~asp_gmm.errors.KernelError` naming the kernel and its grid and
block; ``ASP_GMM_CUDA_SYNC=1`` synchronises after every launch to pin asynchronous faults on the
launch that caused them.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import math
import os
import shutil
import threading
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .. import cache, cuda_arrays, frozen, registry
from ..errors import BackendUnavailableError, KernelError, NotPositiveDefiniteError
from ..problem import Problem
from .base import Backend, EMRun, Kernel, Session, block_rows_for

#: Covariance condition limits (squared pivot ratio) by working precision (as the C backend).
COND_LIMIT = {"float32": 1e10, "float64": 1e15}
NVCC_FLAGS = ["--cubin", "-O3", "--use_fast_math", "-std=c++17"]
LDN_ALIGN = 256
_INT_MAX = 2**31 - 1
#: limit context used when no GPU is present (compile-only checks): an H100
_DEFAULT_LIMITS = {"max_threads": 1024, "smem_per_block": 49152, "smem_optin": 232448, "sm_count": 132, "cc": 90}
#: Problems under this many multiply-adds per EM iteration (Problem.work) run on the binary of their
#: component class. An iteration of that size takes a few milliseconds on a current GPU, so the at
#: most 25 % of padding costs less over hundreds of iterations than the compile of an exact binary
#: (seconds for each of the core, E-step and covariance modules) that a new M would need.
PAD_BELOW_WORK = 1e11
#: Device bytes that read-only data sets may keep resident between sessions.
RESIDENT_BYTES = 2 << 30
#: Idle session buffers kept for reuse, at most this many and this many bytes (the least recently
#: released are freed first): an application alternating between a few dozen shapes keeps them all.
POOL_IDLE = 32
POOL_IDLE_BYTES = 1 << 30


def component_class(M: int) -> int:
    """The component count a binary for M components is compiled with when padding is allowed: M up
    to 8, then the next multiple of 2**(ceil(log2 M) - 3) (10, 12, 14, 16, 20, 24, 28, 32, 40, ...),
    so that at most a quarter of the components are padding."""
    if M <= 8:
        return M
    step = (1 << (M - 1).bit_length()) // 8
    return -(-M // step) * step


def binary_problem(problem: Problem) -> Problem:
    """The problem whose binaries run ``problem``: itself, or with M raised to its component class
    when the problem is small (see :data:`PAD_BELOW_WORK`)."""
    if problem.work >= PAD_BELOW_WORK:
        return problem
    m = component_class(problem.M)
    return problem if m == problem.M else Problem(problem.N, problem.D, m, problem.cvtype, problem.dtype)


def _capacity(n: int) -> int:
    """Events a new session buffer holds for n: n rounded up to LDN_ALIGN and to 16 steps per
    octave, so a buffer serves every later call up to 1/16 larger."""
    n = max(int(n), 1)
    step = max(LDN_ALIGN, (1 << (n.bit_length() - 1)) // 16)
    return -(-n // step) * step


# ---------------------------------------------------------------------------------------- pycuda
def _driver():
    """pycuda.driver, imported on first use; raises BackendUnavailableError if missing."""
    try:
        import pycuda.driver as drv
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise BackendUnavailableError(f"pycuda is not installed ({exc}); pip install pycuda") from None
    return drv


def nvcc_command() -> list:
    """The nvcc command: ``$ASP_GMM_NVCC``, else nvcc on PATH, else the toolkit's default place."""
    env = os.environ.get("ASP_GMM_NVCC")
    if env:
        return env.split()
    found = shutil.which("nvcc")
    if found:
        return [found]
    for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if os.path.exists(p):
            return [p]
    return ["nvcc"]


# ---------------------------------------------------------------------------------------- rendering
def _class_problem(problem: Problem) -> Problem:
    """Sources depend on D, M, cvtype and dtype; N is a run-time argument (rendered as 0)."""
    return Problem(0, problem.D, problem.M, problem.cvtype, problem.dtype)


def render_source(variant: registry.Variant, tunables: dict | None, problem: Problem) -> str:
    """The CUDA source of ``variant`` for ``problem``'s class (no pycuda, no GPU needed)."""
    real = "float" if problem.dtype == "float32" else "double"
    src = registry.render(variant, tunables, _class_problem(problem), real=real,
                          cond_limit=COND_LIMIT[problem.dtype])
    # the launch description is part of what a binary means: keep it in the cached source
    launches = variant.extra.get("launch", [])
    return src + f"\n/* asp_gmm launch: {launches!r} scratch: {variant.extra.get('scratch', '')!r} */\n"


def compile_cubin(source: str, arch: str, name: str):
    """Path of the cubin compiled from ``source`` for ``arch`` (e.g. "sm_90"), from the cache."""
    cmd = nvcc_command()
    key = [cache.tool_version(cmd), " ".join(NVCC_FLAGS), arch]
    return cache.build(source, ".cubin", lambda src, out: cmd + NVCC_FLAGS + [f"-arch={arch}", "-o", out, src],
                       key, name, source_suffix=".cu")


def compile_variant(variant, tunables, problem: Problem, arch: str = "sm_90"):
    """Render and compile one variant (compile-only checks; no GPU needed)."""
    tun = variant.default_tunables()
    tun.update(tunables or {})
    src = render_source(variant, tun, problem)
    return compile_cubin(src, arch, _binary_name(variant, tun, problem))


def _binary_name(variant, tun, problem) -> str:
    label = Kernel(variant, tun).label
    return f"cuda-{label}-D{problem.D}-M{problem.M}-{problem.cvtype}-{problem.dtype}"


# ---------------------------------------------------------------------------------------- launches
@dataclass(frozen=True)
class Launch:
    """One kernel of a variant: name and grid/block/shared expressions (see the module docstring)."""

    kernel: str
    grid: tuple
    block: tuple
    shared: str = "0"
    args: tuple = ()        # argument names (ARG_TYPES); empty: the phase's standard signature
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
            raise ValueError(f"launch of {table['kernel']!r} names unknown arguments {unknown}; "
                             f"known: {sorted(ARG_TYPES)}")
        phase = table.get("phase", "covariance")
        if phase not in ("covariance", "means", "estep"):
            raise ValueError(f"launch of {table['kernel']!r}: unknown phase {phase!r} "
                             "(covariance, means or estep)")
        return cls(table["kernel"], dims(table.get("grid", "1")), dims(table.get("block", "threads")),
                   str(table.get("shared", "0")), args, phase)

    def signature(self, default: tuple) -> str:
        return "".join(ARG_TYPES[a] for a in (self.args or default))

    def config(self, env: dict):
        grid = tuple(int(registry.evaluate(e, env)) for e in self.grid)
        block = tuple(int(registry.evaluate(e, env)) for e in self.block)
        grid = (grid + (1, 1))[:3]
        block = (block + (1, 1))[:3]
        return grid, block, int(registry.evaluate(self.shared, env))


#: Names a launch table's ``args`` may use, with their pycuda types (P: device pointer, i: int32).
ARG_TYPES = {"xt": "P", "resp": "P", "means": "P", "nk": "P", "acc": "P", "scratch": "P",
             "prec": "P", "logc": "P", "logp": "P", "stat": "P", "n": "i", "ldn": "i", "d": "i", "m": "i",
             "mu64": "P", "w64": "P", "params": "P", "backup": "P", "pvec": "i",
             "bmu64": "P", "bprec": "P", "blogc": "P"}
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


def estep_variants(problem: Problem, ctx: dict | None = None) -> list:
    """Every pluggable E-step variant that can run ``problem``, each with the first tunables its
    limits allow: ``[(variant, tunables)]``."""
    ctx = dict(_DEFAULT_LIMITS) if ctx is None else ctx
    out = []
    for v in registry.variants("cuda", "estep"):
        if pluggable(v):
            tun = v.first_allowed(problem, extra=ctx)
            if tun is not None:
                out.append((v, tun))
    return out


def pick_estep(problem: Problem, ctx: dict | None = None, preference=None):
    """(variant, tunables) of the E-step for ``problem``: ``$ASP_GMM_CUDA_ESTEP`` if set, else the first
    pluggable E-step variant in ``preference`` order whose limits allow the problem, with the first
    combination of its tunables they allow. Needs no GPU."""
    ctx = dict(_DEFAULT_LIMITS) if ctx is None else ctx
    preference = CudaBackend.estep_preference if preference is None else preference
    pinned = os.environ.get("ASP_GMM_CUDA_ESTEP")
    vs = [v for v in registry.variants("cuda", "estep") if pluggable(v)]
    if pinned:
        vs = [registry.get("cuda", pinned, "estep")]
    else:
        rank = {n: i for i, n in enumerate(preference)}
        vs = sorted(vs, key=lambda v: rank.get(v.name, len(rank)))
    for v in vs:
        for tun in v.tunable_space():
            if v.allows(problem, tun, extra=ctx):
                return v, tun
    raise KernelError(f"no CUDA E-step variant can run {problem}")


@dataclass(eq=False)
class _Module:
    """A loaded cubin: prepared functions with their launch descriptions."""

    module: object
    funcs: list            # [(Launch, function)]
    scratch: str = "0"
    tunables: dict = None
    zero_acc: bool = False  # the manifest asks for acc to be zeroed before the launches
    variant: object = None  # the registry.Variant (its [derived] quantities enter the launch expressions)

    @property
    def fused(self) -> bool:
        """Whether the variant brings its own E-step with the M-step sums fused into it."""
        return any(spec.phase == "estep" for spec, _ in self.funcs)


# ---------------------------------------------------------------------------------------- device
class _Device:
    """The GPU and its primary context, pushed around each piece of work (thread-safe)."""

    def __init__(self, ordinal: int):
        drv = _driver()
        drv.init()
        self.drv = drv
        self.dev = drv.Device(ordinal)
        self.ctx = self.dev.retain_primary_context()
        a = drv.device_attribute
        self.attrs = {
            "max_threads": self.dev.get_attribute(a.MAX_THREADS_PER_BLOCK),
            "smem_per_block": self.dev.get_attribute(a.MAX_SHARED_MEMORY_PER_BLOCK),
            "sm_count": self.dev.get_attribute(a.MULTIPROCESSOR_COUNT),
        }
        optin = getattr(a, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", None)
        self.attrs["smem_optin"] = self.dev.get_attribute(optin) if optin is not None else self.attrs["smem_per_block"]
        cc = self.dev.compute_capability()
        self.attrs["cc"] = 10 * cc[0] + cc[1]   # compute capability, e.g. 90 (limits: tensor-core variants)
        self.arch = f"sm_{cc[0]}{cc[1]}"
        self.name = self.dev.name()
        self.memory = self.dev.total_memory()

    @contextlib.contextmanager
    def active(self):
        self.ctx.push()
        try:
            yield
        finally:
            self.drv.Context.pop()


@lru_cache(maxsize=1)
def _probe() -> str | None:
    try:
        drv = _driver()
    except BackendUnavailableError as exc:
        return str(exc)
    try:
        drv.init()
        count = drv.Device.count()
    except Exception as exc:  # noqa: BLE001 - pycuda raises its own error types
        return f"the CUDA driver could not be initialised ({exc}); is an NVIDIA GPU and driver present?"
    if count == 0:
        return "no CUDA GPU is present"
    nv = nvcc_command()
    if shutil.which(nv[0]) is None and not os.path.exists(nv[0]):
        return "nvcc (the CUDA compiler) was not found; install the CUDA toolkit or set ASP_GMM_NVCC"
    return None


class CudaBackend(Backend):
    """NVIDIA GPU through pycuda; kernels rendered from ``variants/cuda`` and compiled with nvcc."""

    name = "cuda"
    shape_specific_binaries = True
    #: rule order when nothing has been measured (V4 fills the GPU for any M; V3 only for M >= SMs)
    preference = ["V5", "V4", "V3", "V2", "V1"]
    #: E-step variants in order of preference (the first one whose limits allow the problem)
    estep_preference = ["estep_fast", "estep_tc", "estep"]

    def __init__(self, ordinal: int | None = None):
        reason = self.unavailable_reason()
        if reason:
            raise BackendUnavailableError(reason)
        self._ordinal = int(os.environ.get("ASP_GMM_CUDA_DEVICE", "0")) if ordinal is None else ordinal
        self._device = None
        self._lock = threading.RLock()
        self._modules: dict = {}
        self._kernels: dict = {}
        self._pool: list = []           # idle _Buffers, least recently released first
        self._resident = collections.OrderedDict()   # read-only data sets on the device (LRU)
        self._estep_pick: dict = {}     # E-step (variant, tunables) by problem shape
        self._ready: set = set()        # is_ready keys found in the compile cache
        atexit.register(self._free_pool)

    def _free_pool(self):
        """Free the idle device buffers (at exit, while the context still exists)."""
        with self._lock:
            while self._pool:
                with contextlib.suppress(Exception):
                    self._pool.pop().free()
            if self._resident and self._device is not None:
                with contextlib.suppress(Exception), self._device.active():
                    while self._resident:
                        self._resident.popitem()[1][1].free()

    @classmethod
    def unavailable_reason(cls):
        return _probe()

    @property
    def device(self) -> _Device:
        if self._device is None:
            with self._lock:
                if self._device is None:
                    self._device = _Device(self._ordinal)
        return self._device

    def fingerprint(self) -> dict:
        d = self.device
        return {"backend": "cuda", "model": d.name, "arch": d.arch, "sm_count": d.attrs["sm_count"],
                "memory": d.memory, "driver": d.drv.get_driver_version(),
                "compiler": cache.tool_version(nvcc_command())}

    def covariance_variants(self, problem: Problem | None = None) -> list:
        """Covariance variants that follow the plug-in convention and whose limits allow ``problem``
        (as it runs: padded to its component class when small)."""
        return [v for v in super().covariance_variants(problem) if pluggable(v)]

    def tunables_for(self, variant, problem: Problem) -> dict | None:
        return super().tunables_for(variant, binary_problem(problem))

    def limit_context(self) -> dict:
        if self._device is None and _probe() is not None:
            return dict(_DEFAULT_LIMITS)
        return dict(self.device.attrs)

    # ------------------------------------------------------------------ compiling
    def _load(self, variant, tunables, problem: Problem, prepare: dict) -> _Module:
        """Compile (through the cache) and load ``variant``; ``prepare`` maps kernel name to its
        pycuda argument signature."""
        tun = variant.default_tunables()
        tun.update(tunables or {})
        key = (variant.key, variant.source_sha256, tuple(sorted(tun.items())), problem.D, problem.M,
               problem.cvtype, problem.dtype)
        mod = self._modules.get(key)
        if mod is not None:
            return mod
        with self._lock:
            mod = self._modules.get(key)
            if mod is None:
                dev = self.device
                src = render_source(variant, tun, problem)
                path = compile_cubin(src, dev.arch, _binary_name(variant, tun, problem))
                with dev.active():
                    try:
                        m = dev.drv.module_from_file(str(path))
                    except dev.drv.Error:
                        cache.invalidate(path)
                        path = compile_cubin(src, dev.arch, _binary_name(variant, tun, problem))
                        m = dev.drv.module_from_file(str(path))
                    funcs = []
                    if variant.phase == "core":
                        specs = [Launch(k, ("1",), ("1",)) for k in prepare]
                    else:
                        specs = launches(variant)
                    for spec in specs:
                        fn = m.get_function(spec.kernel)
                        if variant.phase == "core":
                            fn.prepare(prepare[spec.kernel])
                        else:
                            fn.prepare(spec.signature(prepare["*"]))
                        funcs.append((spec, fn))
                mod = _Module(m, funcs, str(variant.extra.get("scratch", "0")), tun,
                              bool(variant.extra.get("zero_acc", False)), variant)
                mod.path = str(path)
                self._modules[key] = mod
        return mod

    def core(self, problem: Problem) -> _Module:
        v = registry.get("cuda", "core", "core")
        mod = self._load(v, None, problem, _CORE_SIGNATURES)
        if getattr(mod, "mom_threads", None) is None:
            # the moments kernel's block size is chosen by its template (exported, never re-derived)
            dev = self.device
            with dev.active():
                ptr, _ = mod.module.get_global("asp_moments_geometry")
                geo = np.zeros(2, np.int32)
                dev.drv.memcpy_dtoh(geo, ptr)
            mod.mom_threads = int(geo[0])
            mod.mom_grid_y = max(1, int(geo[1]))
        return mod

    def selection_key(self, problem: Problem) -> Problem:
        """As the base class, after padding: the variants that run ``problem`` are those of its
        binary problem (component class)."""
        return super().selection_key(binary_problem(problem))

    def estep_variant(self, problem: Problem):
        """(variant, tunables) of the E-step for ``problem`` (memoised by shape when no E-step
        limit names N)."""
        problem = binary_problem(problem)
        key = problem
        if not registry.limits_name_n("cuda", "estep"):
            key = dataclasses.replace(problem, N=0)
        hit = self._estep_pick.get(key)
        if hit is None:
            if len(self._estep_pick) > 4096:
                self._estep_pick.clear()
            hit = self._estep_pick[key] = pick_estep(problem, self.limit_context(), self.estep_preference)
        return hit

    def estep(self, problem: Problem, variant=None, tunables=None) -> _Module:
        """The loaded E-step module for ``problem`` (the preferred one unless ``variant`` is given)."""
        if variant is None:
            variant, tunables = self.estep_variant(problem)
        return self._load(variant, tunables, problem, {"*": ESTEP_ARGS})

    def prepare(self, problem: Problem) -> None:
        bp = binary_problem(problem)
        self.core(bp)
        self.estep(bp)

    def is_ready(self, variant, tunables, problem: Problem) -> bool:
        """True when this variant, the EM core and the E-step for the problem's class are loaded or
        their cubins are cached (sources depend on D and M here, so a new M class means compiling)."""
        problem = binary_problem(problem)
        tun = variant.default_tunables()
        tun.update(tunables or {})
        key = (variant.key, variant.source_sha256, tuple(sorted(tun.items())), problem.D, problem.M,
               problem.cvtype, problem.dtype)
        if key in self._modules or key in self._ready:
            return True
        arch = self.device.arch
        cmd = nvcc_command()
        keyparts = [cache.tool_version(cmd), " ".join(NVCC_FLAGS), arch]
        ev, et = self.estep_variant(problem)
        for v, t in ((variant, tun), (registry.get("cuda", "core", "core"), None), (ev, et)):
            t2 = v.default_tunables()
            t2.update(t or {})
            src = render_source(v, t2, problem)
            if cache.lookup(src, ".cubin", keyparts, _binary_name(v, t2, problem), source_suffix=".cu") is None:
                return False
        self._ready.add(key)    # in the disk cache: stays so (entries are only ever added or rebuilt)
        return True

    def kernel(self, variant, tunables, problem: Problem) -> Kernel:
        tun = variant.default_tunables()
        tun.update(tunables or {})
        if not pluggable(variant):
            raise KernelError(f"{variant.key} declares no [[launch]] table; see 'How a covariance variant "
                              "plugs in' in asp_gmm/backends/cuda.py")
        mod = self._load(variant, tun, binary_problem(problem), {"*": COV_ARGS})
        return Kernel(variant, tun, handle=mod, binary=mod.path)

    # ------------------------------------------------------------------ buffers
    def _acquire(self, problem: Problem, exact: bool = False) -> "_Buffers":
        """Idle buffers of the problem's (D, M, cvtype, dtype) holding N events (the smallest that
        is at most twice the need; with ``exact``, of capacity _capacity(N) exactly, the leading
        dimension of resident data), else new ones of capacity _capacity(N)."""
        key = (problem.D, problem.M, problem.cvtype, problem.dtype)
        cap = _capacity(problem.N)
        hi = cap if exact else 2 * cap
        with self._lock:
            fits = [b for b in self._pool if b.key == key and problem.N <= b.capacity <= hi]
            if fits:
                buf = min(fits, key=lambda b: b.capacity)
                self._pool.remove(buf)
                return buf
        return _Buffers(self, Problem(cap, problem.D, problem.M, problem.cvtype, problem.dtype))

    def _release(self, buf: "_Buffers"):
        with self._lock:
            self._pool.append(buf)
            while len(self._pool) > POOL_IDLE or sum(b.nbytes for b in self._pool) > POOL_IDLE_BYTES:
                self._pool.pop(0).free()

    def _resident_xt(self, X: np.ndarray, problem: Problem, core_fn):
        """Device pointer and leading dimension of the immutable X's resident copy (uploaded and
        transposed now if it is not resident), or None when X may change (anything but an immutable
        array, see :mod:`asp_gmm.frozen`: the copy is keyed by X's identity, never re-read)."""
        ident = frozen.identity(X)
        if ident is None:
            return None
        key = ident[1]
        with self._lock:
            hit = self._resident.get(key)
            if hit is not None and hit[0]() is X:
                self._resident.move_to_end(key)
                return hit[1], hit[2]
            dev = self.device
            with dev.active():
                if hit is not None:      # another array now lives at that address
                    self._resident.pop(key)[1].free()
                ldn = _capacity(problem.N)    # the leading dimension of the buffers it runs with
                nbytes = max(problem.D * ldn * problem.np_dtype.itemsize, 16)
                if nbytes > RESIDENT_BYTES:
                    return None
                while self._resident and sum(v[3] for v in self._resident.values()) + nbytes > RESIDENT_BYTES:
                    self._resident.popitem(last=False)[1][1].free()
                xt = dev.drv.mem_alloc(nbytes)
                try:
                    _upload_transposed(dev, X, xt, problem.N, problem.D, ldn, core_fn)
                except BaseException:
                    xt.free()
                    raise
                self._resident[key] = (ident[0], xt, ldn, nbytes)
            return xt, ldn

    def open(self, X, problem: Problem) -> "CudaSession":
        return CudaSession(self, X, problem)

    def open_stats(self, problem: Problem, kernel: Kernel | None = None):
        """Streamed EM: two streams, pinned buffers, the session's kernels per block (cuda_stream.py)."""
        from .cuda_stream import CudaStatsRunner
        return CudaStatsRunner(self, problem, kernel)

    def stream_block_rows(self, problem: Problem) -> int:
        """Blocks of 1 GiB of data and posteriors (``ASP_GMM_BLOCK_BYTES`` overrides): large enough
        that the launches of a block are a small part of it."""
        return block_rows_for(problem, default_bytes=1 << 30)


_CORE_SIGNATURES = {
    "asp_transpose": "PPii",
    "asp_reset": "P",
    "asp_moments": "PPPiiPPi",
    "asp_means": "PiPPPPPi",
    "asp_factor": "PPPPPPPPPdii",
}


class _Buffers:
    """Device memory for sessions of one (D, M, cvtype, dtype) on up to ``problem.N`` events (the
    capacity), reused across sessions. ``xt`` is allocated on the first upload of writeable data
    (sessions on resident read-only data use the resident copy)."""

    def __init__(self, backend: CudaBackend, problem: Problem):
        dev = backend.device
        drv = dev.drv
        self.problem = problem
        self.capacity = problem.N
        self.key = (problem.D, problem.M, problem.cvtype, problem.dtype)
        self.last_n = None     # events of the last session: resp beyond them is stale otherwise
        N, D, M = problem.N, problem.D, problem.M
        rs = problem.np_dtype.itemsize
        full = problem.cvtype == "full"
        self.ldn = ldn = -(-max(N, 1) // LDN_ALIGN) * LDN_ALIGN
        cells = problem.cells
        covcells = D * D if full else D
        self.off = off = {}
        n64 = 0
        for name, size in (("w64", M), ("mu64", M * D), ("cov64", M * covcells), ("logdet", M)):
            off[name] = 8 * n64
            n64 += size
        rbase = -(-8 * n64 // 16) * 16
        nr = 0
        for name, size in (("mu", M * D), ("prec", M * cells), ("logc", M)):
            off[name] = rbase + rs * nr
            nr += size
        self.param_bytes = rbase + rs * nr
        self.param_vec = -(-self.param_bytes // 16)   # 16-byte words copied by asp_moments to the backup
        self.sizes = {"w64": M, "mu64": M * D, "cov64": M * covcells, "mu": M * D}
        core = registry.get("cuda", "core", "core")
        self.mom_blocks = int(core.default_tunables()["mom_blocks"])
        with dev.active():
            try:
                alloc = drv.mem_alloc
                self.xt = None
                self.xt_bytes = max(D * ldn * rs, 16)
                self.nbytes = (self.xt_bytes + (M + 1) * ldn * rs + 32 * self.param_vec + 8 * M
                               + 8 * self.mom_blocks * M * (D + 1) + 8 * M * cells)
                self.resp = alloc(max(M * ldn * rs, 16))
                self.logp = alloc(ldn * rs)
                self.params = alloc(16 * self.param_vec)
                self.backup = alloc(16 * self.param_vec)
                self.nk = alloc(8 * M)
                self.part = alloc(8 * self.mom_blocks * M * (D + 1))
                self.acc = alloc(8 * M * cells)
                self.work = alloc(8 * (M * D * D + M * D)) if full and (D * D + D) * 8 > 40960 else None
                self.stat = alloc(16)
                self.stat_host = drv.pagelocked_zeros(2, np.float64)
                drv.memset_d8(self.resp, 0, M * ldn * rs)
                drv.memset_d8(self.logp, 0, ldn * rs)
                drv.memset_d8(self.params, 0, self.param_bytes)
                drv.memset_d8(self.acc, 0, 8 * M * cells)
                self.stream = drv.Stream()
                self.events = [drv.Event() for _ in range(4)]
            except drv.Error as exc:
                raise MemoryError(f"could not allocate GPU memory for N={N}, D={D}, M={M}: {exc}") from None
        self.scratch = None
        self.scratch_bytes = 0
        self._dev = dev

    def own_xt(self):
        """This buffer set's own event array (for writeable data), allocated on first use."""
        if self.xt is None:
            with self._dev.active():
                self.xt = self._dev.drv.mem_alloc(self.xt_bytes)
        return self.xt

    def ptr(self, name: str) -> int:
        return int(self.params) + self.off[name]

    def ensure_scratch(self, nbytes: int):
        if nbytes > self.scratch_bytes:
            with self._dev.active():
                if self.scratch is not None:
                    self.scratch.free()
                self.scratch = self._dev.drv.mem_alloc(max(nbytes, 16))
            self.scratch_bytes = nbytes
        return self.scratch

    def free(self):
        with self._dev.active():
            for name in ("xt", "resp", "logp", "params", "backup", "nk", "part", "acc", "work", "stat",
                         "scratch"):
                a = getattr(self, name, None)
                if a is not None:
                    a.free()
                    setattr(self, name, None)


def _upload_transposed(dev, X: np.ndarray, dst, N: int, D: int, ldn: int, transpose_fn):
    """Copy X (N, D) to the device and transpose it there into dst [D][ldn] (padding zeroed)."""
    drv = dev.drv
    with dev.active():
        tmp = drv.mem_alloc(max(X.nbytes, 16))
        try:
            drv.memcpy_htod(tmp, X)
            total = D * ldn
            try:
                transpose_fn.prepared_call((-(-total // 256), 1), (256, 1, 1), int(tmp), int(dst),
                                           np.int32(N), np.int32(ldn))
                drv.Context.synchronize()
            except drv.Error as exc:
                raise KernelError(f"CUDA kernel asp_transpose (grid=({-(-total // 256)}, 1), block=256) "
                                  f"failed: {exc}") from None
        finally:
            tmp.free()


def _transpose_on_device(dev, X, dst, N: int, D: int, ldn: int, transpose_fn):
    """Transpose the C-contiguous CUDA array X (N, D) (PyTorch, CuPy: ``__cuda_array_interface__``)
    into dst [D][ldn] on the device, without a copy through the host."""
    info = cuda_arrays.describe(X)
    if info["shape"] != (N, D) or not info["contiguous"]:
        raise KernelError(f"the CUDA array has shape {info['shape']} (contiguous: {info['contiguous']}), not a "
                          f"C-contiguous ({N}, {D})")
    drv = dev.drv
    with dev.active():
        total = D * ldn
        try:
            drv.Context.synchronize()     # the producer's pending writes to X
            transpose_fn.prepared_call((-(-total // 256), 1), (256, 1, 1), info["ptr"], int(dst),
                                       np.int32(N), np.int32(ldn))
            drv.Context.synchronize()
        except drv.Error as exc:
            raise KernelError(f"CUDA kernel asp_transpose on a device array (grid=({-(-total // 256)}, 1), block=256) "
                              f"failed: {exc}") from None


class CudaSession(Session):
    """One data set on the GPU; the EM loop issued from here, kernels on one stream."""

    def __init__(self, backend: CudaBackend, X: np.ndarray, problem: Problem):
        #: the live components; ``self.problem`` is what the binaries run (M padded when small)
        self.m_live = problem.M
        problem = binary_problem(problem)
        self.problem, self.backend = problem, backend
        self.dev = backend.device
        self.drv = self.dev.drv
        self.core = backend.core(problem)
        self.estep_mod = backend.estep(problem)
        self._fn = {spec.kernel: fn for spec, fn in self.core.funcs}
        resident = backend._resident_xt(X, problem, self._fn["asp_transpose"])
        self.buf = backend._acquire(problem, exact=resident is not None)
        self._closed = False
        self._stale = True
        self._fused_sums = None    # the fused variant whose M-step sums the last E-step left, if any
        self._resp_whole = False   # whether resp holds every row of the last E-step (a fused one may
                                   # store only the rows its exact fallback needs)
        self._launched = []
        self._plans, self._calls = {}, {}   # launch configurations and argument lists, per module
        self.phase_seconds = []
        self._sync_each = os.environ.get("ASP_GMM_CUDA_SYNC", "0") not in ("", "0")
        b = self.buf
        try:
            if b.last_n is not None and b.last_n != problem.N:
                # posteriors beyond N from an earlier, larger session: padding must read as zero
                with self.dev.active():
                    self.drv.memset_d8(b.resp, 0, problem.M * b.ldn * problem.np_dtype.itemsize)
            b.last_n = problem.N
            if resident is not None and resident[1] == b.ldn:
                self.xt = resident[0]
            else:
                self.xt = b.own_xt()
                if cuda_arrays.is_cuda_array(X):    # a PyTorch/CuPy array: transposed where it lies
                    _transpose_on_device(self.dev, cuda_arrays.in_dtype(X, problem.np_dtype), self.xt, problem.N,
                                         problem.D, b.ldn, self._fn["asp_transpose"])
                else:
                    _upload_transposed(self.dev, np.ascontiguousarray(X, dtype=problem.np_dtype), self.xt,
                                       problem.N, problem.D, b.ldn, self._fn["asp_transpose"])
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ helpers
    @property
    def _env(self) -> dict:
        env = dict(self.problem.as_dict())
        env["ldn"] = self.buf.ldn
        env.update(self.backend.limit_context())
        return env

    def _launch(self, name, fn, grid, block, *args, shared=0):
        grid = tuple(grid)
        self._launched.append(f"{name} grid={grid} block={block}")
        try:
            if shared > 48 * 1024 and getattr(fn, "_asp_dyn_smem", 0) < shared:
                # more than 48 KiB of dynamic shared memory must be asked for per function
                fn.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared))
                fn._asp_dyn_smem = shared
            fn.prepared_async_call(grid, block, self.buf.stream, *args, shared_size=shared)
            if self._sync_each:
                self.buf.stream.synchronize()
        except self.drv.Error as exc:
            raise KernelError(f"CUDA kernel {name} (grid={grid}, block={block}, shared={shared} bytes) "
                              f"failed: {exc}") from None

    def _sync(self):
        try:
            self.buf.stream.synchronize()
        except self.drv.Error as exc:
            raise KernelError(f"a CUDA kernel failed ({exc}); launched since the last check: "
                              + "; ".join(self._launched[-12:])) from None
        self._launched.clear()

    def _read_stat(self):
        b = self.buf
        try:
            self.drv.memcpy_dtoh_async(b.stat_host, b.stat, b.stream)
        except self.drv.Error as exc:
            raise KernelError(f"reading the status back failed: {exc}") from None
        self._sync()
        ll = float(b.stat_host[0])
        bad = int(b.stat_host[1:2].view(np.int32)[0])
        return ll, (None if bad == _INT_MAX else bad)

    # ------------------------------------------------------------------ phases
    def _reset(self):
        self._launch("asp_reset", self._fn["asp_reset"], (1, 1), (1, 1, 1), int(self.buf.stat))

    def _factor(self, reg_covar: float, mode: int):
        b, M = self.buf, self.problem.M
        ft = int(self.core.tunables["factor_threads"])
        self._launch("asp_factor", self._fn["asp_factor"], (M, 1), (ft, 1, 1),
                     int(b.acc), int(b.nk), b.ptr("w64"), b.ptr("cov64"), b.ptr("logdet"), b.ptr("prec"),
                     b.ptr("logc"), int(b.work) if b.work is not None else 0, int(b.stat),
                     np.float64(reg_covar), np.int32(mode), np.int32(self.m_live))

    def _args(self, names, scratch=None) -> list:
        b, p = self.buf, self.problem
        val = {"xt": lambda: int(self.xt), "resp": lambda: int(b.resp), "means": lambda: b.ptr("mu"),
               "nk": lambda: int(b.nk), "acc": lambda: int(b.acc),
               "scratch": lambda: int(scratch) if scratch is not None else 0,
               "prec": lambda: b.ptr("prec"), "logc": lambda: b.ptr("logc"), "logp": lambda: int(b.logp),
               "stat": lambda: int(b.stat), "n": lambda: np.int32(p.N), "ldn": lambda: np.int32(b.ldn),
               "d": lambda: np.int32(p.D), "m": lambda: np.int32(p.M),
               "mu64": lambda: b.ptr("mu64"), "w64": lambda: b.ptr("w64"), "params": lambda: int(b.params),
               "backup": lambda: int(b.backup), "pvec": lambda: np.int32(b.param_vec),
               # the parameters of the last E-step (every E-step copies them to the backup)
               "bmu64": lambda: int(b.backup) + b.off["mu64"], "bprec": lambda: int(b.backup) + b.off["prec"],
               "blogc": lambda: int(b.backup) + b.off["logc"]}
        return [val[a]() for a in names]

    def _plan(self, mod: _Module, default_args: tuple, scratch_bytes: bool = False, phase=None):
        """(scratch bytes, [(kernel, function, grid, block, shared, argument names)]) of a variant's
        launches (those of ``phase`` when given) for this session's problem, evaluated once: the
        manifests' expressions are long and the host must keep ahead of the GPU at small sizes."""
        plan = self._plans.get((mod, phase))
        if plan is None:
            env = dict(self._env)
            env.update(mod.tunables)
            if mod.variant is not None:
                mod.variant.derive(env)
            nbytes = int(registry.evaluate(mod.scratch, env)) if scratch_bytes else 0
            confs = [(spec.kernel, fn) + spec.config(env) + (spec.args or default_args,) for spec, fn in mod.funcs
                     if phase is None or spec.phase == phase]
            plan = self._plans[(mod, phase)] = (nbytes, confs)
        return plan

    def _run_plan(self, confs, scratch=None):
        key = (id(confs), int(scratch) if scratch is not None else 0)
        calls = self._calls.get(key)
        if calls is None:
            calls = self._calls[key] = [(k, fn, g, bl, tuple(self._args(names, scratch)), sh)
                                        for k, fn, g, bl, sh, names in confs]
        for k, fn, g, bl, args, sh in calls:
            self._launch(k, fn, g, bl, *args, shared=sh)

    def _estep_launch(self):
        self._run_plan(self._plan(self.estep_mod, ESTEP_ARGS)[1])

    def _means(self, zero_cells: int = 0):
        """Moments and means of the M-step (two launches). Also: the parameters are backed up (for
        the undo of a failed step), the status is cleared (as asp_reset) and, with ``zero_cells``, the
        first zero_cells acc cells of every component are zeroed (for variants with zero_acc)."""
        b, M = self.buf, self.problem.M
        self._launch("asp_moments", self._fn["asp_moments"], (b.mom_blocks, self.core.mom_grid_y),
                     (self.core.mom_threads, 1, 1),
                     int(self.xt), int(b.resp), int(b.part), np.int32(self.problem.N), np.int32(b.ldn),
                     int(b.params), int(b.backup), np.int32(b.param_vec))
        self._launch("asp_means", self._fn["asp_means"], (M, 1), (256, 1, 1),
                     int(b.part), np.int32(b.mom_blocks), int(b.nk), b.ptr("mu64"), b.ptr("mu"),
                     int(b.stat), int(b.acc), np.int32(zero_cells))

    def _variant_phase(self, mod: _Module, phase: str):
        """A covariance variant's launches of one phase. A variant asking for zeroed acc gets it from
        asp_means; a fused one, whose "means" launches replace asp_means, before them."""
        b = self.buf
        nbytes, confs = self._plan(mod, COV_ARGS, scratch_bytes=True, phase=phase)
        scratch = b.ensure_scratch(nbytes)
        if mod.zero_acc and phase == "means":
            self.drv.memset_d32_async(b.acc, 0, 2 * self.problem.M * self.problem.cells, b.stream)
        self._run_plan(confs, scratch)

    def _run_estep(self, fused: _Module | None = None):
        """The E-step (log-likelihood, posteriors); with ``fused``, that variant's E-step, which also
        leaves the sums of the next M-step in its scratch."""
        self._reset()
        if fused is None:
            self._estep_launch()
        else:
            self._variant_phase(fused, "estep")
        ll, _ = self._read_stat()
        self._check_ll(ll)
        self._ll = ll
        self._stale = False
        self._fused_sums = fused
        self._resp_whole = fused is None
        return ll

    @staticmethod
    def _check_ll(ll):
        if not math.isfinite(ll):
            raise FloatingPointError(
                f"the log-likelihood is not finite ({ll}): a component has collapsed onto a few events or "
                "the data has an extreme range. Increase reg_covar, use fewer components, or scale the data.")

    # ------------------------------------------------------------------ Session API
    def set_params(self, weights, means, covars, reg_covar: float) -> None:
        b, p = self.buf, self.problem
        rt = p.np_dtype
        pad = p.M - self.m_live
        if pad:
            # padding components: copies of component 0 (finite, positive definite) of weight 0
            weights = np.concatenate([np.asarray(weights, np.float64), np.zeros(pad)])
            means, covars = (np.concatenate([a, np.repeat(a[:1], pad, axis=0)])
                             for a in (np.asarray(means, np.float64), np.asarray(covars, np.float64)))
        with self.dev.active():
            host = np.zeros(b.param_bytes, np.uint8)
            for name, arr, dt in (("w64", weights, np.float64), ("mu64", means, np.float64),
                                  ("cov64", covars, np.float64), ("mu", means, rt)):
                a = np.ascontiguousarray(np.asarray(arr, dtype=np.float64).astype(dt).reshape(-1))
                host[b.off[name]: b.off[name] + a.nbytes] = a.view(np.uint8)
            self.drv.memcpy_htod(b.params, host)
            self._reset()
            self._factor(reg_covar, 0)
            _, bad = self._read_stat()
        self._stale = True
        if bad is not None:
            raise NotPositiveDefiniteError(bad, reg_covar)

    def params(self):
        b, p = self.buf, self.problem
        host = np.empty(b.param_bytes, np.uint8)
        with self.dev.active():
            self.drv.memcpy_dtoh(host, b.params)
        def get(name, shape):
            n = int(np.prod(shape))
            return host[b.off[name]: b.off[name] + 8 * n].view(np.float64).reshape(shape).copy()
        D, M = p.D, p.M
        cshape = (M, D, D) if p.cvtype == "full" else (M, D)
        m = self.m_live
        return get("w64", (M,))[:m], get("mu64", (M, D))[:m], get("cov64", cshape)[:m]

    def em(self, kernel: Kernel, max_iters: int, min_iters: int, tol: float, reg_covar: float) -> EMRun:
        mod = kernel.handle
        b, N = self.buf, self.problem.N
        it_s, cov_s = [], []
        iters, converged = 0, False
        self.phase_seconds = []
        fused = mod.fused
        with self.dev.active():
            if self._stale or (fused and self._fused_sums is not mod) or not (fused or self._resp_whole):
                self._run_estep(mod if fused else None)   # (a plain M-step reads every row of resp)
            ll = self._ll
            trace = [float(ll)]
            e = b.events
            while iters < max_iters:
                # 5 launches: moments (+ parameter backup), means (+ status reset, acc zeroing),
                # covariance variant, factor, E-step; then the 16-byte status read. A fused variant:
                # its means launch (from the sums its E-step left), its covariance launches, factor,
                # its E-step (+ parameter backup and the next M-step's sums).
                e[0].record(b.stream)
                if fused:
                    self._variant_phase(mod, "means")
                else:
                    self._means(self.problem.cells if mod.zero_acc else 0)
                e[1].record(b.stream)
                self._variant_phase(mod, "covariance")
                e[2].record(b.stream)
                self._factor(reg_covar, 1)
                if fused:
                    self._variant_phase(mod, "estep")
                else:
                    self._estep_launch()
                e[3].record(b.stream)
                new_ll, bad = self._read_stat()
                if bad is not None:
                    # restore the last good parameters; resp still holds their E-step
                    self.drv.memcpy_dtod_async(b.params, b.backup, b.param_bytes, b.stream)
                    self._sync()
                    self._stale = True
                    self._fused_sums = None
                    raise NotPositiveDefiniteError(bad, reg_covar)
                self._check_ll(new_ll)
                it_s.append(e[3].time_since(e[0]) * 1e-3)
                cov_s.append(e[2].time_since(e[1]) * 1e-3)
                # (moments + means, covariance, factor + E-step) of each iteration: benchmarks/gpu.py
                self.phase_seconds.append((e[1].time_since(e[0]) * 1e-3, cov_s[-1], e[3].time_since(e[2]) * 1e-3))
                iters += 1
                change, ll = (new_ll - ll) / N, new_ll
                self._ll = ll
                trace.append(float(ll))
                if iters >= min_iters and abs(change) < tol:
                    converged = True
                    break
        return EMRun(float(ll), iters, converged, it_s, cov_s, trace)

    def loglik(self) -> float:
        if self._stale:
            with self.dev.active():
                self._run_estep()
        return float(self._ll)

    def eval(self, want_resp: bool = True):
        p, b = self.problem, self.buf
        with self.dev.active():
            if self._stale or (want_resp and not self._resp_whole):
                self._run_estep()
            logp = np.empty(b.ldn, p.np_dtype)
            self.drv.memcpy_dtoh(logp, b.logp)
            resp = None
            if want_resp:
                r = np.empty((p.M, b.ldn), p.np_dtype)
                self.drv.memcpy_dtoh(r, b.resp)
                resp = np.ascontiguousarray(r[:self.m_live, :p.N].T)
        return logp[:p.N].copy(), resp

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.backend._release(self.buf)
