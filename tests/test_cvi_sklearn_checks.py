"""scikit-learn's own estimator checks on VGPClassifier (binary logit, and multinomial for any
number of classes) with the kernel held fixed, so that the suite stays fast. (VGPPoissonRegressor
takes counts only, which the regressor checks do not provide.)"""

import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from pygpfast import VGPClassifier


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@parametrize_with_checks([
    VGPClassifier(optimize_hyperparameters=False, inner_max_iter=50),
    VGPClassifier("multinomial", optimize_hyperparameters=False, inner_max_iter=50),
])
def test_sklearn_compatible(estimator, check):
    check(estimator)
