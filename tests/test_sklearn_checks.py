"""scikit-learn's own estimator checks on SVGPClassifier and SVGPRegressor (Gaussian and Poisson
likelihoods), IVMClassifier (joint and one-vs-rest) and ISMOERegressor and ISMOEClassifier
(binary only, in its tags), with settings small enough for the test
suite (few inducing or active points, few iterations). The binary-only classifiers (a Bernoulli
likelihood, the mean-field method) say so in their tags, and the mean-field one, which is
full-batch, has no partial_fit. The Poisson regressor declares positive-only targets, so the
checks give it y > 0 (real values, which it takes as scikit-learn's Poisson models do)."""

import pytest
from sklearn.utils import get_tags

from pygpfast import ISMOEClassifier, ISMOERegressor, IVMClassifier, SVGPClassifier, SVGPRegressor
from sklearn_checks import parametrize_with_checks

SMALL = {"n_inducing": 8, "max_iter": 30}


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@parametrize_with_checks([
    SVGPClassifier(**SMALL),
    SVGPClassifier(likelihood="logit", **SMALL),
    SVGPClassifier(method="mf", **SMALL),
    SVGPRegressor(**SMALL),
    SVGPRegressor(likelihood="poisson", **SMALL),
    IVMClassifier(active_size=10, max_iter=5),
    IVMClassifier(active_size=10, max_iter=5, multi_class="ovr", shared_kernel=False),
    ISMOERegressor(n_experts=2, n_samples=4, max_iter=20),
    ISMOEClassifier(n_experts=2, n_samples=4, max_iter=20),
])
def test_sklearn_compatible(estimator, check):
    check(estimator)


def test_only_the_poisson_likelihood_declares_positive_targets():
    assert get_tags(SVGPRegressor(likelihood="poisson")).target_tags.positive_only
    assert not get_tags(SVGPRegressor()).target_tags.positive_only
    assert not get_tags(SVGPRegressor(likelihood="gaussian")).target_tags.positive_only
