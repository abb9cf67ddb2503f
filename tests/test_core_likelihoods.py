"""The raw likelihood bindings (pygpfast._core): argument checks and output shapes."""

import numpy as np
import pytest

from pygpfast import _core

GAUSSIAN, PROBIT, LOGIT, POISSON = 0, 1, 2, 3
Y = np.array([1.0, 0.0, 1.0])
MU = np.array([0.5, -0.2, 3.0])
VAR = np.array([1.0, 0.0, 2.0])


@pytest.mark.parametrize("kind, param", [(GAUSSIAN, 0.5), (PROBIT, 0.0), (LOGIT, 0.0), (POISSON, 0.5),
                                         (PROBIT, 0.2), (LOGIT, 0.2)])
def test_shapes_and_parameter_derivative(kind, param):
    """param: the Gaussian's variance, a Bernoulli's label noise, ignored by the Poisson."""
    f, dmu, dvar, dparam = _core.likelihoods.variational_expectations(kind, param, 20, 0, Y, MU, VAR)
    assert all(a.shape == (3,) and a.dtype == np.float64 for a in (f, dmu, dvar, dparam))
    if kind == POISSON or param == 0.0:
        np.testing.assert_array_equal(dparam, 0.0)
    else:
        assert np.all(dparam != 0.0)
    mean, var = _core.likelihoods.predict_mean_and_var(kind, param, 20, 0, MU, VAR)
    assert mean.shape == var.shape == (3,)
    assert _core.likelihoods.predict_log_density(kind, param, 20, 0, Y, MU, VAR).shape == (3,)


def test_lengths_must_match():
    with pytest.raises(ValueError, match="mu must have length 3, got 2"):
        _core.likelihoods.variational_expectations(PROBIT, 0.0, 20, 0, Y, MU[:2], VAR)
    with pytest.raises(ValueError, match="var must have length 3, got 2"):
        _core.likelihoods.predict_mean_and_var(PROBIT, 0.0, 20, 0, MU, VAR[:2])
    with pytest.raises(ValueError, match="mu must have length 3"):
        _core.likelihoods.predict_log_density(PROBIT, 0.0, 20, 0, Y, MU[:1], VAR)


def test_arrays_must_be_float64_contiguous():
    with pytest.raises(ValueError, match="float64"):
        _core.likelihoods.variational_expectations(PROBIT, 0.0, 20, 0, Y.astype(np.float32), MU, VAR)
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.likelihoods.predict_mean_and_var(PROBIT, 0.0, 20, 0, np.repeat(MU, 2)[::2], VAR)


@pytest.mark.parametrize(
    "kind, variance, n_gh, message",
    [
        (6, 1.0, 20, "unknown likelihood type 6"),
        (-1, 1.0, 20, "unknown likelihood type -1"),
        (GAUSSIAN, 0.0, 20, "variance must be positive"),
        (GAUSSIAN, np.inf, 20, "variance must be positive"),
        (LOGIT, 0.0, 0, "n_gh"),
        (PROBIT, 0.5, 20, "label-noise probability must be in \\[0, 0.5\\)"),
        (LOGIT, -0.1, 20, "label-noise probability"),
        (PROBIT, np.nan, 20, "label-noise probability"),
        (POISSON, 1.0, 101, "n_gh"),
    ],
)
def test_bad_description(kind, variance, n_gh, message):
    with pytest.raises(ValueError, match=message):
        _core.likelihoods.variational_expectations(kind, variance, n_gh, 0, Y, MU, VAR)
    with pytest.raises(ValueError, match=message):
        _core.likelihoods.predict_mean_and_var(kind, variance, n_gh, 0, MU, VAR)


@pytest.mark.parametrize("kind", [GAUSSIAN, PROBIT, LOGIT, POISSON])
def test_scalar_likelihoods_refuse_classes(kind):
    with pytest.raises(ValueError, match="one latent function: num_classes must be 0, got 3"):
        _core.likelihoods.variational_expectations(kind, 0.0 if kind in (PROBIT, LOGIT) else 1.0, 20, 3, Y, MU, VAR)


