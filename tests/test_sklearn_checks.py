"""scikit-learn's own estimator checks on SVGPClassifier and SVGPRegressor, with settings small
enough for the test suite (few inducing points, few iterations). The binary-only classifiers (a
Bernoulli likelihood, the mean-field method) say so in their tags, and the mean-field one, which
is full-batch, has no partial_fit."""

import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from pygpfast import SVGPClassifier, SVGPRegressor

SMALL = {"n_inducing": 8, "max_iter": 30}


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@parametrize_with_checks([
    SVGPClassifier(**SMALL),
    SVGPClassifier(likelihood="logit", **SMALL),
    SVGPClassifier(method="mf", **SMALL),
    SVGPRegressor(**SMALL),
])
def test_sklearn_compatible(estimator, check):
    check(estimator)
