"""The package as users get it: a wheel built from the sources, installed outside the repository,
carries every variant file and trains with every backend present (the editable install the other
tests use reads the repository and would hide a file missing from the package data)."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: what building the wheel reads (setup.cfg's package_dir and long_description)
SOURCES = ["asp_gmm", "variants", "tuning_db", "setup.cfg", "pyproject.toml", "README.md"]

CHILD = r"""
import json, sys, warnings
import numpy as np
import asp_gmm
from asp_gmm import GMM
from asp_gmm.backends import _BACKENDS, available, unavailable_reason
X = np.random.default_rng(0).standard_normal((400, 3)).astype(np.float32)
out = {"file": asp_gmm.__file__, "backends": {}, "path": sys.path}
out["unavailable"] = {name: str(unavailable_reason(name)) for name in _BACKENDS if name not in available()}
for name in available():
    g = GMM(2, 3, backend=name)
    out["backends"][name] = float(g.train(X, max_em_iters=2))
try:
    from asp_gmm import GaussianMixture
except ImportError:
    out["sklearn"] = None
else:
    out["sklearn"] = float(GaussianMixture(2, backend="numpy", random_state=0).fit(X).score(X))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(p, src / name)
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("asp_gmm-*.whl")
    return whl


def test_wheel_carries_every_variant_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {
        "asp_gmm/variants/" + p.relative_to(ROOT / "variants").as_posix()
        for p in (ROOT / "variants").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert want and not want - names, f"missing from the wheel: {sorted(want - names)}"


def test_wheel_carries_every_module(wheel):
    """Every Python file of the package and the history is in the wheel (a subpackage missing from
    setup.cfg's ``packages`` fails only where it is first imported, e.g. the history's tunable search)."""
    names = set(zipfile.ZipFile(wheel).namelist())
    want = {"asp_gmm/" + p.relative_to(ROOT / "asp_gmm").as_posix() for p in (ROOT / "asp_gmm").rglob("*.py")}
    want |= {
        "asp_gmm/tuning_db/" + p.relative_to(ROOT / "tuning_db").as_posix() for p in (ROOT / "tuning_db").rglob("*.py")
    }
    assert want and not want - names, f"missing from the wheel: {sorted(want - names)}"


def _child_pythonpath(target):
    """The installed wheel first, then the environment's own PYTHONPATH entries outside the
    repository (where a machine keeps the dependencies, e.g. a GPU machine's pycuda and cffi), so
    that the child finds the dependencies but never the repository's sources."""
    keep = [
        p
        for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if p and not Path(p).resolve().is_relative_to(ROOT)
    ]
    return os.pathsep.join([str(target), *keep])


def test_installed_wheel_trains_with_every_backend(wheel, tmp_path, monkeypatch):
    deps = tmp_path / "deps"  # stands for a folder of dependencies on PYTHONPATH
    deps.mkdir()
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(deps), str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    target = tmp_path / "site"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    run_in = tmp_path / "elsewhere"
    run_in.mkdir()
    env = dict(os.environ, PYTHONPATH=_child_pythonpath(target), ASP_GMM_AUTOTUNE="0")
    r = subprocess.run([sys.executable, "-c", CHILD], cwd=run_in, env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "ModuleNotFoundError" in r.stderr:
        pytest.skip(f"the installed wheel cannot import a dependency here ({r.stderr.strip().splitlines()[-1]})")
    assert r.returncode == 0, r.stderr
    import json

    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).resolve().is_relative_to(target.resolve()), got["file"]
    assert not Path(got["file"]).resolve().is_relative_to(ROOT)
    assert str(deps) in got["path"] and str(ROOT) not in got["path"]
    missing = {n: got["unavailable"].get(n) for n in set(_available_here()) - set(got["backends"])}
    if missing and all("No module named" in str(why) or "not installed" in str(why) for why in missing.values()):
        pytest.skip(f"outside this environment's installs the wheel lacks a backend's dependency: {missing}")
    assert not missing and "numpy" in got["backends"], missing
    if _sklearn_installed():
        assert got["sklearn"] is not None


def _available_here():
    from asp_gmm.backends import available

    return available()


def _sklearn_installed():
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_examples_extra_installs_only_what_the_example_imports():
    """``pip install asp_gmm[examples]`` brings what examples/ imports and nothing more (librosa
    pulled numba and llvmlite that nothing used)."""
    import configparser
    import re

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    reqs = [r.strip() for r in cfg["options.extras_require"]["examples"].strip().splitlines() if r.strip()]
    modules = {"scikit-learn": "sklearn", "pyannote.metrics": "pyannote"}
    source = "\n".join(p.read_text() for p in (ROOT / "examples").rglob("*.py"))
    for req in reqs:
        name = re.split(r"[<>=!\[ ;]", req)[0]
        mod = modules.get(name, name)
        assert re.search(rf"^\s*(import|from) {re.escape(mod)}\b", source, re.M), (
            f"{req}: examples/ never imports {mod}"
        )
