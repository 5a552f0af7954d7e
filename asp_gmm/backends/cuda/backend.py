"""The CUDA backend: adapts one GPU to :class:`asp_gmm.backends.base.Backend`.

It holds the device (:mod:`.device`), the loaded modules (compiled by :mod:`.compile`, launched as
their manifests say, :mod:`.launch`), the device memory (:mod:`.memory`) and opens sessions
(:mod:`.session`) that run the EM loop.

Binaries are compiled per (D, M) class. A problem of less than :data:`PAD_BELOW_WORK` multiply-adds
per iteration runs on the binary of its *component class* (:func:`component_class`: M itself up to 8,
then steps of at most 1/4: 10, 12, 14, 16, 20, 24, ...): the extra components are padding with weight
exactly 0, so their posteriors are exactly 0 and the live components' results are unchanged. An
application that trains many small models of ever-new M (the diarization example) then loads a
handful of binaries instead of compiling one per M; the padding costs at most a quarter more work
where that work is small. Padding enters at one place: the methods marked :func:`_on_binary_problem`
(the backend's entry points) and :meth:`CudaBackend.open` turn the caller's problem into its
:func:`binary_problem`; nothing behind them pads again.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import threading
import time

import numpy as np

from ... import registry
from ...errors import BackendUnavailableError, KernelError
from ...problem import Problem
from ..base import Backend, Kernel, block_rows_for
from .compile import binary_name, cubin_path, is_cached, load_module, render_source
from .device import _DEFAULT_LIMITS, _Device, _probe
from .launch import COV_ARGS, CORE_SIGNATURES, ESTEP_ARGS, Launch, _Module, launches, pluggable
from .memory import DeviceMemory
from .session import CudaSession
from ...config import settings

#: Problems under this many multiply-adds per EM iteration (Problem.work) run on the binary of their
#: component class. An iteration of that size takes a few milliseconds on a current GPU, so the at
#: most 25 % of padding costs less over hundreds of iterations than the compile of an exact binary
#: (seconds for each of the core, E-step and covariance modules) that a new M would need.
PAD_BELOW_WORK = 1e11
#: How long a "not compiled" answer of :meth:`CudaBackend.is_ready` is trusted: another process may
#: compile the binary meanwhile (this process's own compiles clear the answers at once).
NOT_READY_SECONDS = 2.0


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


def _on_binary_problem(method):
    """Mark a backend entry point: its ``problem`` argument is replaced by :func:`binary_problem`
    (idempotent) before the method runs, so that padding is decided here and nowhere else."""
    index = list(inspect.signature(method).parameters).index("problem")

    @functools.wraps(method)
    def entry(*args, **kwargs):
        if "problem" in kwargs:
            kwargs["problem"] = binary_problem(kwargs["problem"])
        elif len(args) > index:
            args = args[:index] + (binary_problem(args[index]),) + args[index + 1 :]
        return method(*args, **kwargs)

    return entry


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


def estep_candidates(problem: Problem, ctx: dict | None = None) -> list:
    """Every pluggable E-step variant with the combinations of its tunables whose limits allow
    ``problem`` (first: the manifest's defaults): ``[(variant, [tunables, ...])]``. Needs no GPU."""
    ctx = dict(_DEFAULT_LIMITS) if ctx is None else ctx
    return [
        (v, [t for t in v.tunable_space() if v.allows(problem, t, extra=ctx)])
        for v in registry.variants("cuda", "estep")
        if pluggable(v)
    ]


class CudaBackend(Backend):
    """NVIDIA GPU through pycuda; kernels rendered from ``variants/cuda`` and compiled with nvcc."""

    name = "cuda"
    shape_specific_binaries = True
    first_launch_costs_more = True
    split_costs_more = True
    #: the simple variants' iteration against V7's kernels at (150 000, 19, 16) diag, H200: V3 40-49x,
    #: V2 ~10x (one EM iteration timed by CUDA events); a fresh history assumed 4x and explored V3
    #: in place for 8 ms of a 0.8 ms allowance
    unknown_ratio_prior = 40.0
    #: V1-V3 ran 10-200x the fastest variant at every shape of benchmarks/rule_order.py's grid (N
    #: 2e5-1e6), and 5.9-8.2x V8's whole call at (500 000, 36, 128) full, H200
    rule_tail = ("V3", "V2", "V1")
    #: a 32 768-event sample of (500 000, 36, 128) full ran V8 slower than V5; the data 1.3x faster (9.8 against 12.7 ns an event)
    samples_underfill = True
    #: a cached module's load (cuModuleLoad and its functions), H100/H200: ~15 ms
    load_seconds_prior = 0.015
    #: a sampled exploration's session over a 32 768-event sample, its upload and two runs of one
    #: configuration, H200, (150 000, 19, 16) diag: 4-6 ms
    sample_fixed_prior = 0.004

    def __init__(self, ordinal: int | None = None, policy=None):
        reason = self.unavailable_reason()
        if reason:
            raise BackendUnavailableError(reason)
        self._ordinal = int(settings().cuda_device or "0") if ordinal is None else ordinal
        self._device = None
        self._lock = threading.RLock()
        self._modules: dict = {}
        self._estep_pick: dict = {}  # (policy, E-step choice) by policy, shape and N class
        self._estep_cands: dict = {}  # E-step candidates by shape
        self._ready: set = set()  # is_ready keys found in the compile cache
        self._not_ready: dict = {}  # is_ready keys not in it -> monotonic time of the answer
        self.memory = DeviceMemory(lambda: self.device)
        #: chooses the E-step (:meth:`asp_gmm.selection.Policy.choose_estep`); None: the default
        self.policy = policy

    def _policy(self):
        if self.policy is not None:
            return self.policy
        from ...runtime import default_runtime
        from ...selection import Policy  # the policy, not the Face: selection imports no backend

        self.policy = Policy(runtime=default_runtime())
        return self.policy

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
        return self.device.fingerprint()

    def covariance_variants(self, problem: Problem | None = None) -> list:
        """Covariance variants that follow the plug-in convention and whose limits allow ``problem``
        (as it runs: padded to its component class when small)."""
        return [v for v in super().covariance_variants(problem) if pluggable(v)]

    @_on_binary_problem
    def tunables_for(self, variant, problem: Problem) -> dict | None:
        return super().tunables_for(variant, problem)

    def limit_context(self) -> dict:
        if self._device is None and _probe() is not None:
            return dict(_DEFAULT_LIMITS)
        return dict(self.device.attrs)

    # ------------------------------------------------------------------ compiling
    @staticmethod
    def _module_key(variant, tun: dict, problem: Problem) -> tuple:
        return (
            variant.key,
            variant.source_sha256,
            tuple(sorted(tun.items())),
            problem.D,
            problem.M,
            problem.cvtype,
            problem.dtype,
        )

    def _load(self, variant, tunables, problem: Problem, prepare: dict) -> _Module:
        """Compile (through the cache) and load ``variant`` for the binary problem ``problem``;
        ``prepare`` maps kernel name to its pycuda argument signature."""
        tun = variant.default_tunables()
        tun.update(tunables or {})
        key = self._module_key(variant, tun, problem)
        mod = self._modules.get(key)
        if mod is not None:
            return mod
        dev = self.device
        src = render_source(variant, tun, problem)
        # compiled outside the lock, so that independent modules compile in parallel threads (the
        # cache's per-entry file lock keeps two threads from compiling the same one)
        cubin_path(src, dev.arch, binary_name(variant, tun, problem))
        with self._lock:
            mod = self._modules.get(key)
            if mod is None:
                m, path = load_module(dev, src, binary_name(variant, tun, problem))
                with dev.active():
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
                mod = _Module(
                    m,
                    funcs,
                    str(variant.extra.get("scratch", "0")),
                    tun,
                    bool(variant.extra.get("zero_acc", False)),
                    variant,
                )
                mod.path = str(path)
                self._modules[key] = mod
                self._not_ready.clear()  # a binary was just built or loaded: ask the cache again
        return mod

    def core(self, problem: Problem) -> _Module:
        """The loaded EM core for the binary problem ``problem``."""
        v = registry.get("cuda", "core", "core")
        mod = self._load(v, None, problem, CORE_SIGNATURES)
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

    @_on_binary_problem
    def selection_key(self, problem: Problem) -> Problem:
        """As the base class, after padding: the variants that run ``problem`` are those of its
        binary problem (component class)."""
        return super().selection_key(problem)

    @_on_binary_problem
    def estep_variant(self, problem: Problem, policy=None):
        """(variant, tunables) of the E-step for ``problem``, as ``policy`` (the specializer's; by
        default the backend's) chooses (:meth:`asp_gmm.selection.Policy.choose_estep`;
        ``$ASP_GMM_CUDA_ESTEP`` pins one). Memoised per policy by shape and N class (half-octaves,
        as the history groups timings)."""
        pinned = settings().cuda_estep or None
        policy = policy if policy is not None else self._policy()
        key = (
            id(policy),
            pinned,
            problem.D,
            problem.M,
            problem.cvtype,
            problem.dtype,
            round(2 * math.log2(max(problem.N, 1))) if problem.N else 0,
        )
        hit = self._estep_pick.get(key)
        if hit is None or hit[0] is not policy:
            if len(self._estep_pick) > 4096:
                self._estep_pick.clear()
            cands = self._estep_candidates(problem)
            if pinned:
                registry.get("cuda", pinned, "estep")  # an unknown name says which exist
            hit = self._estep_pick[key] = (policy, policy.choose_estep(self, problem, cands, pinned))
        return hit[1]

    def _estep_candidates(self, problem: Problem) -> list:
        key = problem if registry.limits_name_n("cuda", "estep") else dataclasses.replace(problem, N=0)
        hit = self._estep_cands.get(key)
        if hit is None:
            if len(self._estep_cands) > 4096:
                self._estep_cands.clear()
            hit = self._estep_cands[key] = estep_candidates(problem, self.limit_context())
        return hit

    @_on_binary_problem
    def estep(self, problem: Problem, variant=None, tunables=None, policy=None) -> _Module:
        """The loaded E-step module for ``problem`` (``policy``'s choice unless ``variant`` is given)."""
        if variant is None:
            variant, tunables = self.estep_variant(problem, policy)
        return self._load(variant, tunables, problem, {"*": ESTEP_ARGS})

    @_on_binary_problem
    def prepare(self, problem: Problem) -> None:
        """Load the EM core and the E-step of ``problem``'s class; their cubins, when not cached,
        compile in parallel."""
        from .. import nvrtc  # its pool runs leaf work only (never waits on itself): no deadlock

        other = nvrtc.pool().submit(self.estep, problem)
        self.core(problem)
        other.result()

    @_on_binary_problem
    def prepare_key(self, problem: Problem):
        return (problem.D, problem.M, problem.cvtype, problem.dtype)

    @_on_binary_problem
    def is_loaded(self, variant, tunables, problem: Problem) -> bool:
        tun = variant.default_tunables()
        tun.update(tunables or {})
        return self._module_key(variant, tun, problem) in self._modules

    def readiness_token(self):
        """Modules loaded and configurations found compiled in this process (see the base class)."""
        return (len(self._modules), len(self._ready))

    @_on_binary_problem
    def is_ready(self, variant, tunables, problem: Problem) -> bool:
        """True when this variant, the EM core and the E-step for the problem's class are loaded or
        their cubins are cached (sources depend on D and M here, so a new M class means compiling)."""
        tun = variant.default_tunables()
        tun.update(tunables or {})
        key = self._module_key(variant, tun, problem)
        if key in self._modules or key in self._ready:
            return True
        asked = self._not_ready.get(key)
        now = time.monotonic()
        if asked is not None and now - asked < NOT_READY_SECONDS:
            return False  # (rendering three templates and hashing them per candidate per call cost
            # more than half of a small call; this process's own compiles clear the memo at once)
        arch = self.device.arch
        ev, et = self.estep_variant(problem)
        for v, t in ((variant, tun), (registry.get("cuda", "core", "core"), None), (ev, et)):
            t2 = v.default_tunables()
            t2.update(t or {})
            if not is_cached(render_source(v, t2, problem), arch, binary_name(v, t2, problem)):
                if len(self._not_ready) > 4096:
                    self._not_ready.clear()
                self._not_ready[key] = now
                return False
        self._not_ready.pop(key, None)
        self._ready.add(key)  # in the disk cache: stays so (entries are only ever added or rebuilt)
        return True

    @_on_binary_problem
    def kernel(self, variant, tunables, problem: Problem) -> Kernel:
        tun = variant.default_tunables()
        tun.update(tunables or {})
        if not pluggable(variant):
            raise KernelError(
                f"{variant.key} declares no [[launch]] table; see 'How a covariance variant "
                "plugs in' in asp_gmm/backends/cuda/launch.py"
            )
        mod = self._load(variant, tun, problem, {"*": COV_ARGS})
        return Kernel(variant, tun, handle=mod, binary=mod.path)

    # ------------------------------------------------------------------ sessions
    #: :meth:`open` takes the specializer's policy (it chooses the E-step, :meth:`estep_variant`)
    chooses_estep = True

    def open(self, X, problem: Problem, policy=None) -> CudaSession:
        """A session over ``X`` (N, D); small problems run padded (``binary_problem``), the session
        returns only the caller's ``problem.M`` components. ``policy``: the specializer's, which
        chooses the E-step (default: the backend's)."""
        return CudaSession(self, X, binary_problem(problem), problem.M, policy=policy)

    def open_stats(self, problem: Problem, kernel: Kernel | None = None):
        """Streamed EM: blocks of up to ``problem.N`` events through one session, two streams and
        pinned buffers (:mod:`asp_gmm.backends.cuda.stream`)."""
        from .stream import CudaStatsRunner

        return CudaStatsRunner(self, problem, kernel)

    #: ``asp_weight_rows`` (the EM core) folds sample weights into the posteriors on the device
    weights_in_kernels = True
    #: ... in a session's own EM loop too (:meth:`CudaSession.set_sample_weight`): a weighted fit of
    #: in-memory data runs as an unweighted one does, the weights kept on the device
    weights_in_session = True

    def open_weighted_stats(self, problem: Problem, kernel: Kernel | None = None, resident: bool = False):
        """Weighted streamed EM: each block's weights go to the device with its rows and are folded
        into the posteriors there (:mod:`asp_gmm.backends.cuda.weighted`; ``resident``: the blocks
        stay on the device between passes). A covariance variant that takes no weights (its E-step
        fuses the M-step sums: ``sample_weight = false``) gets the default runner, which folds them
        into each block's posteriors on the host."""
        if kernel is not None and not kernel.variant.takes_weights:
            return super().open_weighted_stats(problem, kernel)
        from .weighted import CudaWeightedStatsRunner

        return CudaWeightedStatsRunner(self, problem, kernel, resident=resident)

    def stream_block_rows(self, problem: Problem) -> int:
        """Blocks of 1 GiB of data and posteriors (``ASP_GMM_BLOCK_BYTES`` overrides): large enough
        that a block's launches are a small part of its time."""
        return block_rows_for(problem, default_bytes=1 << 30)
