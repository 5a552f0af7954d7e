"""Every CUDA template renders and compiles for sm_90 (a cubin) over a grid of tunables and problem
sizes, once per distinct code path. Needs NVRTC (cuda-bindings) or nvcc only (no pycuda, no GPU): CI
runs it; a failing template fails the suite. tests/test_nvrtc.py checks that NVRTC's cubins have the
kernels, parameters and shared memory of nvcc's, and compiles through nvcc.

The grid: every CUDA variant at each problem class below with its default tunables (odd D, D = 1,
M = 1, D large enough to tile the cells and to move the Cholesky factor and the E-step operands out
of registers and shared memory, float64), the tunables that switch a variant's code path (PATHS:
V8 at every tmax of its manifest), a variant's own classes (EXTRA_CLASSES), and every combination of
tunables of the backend's own variants at one class. Grid points whose rendered sources differ only in numbers (sizes, unrolled
constants), with the same values of every macro a preprocessor condition reads, take the same code
path: one of them is compiled (the largest problem, where static sizes are at their largest), so a
template is compiled once per path rather than once per shape; a variant whose sizes alone shape
its code (V9: no preprocessor switch) is compiled once per shape class of its derived geometry. Compiles run in parallel (NVRTC in
this process, which releases the GIL) into the session's compile cache.
"""

import dataclasses
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from asp_gmm import registry
from asp_gmm.backends import cuda as cu
from asp_gmm.backends import nvrtc
from asp_gmm.errors import CompileError
from asp_gmm.problem import Problem
from conftest import code_path

NVCC = cu.nvcc_command()
HAVE_NVCC = shutil.which(NVCC[0]) is not None or os.path.exists(NVCC[0])
HAVE_NVRTC = nvrtc.available()
pytestmark = pytest.mark.skipif(
    not (HAVE_NVCC or HAVE_NVRTC), reason="neither NVRTC (pip install cuda-bindings nvidia-cuda-nvrtc) nor nvcc is here"
)

ARCH = "sm_90"
CLASSES = [  # (D, M, cvtype, dtype)
    (1, 1, "full", "float32"),
    (19, 16, "full", "float32"),
    (19, 16, "diag", "float32"),
    (36, 128, "full", "float32"),
    (36, 128, "diag", "float32"),
    (64, 64, "full", "float32"),
    (7, 3, "full", "float64"),
    (7, 3, "diag", "float64"),
    (100, 5, "full", "float32"),  # cells tiled in passes, Cholesky in global memory, E-step from xt
    (150, 2, "diag", "float32"),
    # tied and spherical: the full and diag kernels (the same code paths); the core pools or averages
    (19, 16, "tied", "float32"),
    (19, 16, "spherical", "float32"),
    (36, 128, "tied", "float32"),
    (36, 128, "spherical", "float32"),
    (7, 3, "tied", "float64"),
    (7, 3, "spherical", "float64"),
]
TUNED_CLASS = (19, 16, "full", "float32")
OWN = {"core", "estep", "V1", "V2", "V3", "V4"}
V8 = registry.get("cuda", "V8", "covariance")
V9 = registry.get("cuda", "V9", "covariance")
#: tunables that switch a variant to another code path, compiled at every class the variant allows too:
#: V7's CUDA-core M phase and one component tile a warp; every tmax of V8's manifest (its tile plan: tmax
#: sets TW, the warps a component's tiles are cut into, each a case of the kernel's switch; tmax values
#: that cut a class's tiles alike render the same source and are compiled once); V9's other E-step GEMM
PATHS = {
    "V7": [{"mtc": 0}, {"tc_wm": 1}],
    "V8": [{"tmax": t} for t in V8.tunables["tmax"]],
    "V9": [{"wg": 0, "ws": 0}, {"ws": 0}],  # the mma.sync E-step and sums (the defaults, wgmma, need sm_90a)
}
#: problem classes of one variant only (beyond CLASSES): V9 with several 128-component E-step tiles at its
#: limit (MPAD = 8192: the guarded-component list fills most of asp_v9_efix's static shared memory),
#: and at a D whose tile of events does not fit at be = 128 (be = 32: two mma tiles an event warp, the
#: sums in 8 column groups)
EXTRA_CLASSES = {"V9": [(16, 8192, "diag", "float32"), (1000, 64, "diag", "float32")]}


