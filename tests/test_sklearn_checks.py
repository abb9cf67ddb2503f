"""scikit-learn's own estimator checks on SVGPClassifier and SVGPRegressor, with settings small
enough for the test suite (few inducing points, few iterations)."""

import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from pygpfast import SVGPClassifier, SVGPRegressor

SMALL = {"n_inducing": 8, "max_iter": 30}


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@parametrize_with_checks([SVGPClassifier(**SMALL), SVGPRegressor(**SMALL)])
def test_sklearn_compatible(estimator, check):
    check(estimator)