SOFTMAX = 4
C3_MU = np.array([[0.5, -0.2, 3.0], [0.0, 1.0, -1.0]])
C3_VAR = np.array([[1.0, 0.0, 2.0], [0.1, 0.2, 0.3]])
C3_Y = np.array([2.0, 0.0])


def test_softmax_shapes():
    f, dmu, dvar, dparam = _core.likelihoods.variational_expectations(SOFTMAX, 1.0, 20, 3, C3_Y, C3_MU, C3_VAR)
    assert f.shape == dparam.shape == (2,) and dmu.shape == dvar.shape == (2, 3)
    np.testing.assert_array_equal(dparam, 0.0)
    mean, var = _core.likelihoods.predict_mean_and_var(SOFTMAX, 1.0, 20, 3, C3_MU, C3_VAR)
    assert mean.shape == var.shape == (2, 3)
    np.testing.assert_allclose(mean.sum(1), 1.0, rtol=1e-14)
    log_density = _core.likelihoods.predict_log_density(SOFTMAX, 1.0, 20, 3, C3_Y, C3_MU, C3_VAR)
    np.testing.assert_allclose(log_density, np.log(mean[[0, 1], [2, 0]]), rtol=1e-13)


def test_softmax_refuses_bad_shapes_and_descriptions():
    shape_message = r"mu must have shape \[2, 3\] \(one column per class\), got \[2, 4\]"
    with pytest.raises(ValueError, match=shape_message):
        _core.likelihoods.variational_expectations(SOFTMAX, 1.0, 20, 3, C3_Y, np.zeros((2, 4)), C3_VAR)
    with pytest.raises(ValueError, match=r"var must have shape \[2, 3\]"):
        _core.likelihoods.predict_log_density(SOFTMAX, 1.0, 20, 3, C3_Y, C3_MU, C3_VAR[:1])
    with pytest.raises(ValueError, match=r"var must have shape \[2, 3\]"):
        _core.likelihoods.predict_mean_and_var(SOFTMAX, 1.0, 20, 3, C3_MU, C3_VAR[:, :2].copy())
    with pytest.raises(ValueError, match="mu must be 2-D"):
        _core.likelihoods.predict_mean_and_var(SOFTMAX, 1.0, 20, 3, MU, VAR)
    with pytest.raises(ValueError, match="mu must be 1-D"):  # a scalar likelihood refuses [N, C]
        _core.likelihoods.predict_mean_and_var(PROBIT, 0.0, 20, 0, C3_MU, C3_VAR)
    for num_classes in (0, 1, -2):
        with pytest.raises(ValueError, match=f"softmax likelihood needs num_classes >= 2, got {num_classes}"):
            _core.likelihoods.variational_expectations(SOFTMAX, 1.0, 20, num_classes, C3_Y, C3_MU, C3_VAR)
    with pytest.raises(ValueError, match="n_gh"):
        _core.likelihoods.variational_expectations(SOFTMAX, 1.0, 0, 3, C3_Y, C3_MU, C3_VAR)


@pytest.mark.parametrize("bad", [3.0, -1.0, 1.5, np.nan])
def test_softmax_labels(bad):
    with pytest.raises(ValueError, match=r"y\[1\] = .* softmax likelihood with 3 classes"):
        _core.likelihoods.variational_expectations(SOFTMAX, 1.0, 20, 3, np.array([0.0, bad]), C3_MU, C3_VAR)


def test_non_finite_means_are_refused():
    mu = C3_MU.copy()
    mu[1, 2] = np.inf
    with pytest.raises(ValueError, match=r"mu\[1, 2\] = inf: marginal means must be finite"):
        _core.likelihoods.variational_expectations(SOFTMAX, 1.0, 20, 3, C3_Y, mu, C3_VAR)
    with pytest.raises(ValueError, match=r"mu\[1\] = nan: marginal means must be finite"):
        _core.likelihoods.predict_mean_and_var(PROBIT, 0.0, 20, 0, np.array([0.0, np.nan]), VAR[:2])