def v9_shape_class(env: dict) -> tuple:
    """What V9's source leaves to its sizes alone (no preprocessor switch reads them) but shapes the
    compiled code, from its manifest's [derived] geometry: several component tiles of the E-step, several
    column groups of the sums, the E-step's mma tiles an event warp."""
    return (env["CT"] > 1, env["CG"] > 1, env["MI"])


#: a variant's shape class (from its derived geometry): grid points of one code path but different
#: classes are compiled each
SHAPE_CLASS = {"V9": v9_shape_class}


def _jobs():
    jobs = {}
    ctx = dict(cu._DEFAULT_LIMITS)
    for v in registry.variants("cuda"):
        if not v.template:
            continue
        for D, M, cv, dt in CLASSES + EXTRA_CLASSES.get(v.name, []):
            p = Problem(1000, D, M, cv, dt)
            # the first combination the limits allow, if any (as the backend would pick)
            tun = v.default_tunables() if v.phase == "core" else v.first_allowed(p, extra=ctx)
            if tun is None:
                continue
            jobs[(v.name, D, M, cv, dt, tuple(sorted(tun.items())))] = (v, tun, p)
            for path in PATHS.get(v.name, []):
                tun = dict(v.default_tunables(), **path)
                if v.allows(p, tun, extra=ctx):
                    jobs[(v.name, D, M, cv, dt, tuple(sorted(tun.items())))] = (v, tun, p)
        if v.name in OWN:
            D, M, cv, dt = TUNED_CLASS
            p = Problem(1000, D, M, cv, dt)
            for tun in v.tunable_space():
                if v.phase == "core" or v.allows(p, tun, extra=ctx):
                    jobs[(v.name, D, M, cv, dt, tuple(sorted(tun.items())))] = (v, tun, p)
    return jobs


def shape_class(v, tun, p):
    """The variant's shape class of a grid point (:data:`SHAPE_CLASS`; None where it has none)."""
    f = SHAPE_CLASS.get(v.name)
    if f is None:
        return None
    return f(v.derive(dict(p.as_dict(), **dict(v.default_tunables(), **tun), **cu._DEFAULT_LIMITS)))


def _by_path(jobs: dict) -> dict:
    """One job per (variant, code path, shape class): the one with the largest problem."""
    groups = {}
    for key, (v, tun, p) in jobs.items():
        groups.setdefault((v.name, code_path(cu.render_source(v, tun, p)), shape_class(v, tun, p)), []).append(key)
    keep = {}
    for keys in groups.values():
        k = max(keys, key=lambda k: (jobs[k][2].D * jobs[k][2].M, jobs[k][2].D, k[3], k[4]))
        keep[k] = jobs[k]
    return keep


ALL_JOBS = _jobs()
JOBS = _by_path(ALL_JOBS)


def compile_job(v, tun, p, arch=ARCH):
    """The cubin path of one grid point: through NVRTC where it is installed, else nvcc."""
    t = v.default_tunables()
    t.update(tun or {})
    src = cu.render_source(v, t, p)
    name = cu.binary_name(v, t, p)
    return nvrtc.build_cubin(src, arch, name) if HAVE_NVRTC else cu.cubin_path_nvcc(src, arch, name)


@pytest.fixture(scope="module")
def compiled():
    def one(item):
        v, tun, p = item
        try:
            return str(compile_job(v, tun, p))
        except CompileError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as ex:
        return dict(zip(JOBS, ex.map(one, JOBS.values())))


def _id(key):
    name, D, M, cv, dt, tun = key
    return f"{name}-D{D}-M{M}-{cv}-{dt}-" + ",".join(f"{k}={v}" for k, v in tun)


