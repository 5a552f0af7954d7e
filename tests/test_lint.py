"""The lint configuration in pyproject.toml ([tool.ruff]) holds for the whole repository."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
needs_ruff = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None,
    reason="ruff is not installed in this interpreter (pip install -e '.[test]'); CI's ./test.sh installs it",
)


@needs_ruff
def test_ruff_check_is_clean():
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@needs_ruff
def test_ruff_format_is_clean():
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, "run `ruff format .`:\n" + r.stdout + r.stderr


def test_version_comes_from_the_package_metadata():
    from importlib import metadata

    import asp_gmm

    try:
        installed = metadata.version("asp_gmm")
    except metadata.PackageNotFoundError:  # run from a checkout on PYTHONPATH (as on the GPU machine)
        assert asp_gmm.__version__ == "0+unknown"
        pytest.skip("asp_gmm is not installed here (run from the checkout): no metadata to compare")
    assert asp_gmm.__version__ == installed
    cfg = (ROOT / "setup.cfg").read_text()
    assert f"\nversion = {asp_gmm.__version__}\n" in cfg
    r = subprocess.run([sys.executable, "-m", "asp_gmm.cli", "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and asp_gmm.__version__ in r.stdout


def test_package_imports_by_name_through_importlib():
    # the package's source rule: plain imports, or importlib.import_module for a name in a variable
    offenders = [
        f"{p.relative_to(ROOT)}:{i}"
        for d in ("asp_gmm", "tuning_db")
        for p in sorted((ROOT / d).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "__import__(" in line
    ]
    assert not offenders, "use importlib.import_module: " + ", ".join(offenders)


def test_the_version_is_read_without_importlib_metadata(tmp_path, monkeypatch):
    """The version comes from the first asp_gmm-*.dist-info on sys.path (as importlib.metadata finds
    it; another distribution whose name begins alike is not taken), without importing
    importlib.metadata (20-30 ms of every process's start)."""
    from asp_gmm import _version

    for name, ver in (("asp_gmm_extra-5.0.dist-info", "5.0"), ("asp_gmm-9.9.9.dist-info", "9.9.9")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "METADATA").write_text(f"Metadata-Version: 2.1\nName: x\nVersion: {ver}\n\nbody\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(tmp_path)] + sys.path)
    assert _version._from_dist_info() == "9.9.9"
    r = subprocess.run(
        [sys.executable, "-c", "import sys, asp_gmm; print('importlib.metadata' in sys.modules, asp_gmm.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    loaded, version = r.stdout.split()
    if version != "0+unknown":  # installed: found without the module
        assert loaded == "False"
