"""Every ASP_GMM_* setting is read in asp_gmm/config.py and listed in the README."""

import re
from pathlib import Path

from asp_gmm import config

ROOT = Path(__file__).resolve().parents[1]
#: read outside config.py until the split of the CUDA backend / selection / specializer lands
#: (tuning_db reads ASP_GMM_DB itself only when called without a URL: it imports nothing of asp_gmm)
PENDING = {"tuning_db/values.py"}  # tuning_db imports nothing of asp_gmm: default_url() reads ASP_GMM_DB


def test_defaults_and_fallbacks():
    s = config.Settings.from_environ({})
    assert s.autotune and not s.debug and not s.cuda_sync
    assert s.c_compiler() == ["gcc"] and s.threads() is None
    s = config.Settings.from_environ({"CC": "clang -O2", "OMP_NUM_THREADS": "3,2", "ASP_GMM_AUTOTUNE": "Off"})
    assert s.c_compiler() == ["clang", "-O2"] and s.threads() == 3 and not s.autotune
    s = config.Settings.from_environ(
        {
            "CC": "clang",
            "ASP_GMM_CC": "gcc-13",
            "OMP_NUM_THREADS": "3",
            "ASP_GMM_NUM_THREADS": "x",
            "ASP_GMM_DEBUG": "1",
        }
    )
    assert s.c_compiler() == ["gcc-13"] and s.threads() is None and s.debug


def test_read_at_call_time(monkeypatch):
    monkeypatch.setenv("ASP_GMM_CACHE_DIR", "/tmp/somewhere")
    assert config.settings().cache_dir == "/tmp/somewhere"
    monkeypatch.delenv("ASP_GMM_CACHE_DIR")
    assert config.settings().cache_dir == ""


def test_no_module_reads_a_setting_but_config():
    offenders = []
    for path in list((ROOT / "asp_gmm").rglob("*.py")) + list((ROOT / "tuning_db").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "asp_gmm/config.py" or rel in PENDING:
            continue
        text = path.read_text()
        if re.search(r"environ(\.get)?[\[(]\s*['\"]ASP_GMM_|getenv\(\s*['\"]ASP_GMM_", text):
            offenders.append(rel)
    assert offenders == []


def test_every_setting_in_the_readme_table_and_in_config():
    readme = (ROOT / "README.md").read_text()
    for name, (default, meaning) in config.SETTINGS.items():
        assert f"| `{name}` | {meaning} | {default} |" in readme, name
    used = set()
    for path in list((ROOT / "asp_gmm").rglob("*.py")) + list((ROOT / "tuning_db").rglob("*.py")):
        used |= set(re.findall(r"ASP_GMM_[A-Z_]+[A-Z]", path.read_text()))
    assert used <= set(config.SETTINGS), used - set(config.SETTINGS)


def test_settings_are_parsed_again_only_when_a_value_changes(monkeypatch):
    """settings() is asked hundreds of times a call: it returns the same object while the
    environment's values are unchanged, and a new one as soon as any of them changes."""
    seen = []

    class Recording(dict):
        def get(self, name, default=None):
            seen.append(name)
            return super().get(name, default)

    config.Settings.from_environ(Recording())
    assert tuple(seen) == config._NAMES  # the memo's key covers every name read
    monkeypatch.delenv("ASP_GMM_CUDA_ESTEP", raising=False)
    a = config.settings()
    assert config.settings() is a
    monkeypatch.setenv("ASP_GMM_CUDA_ESTEP", "estep_fast")
    b = config.settings()
    assert b is not a and b.cuda_estep == "estep_fast"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert config.settings().threads() == 3