@pytest.mark.parametrize("key", list(JOBS), ids=[_id(k) for k in JOBS])
def test_template_compiles(key, compiled):
    res = compiled[key]
    if isinstance(res, Exception):
        pytest.fail(str(res))
    assert os.path.getsize(res) > 0


def test_one_compile_per_code_path():
    """Every grid point is represented by a compiled point of the same variant and code path, and the
    masking keeps what selects a path (a preprocessor switch's value, a tunable that changes the text)."""
    assert len(JOBS) < len(ALL_JOBS)
    paths = {(k[0], code_path(cu.render_source(*ALL_JOBS[k]))) for k in JOBS}
    for key, (v, tun, p) in ALL_JOBS.items():
        assert (v.name, code_path(cu.render_source(v, tun, p))) in paths, key
    assert code_path("#define CHOL_IN_SHARED 1\n#if CHOL_IN_SHARED\nx[3]\n#endif") != code_path(
        "#define CHOL_IN_SHARED 0\n#if CHOL_IN_SHARED\nx[3]\n#endif"
    )
    assert code_path("#define D 19\nfloat x[19];") == code_path("#define D 36\nfloat x[36];")
    v4 = {k for k in ALL_JOBS if k[0] == "V4"}
    assert len({code_path(cu.render_source(*ALL_JOBS[k])) for k in v4}) > 1


def test_every_own_variant_is_covered():
    names = {k[0] for k in JOBS}
    assert OWN <= names
    for name, paths in PATHS.items():
        for path in paths:
            assert any(k[0] == name and set(path.items()) <= set(k[5]) for k in JOBS), (name, path)
    for v in registry.variants("cuda", "covariance"):
        if v.name in OWN:
            assert cu.pluggable(v), f"{v.key} must declare its launches"
            for spec in cu.launches(v):
                assert spec.kernel


def test_v8_compiles_every_tile_plan():
    """V8 is compiled at every tile plan its manifest derives for the grid's full-covariance classes:
    each tmax that cuts a class's tiles over another number of warps (TW) is a compile of its own."""
    compiled = {}
    for k, (v, tun, p) in JOBS.items():
        if k[0] == "V8":
            compiled.setdefault(p.D, set()).add(v.derive(dict(p.as_dict(), **tun, **cu._DEFAULT_LIMITS))["TW"])
    plans = {}
    for D, M, cv, dt in CLASSES:
        p = Problem(1000, D, M, cv, dt)
        for t in V8.tunables["tmax"]:
            tun = dict(V8.default_tunables(), tmax=t)
            if V8.allows(p, tun, extra=cu._DEFAULT_LIMITS):
                plans.setdefault(D, set()).add(V8.derive(dict(p.as_dict(), **tun, **cu._DEFAULT_LIMITS))["TW"])
    assert compiled == plans
    assert any(len(tw) > 2 for tw in plans.values())  # a class where all three tmax values differ


def test_v9_compiles_at_several_shape_classes():
    """V9 (one code path: no preprocessor switch) is compiled once per shape class, and the grid has
    several: one component tile and many, one column group of the sums and several, be = 128 and 32."""
    classes = {shape_class(*JOBS[k]) for k in JOBS if k[0] == "V9"}
    assert len(classes) >= 4, classes
    assert {c[0] for c in classes} == {False, True} and {c[1] for c in classes} == {False, True}
    assert {c[2] for c in classes} >= {2, 4}
    assert any(k[0] == "V9" and k[2] == 8192 for k in JOBS)  # at the limit of its guarded-component list


def test_launch_expressions_evaluate():
    """Every launch table of the backend's variants gives positive grid and block sizes."""
    env = dict(Problem(150_000, 19, 16).as_dict(), ldn=150_016, **cu._DEFAULT_LIMITS)
    for v in registry.variants("cuda"):
        if not cu.pluggable(v):
            continue
        e = v.derive(dict(env, **v.default_tunables()))
        for spec in cu.launches(v):
            grid, block, shared = spec.config(e)
            assert min(grid) >= 1 and min(block) >= 1 and shared >= 0
        assert int(registry.evaluate(str(v.extra.get("scratch", "0")), e)) >= 0


