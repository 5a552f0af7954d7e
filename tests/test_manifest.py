"""The manifest contract: a typed schema that rejects unknown keys; one name for a variant with tunables."""

import pytest

from asp_gmm import registry
from asp_gmm.errors import ManifestError
from asp_gmm.problem import Problem

GOOD = {
    "name": "VX",
    "backend": "c",
    "phase": "covariance",
    "template": "",
    "description": "x",
    "tunables": {"chunk_tiles": [4, 8]},
    "limits": [{"require": "D <= 64", "reason": "r"}],
}


def test_shipped_manifests_follow_the_schema():
    vs = registry.all_variants()
    assert vs
    for v in vs:
        assert set(v.extra) <= {k for k, s in registry.MANIFEST_KEYS.items() if s.backend_specific}


def test_a_good_manifest_passes():
    assert registry.load_manifest("v.toml", dict(GOOD)) == GOOD


@pytest.mark.parametrize(
    "data, words",
    [
        ({**GOOD, "tunabels": {}}, ["variants/c/vx.toml", "'tunabels'", "did you mean 'tunables'", "cvtypes"]),
        ({**GOOD, "limits": [{"requires": "D < 2"}]}, ["[[limits]] #1", "'requires'", "reason, require"]),
        ({**GOOD, "launch": [{"kernel": "k", "gird": "1", "block": "1"}]}, ["[[launch]] #1", "'gird'", "grid"]),
        ({**GOOD, "zero_acc": "yes"}, ["'zero_acc'", "bool"]),
        ({**GOOD, "cvtypes": "full"}, ["'cvtypes'", "list"]),
        ({k: v for k, v in GOOD.items() if k != "name"}, ["no 'name'"]),
    ],
)
def test_a_typo_or_a_wrong_type_names_file_key_and_known_keys(data, words):
    with pytest.raises(ManifestError) as info:
        registry.load_manifest("variants/c/vx.toml", data)
    assert isinstance(info.value, ValueError)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_config_is_the_variant_with_its_tunables():
    v = registry.get("c", "V3")
    c = registry.Config.of(v, {"chunk_tiles": 8})
    assert c == registry.Config.of(v, {"chunk_tiles": 8}) and hash(c) == hash(registry.Config.of(v, {"chunk_tiles": 8}))
    assert c.params == {**v.default_tunables(), "chunk_tiles": 8}
    assert c.label == "V3(chunk_tiles=8)"
    key = c.history_key()
    assert (key.backend, key.name, key.tunables_dict, key.source_sha256) == ("c", "V3", c.params, v.source_sha256)
    from asp_gmm.backends.base import Kernel

    k = Kernel(v, {"chunk_tiles": 8})
    assert k.config == c and k.label == c.label
    assert v.allows(Problem(100, 3, 2))
