"""One exception family under ASPGMMError that keeps the built-ins users already catch."""

import numpy as np
import pytest

import asp_gmm
from asp_gmm import errors, reference
from asp_gmm.backends.numpy_ref import NumpyBackend
from asp_gmm.problem import Problem
from asp_gmm.tuning_db import errors as history_errors
from asp_gmm import GMM
from conftest import make_blobs


@pytest.mark.parametrize(
    "cls, builtins",
    [
        (errors.NotPositiveDefiniteError, (np.linalg.LinAlgError, ValueError, reference.NotPositiveDefiniteError)),
        (errors.NonFiniteError, (FloatingPointError, ValueError, reference.NonFiniteError)),
        (errors.VariantNotApplicableError, (ValueError,)),
        (errors.ManifestError, (ValueError,)),
        (errors.KernelError, (RuntimeError,)),
        (errors.HistoryError, (history_errors.HistoryError,)),
        (errors.SchemaMismatchError, (errors.HistoryError, history_errors.SchemaMismatchError)),
        (errors.CacheError, (OSError,)),
        (errors.UnsafeCacheError, (errors.CacheError, PermissionError)),
        (errors.CompileError, ()),
        (errors.BackendUnavailableError, ()),
    ],
)
def test_every_error_is_an_aspgmm_error_and_its_builtin(cls, builtins):
    assert issubclass(cls, errors.ASPGMMError)
    for b in builtins:
        assert issubclass(cls, b), (cls, b)


def test_public_names_are_the_family():
    assert asp_gmm.NotPositiveDefiniteError is errors.NotPositiveDefiniteError
    assert asp_gmm.NonFiniteError is errors.NonFiniteError
    assert asp_gmm.ASPGMMError is errors.ASPGMMError


def test_reference_errors_translate_with_message_and_component():
    with pytest.raises(reference.NotPositiveDefiniteError) as info:
        reference.precision_cholesky(np.zeros((2, 3, 3)), "full", 1e-6)
    mine = errors.from_reference(info.value)
    assert type(mine) is errors.NotPositiveDefiniteError
    assert mine.component == info.value.component == 0 and str(mine) == str(info.value)
    nf = errors.from_reference(reference.NonFiniteError("log-likelihood is nan"))
    assert type(nf) is errors.NonFiniteError and str(nf) == "log-likelihood is nan"
    other = KeyError("x")
    assert errors.from_reference(other) is other


def test_history_errors_translate():
    e = errors.from_history(history_errors.SchemaMismatchError("schema 9"))
    assert type(e) is errors.SchemaMismatchError and str(e) == "schema 9"
    assert type(errors.from_history(history_errors.HistoryError("x"))) is errors.HistoryError


def _session(cov):
    be = NumpyBackend()
    s = be.open(np.zeros((4, 2)), Problem(4, 2, 2, "full", "float64"))
    s.set_params(np.full(2, 0.5), np.zeros((2, 2)), cov, 1e-6)
    return s


def test_backend_raises_the_package_class_caught_as_linalgerror_and_valueerror():
    bad = np.stack([np.eye(2), np.zeros((2, 2))])
    for catch in (np.linalg.LinAlgError, ValueError, errors.ASPGMMError, asp_gmm.NotPositiveDefiniteError):
        with pytest.raises(catch) as info:
            _session(bad)
        assert type(info.value) is errors.NotPositiveDefiniteError and info.value.component == 1


def test_gmm_train_not_pd_is_catchable_both_ways():
    X = np.random.default_rng(0).normal(size=(50, 2)).astype(np.float32)
    bad = np.array([np.eye(2), -np.eye(2)])
    for backend in ("numpy", "c"):
        for catch in (np.linalg.LinAlgError, ValueError, asp_gmm.ASPGMMError):
            g = asp_gmm.GMM(2, 2, means=X[:2], covars=bad, weights=[0.5, 0.5], backend=backend)
            with pytest.raises(catch) as info:
                g.train(X, max_em_iters=1)
            assert type(info.value) is asp_gmm.NotPositiveDefiniteError and info.value.component == 1


@pytest.mark.parametrize("method", ["train", "score", "eval", "predict"])
def test_shape_errors_name_the_call(method, rng):
    X = make_blobs(rng, 200, 3, 2)
    g = GMM(2, 3, backend="c")
    g.train(X)
    for bad, what in ((X[:, :2], r"has 2 dimensions but the model has D=3"), (X[:, 0], r"must be 2-D.*reshape")):
        with pytest.raises(ValueError, match=rf"^{method}\(\): X {what}"):
            getattr(g, method)(bad)
    with pytest.raises(ValueError, match=rf"^{method}\(\): X is empty \(0 events\); pass at least 1 event$"):
        getattr(GMM(1, 3, backend="c"), method)(np.zeros((0, 3)))