def test_import_does_not_need_pycuda_or_a_gpu():
    import asp_gmm.backends.cuda  # noqa: F401  (imported above; pycuda is imported lazily)

    reason = cu.CudaBackend.unavailable_reason()
    assert reason is None or isinstance(reason, str)


def test_component_classes_pad_at_most_a_quarter():
    classes = {cu.component_class(m) for m in range(1, 300)}
    for m in range(1, 300):
        c = cu.component_class(m)
        assert c >= m and (c - m) * 4 <= c and cu.component_class(c) == c
    assert {1, 2, 5, 8, 10, 12, 16, 20, 40, 64, 80, 96, 128} <= classes
    assert len([c for c in classes if c <= 64]) == 20  # 1..8, then four steps per octave
    small = Problem(50_000, 19, 37, "diag", "float32")
    assert cu.binary_problem(small) == Problem(50_000, 19, 40, "diag", "float32")
    big = Problem(1_000_000, 64, 127, "full", "float32")  # worth a binary of its own
    assert cu.binary_problem(big) is big


def test_wgmma_source_takes_the_arch_specific_target():
    """A source using wgmma (V9 with wg = 1) is compiled for sm_90a by either compiler (a plain sm_90
    target rejects wgmma); the others keep the device's architecture."""
    p = Problem(1000, 36, 300, "diag", "float32")
    wg = cu.render_source(V9, dict(V9.default_tunables(), wg=1), p)
    plain = cu.render_source(V9, dict(V9.default_tunables(), wg=0, ws=0), p)
    assert nvrtc.target_arch(wg, "sm_90") == "sm_90a" and nvrtc.target_arch(plain, "sm_90") == "sm_90"
    assert nvrtc.target_arch(wg, "sm_90a") == "sm_90a"
    if HAVE_NVCC:
        path = cu.cubin_path_nvcc(wg, "sm_90", cu.binary_name(V9, dict(V9.default_tunables(), wg=1), p))
        assert os.path.getsize(path) > 0


def test_wgmma_limits_are_data():
    """wg = 1 and ws = 1 need compute capability 9.0 (wg whole 64-event warpgroups too): elsewhere the
    limits say so and the first allowed tunables keep the mma.sync E-step and sums."""
    p = Problem(1000, 36, 300, "diag", "float32")
    ctx90, ctx80 = dict(cu._DEFAULT_LIMITS), dict(cu._DEFAULT_LIMITS, cc=80)
    assert V9.allows(p, dict(V9.default_tunables(), wg=1), extra=ctx90)
    reason = V9.check(p, dict(V9.default_tunables(), wg=1), extra=ctx80)
    assert reason is not None and "sm_90a" in reason
    assert not V9.allows(p, dict(V9.default_tunables(), wg=1, be=32), extra=ctx90)
    first = V9.first_allowed(p, extra=ctx80)
    assert first["wg"] == 0 and first["ws"] == 0
    reason = V9.check(p, dict(V9.default_tunables(), wg=0), extra=ctx80)
    assert reason is not None and "sums" in reason


def test_a_source_is_rendered_once_per_process_and_configuration(monkeypatch):
    """``is_ready`` renders the variant, the EM core and the E-step for every configuration a plan
    asks about (H200: a plan proposing eight tunable combinations spent 35 of its 64 ms rendering);
    the same configuration and class is rendered once, another tunable value or M again."""
    from asp_gmm.backends.cuda import compile as cc

    calls = []
    real = cc._render
    monkeypatch.setattr(cc, "_render", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(cc, "_RENDERED", {})
    v = registry.get("cuda", "V5")
    p = Problem(1000, 36, 128, "full", "float32")
    a = cc.render_source(v, v.default_tunables(), p)
    assert cc.render_source(v, v.default_tunables(), dataclasses.replace(p, N=5000)) == a and len(calls) == 1
    cc.render_source(v, {**v.default_tunables(), "tile": 4}, p)
    cc.render_source(v, v.default_tunables(), dataclasses.replace(p, M=64))
    assert len(calls) == 3
