"""Multi-class SVGP (softmax likelihood, C latent functions sharing Z and the kernel): natural
gradients per latent function against the dense update and the ELBO's stationarity, packing
against finite differences, and the classifier on a small three-class problem."""

import pickle

import numpy as np
import pytest

from pygpfast import kernels, likelihoods
from pygpfast.svgp._optim import NaturalGradient, Packer
from pygpfast.svgp import SVGP, SVGPClassifier
from dense import jittered

C = 3


def three_class(rng, n):
    """Three Gaussian blobs on a circle, labels as strings."""
    centres = 2.0 * np.array([[np.cos(a), np.sin(a)] for a in 2 * np.pi * np.arange(C) / C])
    k = rng.integers(0, C, n)
    X = centres[k] + 0.8 * rng.standard_normal((n, 2))
    return X, np.array(["red", "green", "blue"])[k]


def small_model(rng, whiten, M=5):
    X = rng.standard_normal((30, 2))
    y = rng.integers(0, C, 30).astype(float)
    Z = rng.standard_normal((M, 2))
    kernel = kernels.RBF(variance=1.3, lengthscale=np.array([0.9, 1.4]))
    q_mu = 0.3 * rng.standard_normal((M, C))
    q_sqrt = np.stack([np.tril(0.1 * rng.standard_normal((M, M)), -1) + 0.8 * np.eye(M) for _ in range(C)])
    if not whiten:
        q_sqrt = np.linalg.cholesky(jittered(kernel(Z), 1e-6)) @ q_sqrt
    return SVGP(kernel, likelihoods.Softmax(C), Z, q_mu, q_sqrt, whiten=whiten), X, y


@pytest.mark.parametrize("whiten", [True, False])
def test_multi_latent_natural_step_matches_dense_update(rng, whiten):
    model, X, y = small_model(rng, whiten)
    # the prior precision built here, not by the code under test
    P = np.eye(5) if whiten else np.linalg.inv(jittered(model.kernel(model.Z), model.jitter))
    ng = NaturalGradient()
    for rho in (0.4, 0.8):
        m0 = model.q_mu.copy()
        S0 = np.einsum("lij,lkj->lik", model.q_sqrt, model.q_sqrt)
        _, g = model.elbo(X, y, scale=2.0, with_grad=True, natural=True)
        assert g["d_ell_m"].shape == (5, C) and g["d_ell_S"].shape == (C, 5, 5)
        ng.step(model, g["d_ell_m"], g["d_ell_S"], rho, None if whiten else P)
        for c in range(C):
            G, gm = g["d_ell_S"][c], g["d_ell_m"][:, c]
            prec = (1 - rho) * np.linalg.inv(S0[c]) + rho * (P - 2 * G)
            shift = (1 - rho) * np.linalg.solve(S0[c], m0[:, c]) + rho * (gm - 2 * G @ m0[:, c])
            L = model.q_sqrt[c]
            np.testing.assert_allclose(L @ L.T, np.linalg.inv(prec), rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(model.q_mu[:, c], np.linalg.solve(prec, shift), rtol=1e-9, atol=1e-12)
            assert np.all(np.triu(L, 1) == 0)


def test_multi_latent_natural_gradient_fixed_point(rng):
    model, X, y = small_model(rng, True)
    ng = NaturalGradient()
    for _ in range(80):
        _, g = model.elbo(X, y, with_grad=True, natural=True)
        ng.step(model, g["d_ell_m"], g["d_ell_S"], 0.8)
    _, g = model.elbo(X, y, with_grad=True)
    assert np.abs(g["q_mu"]).max() < 1e-7 and np.abs(g["q_sqrt"]).max() < 1e-7


def test_multi_latent_packer_gradient_matches_finite_differences(rng):
    model, X, y = small_model(rng, True, M=3)
    packer = Packer(model)
    x0 = packer.get()
    assert x0.size == 3 * C + C * 6 + 3 * 2 + 3
    _, g = model.elbo(X, y, with_grad=True, hyper=packer.apply(x0))
    analytic = packer.grad(g, x0)

    def f(x):
        return model.elbo(X, y, hyper=packer.apply(x))[0]

    eps = 1e-6
    num = np.array([(f(x0 + eps * e) - f(x0 - eps * e)) / (2 * eps) for e in np.eye(x0.size)])
    np.testing.assert_allclose(analytic, num, rtol=2e-5, atol=1e-6)


def test_three_class_classifier(rng):
    X, y = three_class(rng, 300)
    Xt, yt = three_class(rng, 300)
    clf = SVGPClassifier(n_inducing=12, random_state=0).fit(X, y)
    assert list(clf.classes_) == ["blue", "green", "red"] and clf.optimizer_ == "lbfgs"
    assert isinstance(clf.likelihood_, likelihoods.Softmax)
    assert clf.model_.q_mu.shape == (12, C) and clf.model_.q_sqrt.shape == (C, 12, 12)
    assert clf.score(Xt, yt) > 0.85
    P = clf.predict_proba(Xt)
    assert P.shape == (300, C)
    np.testing.assert_allclose(P.sum(1), 1.0, rtol=1e-10)
    np.testing.assert_allclose(clf.predict_log_proba(Xt), np.log(P), rtol=1e-8, atol=1e-10)
    mean, var = clf.predict_latent(Xt)
    assert mean.shape == var.shape == (300, C) and np.all(var > 0)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(clf)).predict_proba(Xt), P)


def test_three_class_natural_gradients_and_partial_fit(rng):
    X, y = three_class(rng, 1500)
    Xt, yt = three_class(rng, 500)
    clf = SVGPClassifier(n_inducing=10, optimizer="natgrad", batch_size=100, max_iter=4, random_state=0)
    with pytest.warns(Warning, match="max_iter"):
        clf.fit(X, y)
    assert clf.score(Xt, yt) > 0.85
    stream = SVGPClassifier(n_inducing=10, batch_size=100, random_state=0)
    for start in range(0, 1500, 500):
        stream.partial_fit(X[start : start + 500], y[start : start + 500], classes=["red", "green", "blue"],
                           n_total=1500)
    assert stream.optimizer_ == "natgrad" and stream.score(Xt, yt) > 0.85


@pytest.mark.parametrize(
    "likelihood, match",
    [("probit", "Only binary"), ("logit", "Only binary"), ("cauchit", "likelihood must be one of")],
)
def test_multiclass_likelihood_errors(rng, likelihood, match):
    X, y = three_class(rng, 30)
    with pytest.raises(ValueError, match=match):
        SVGPClassifier(likelihood=likelihood, n_inducing=4, max_iter=5).fit(X, y)


def test_binary_softmax_is_accepted(rng):
    X, y = three_class(rng, 200)
    keep = y != "blue"
    clf = SVGPClassifier(likelihood="softmax", n_inducing=8, random_state=0).fit(X[keep], y[keep])
    assert clf.model_.n_latent == 2 and clf.predict_proba(X[keep]).shape == (keep.sum(), 2)
    assert clf.score(X[keep], y[keep]) > 0.85
