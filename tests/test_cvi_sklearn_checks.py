"""scikit-learn's own estimator checks on VGPClassifier (binary logit, and multinomial for any
number of classes) and VGPPoissonRegressor with the kernel held fixed, so that the suite stays
fast. VGPPoissonRegressor declares positive-only targets, so the checks give it y > 0 (real
values, which it takes as scikit-learn's Poisson models do)."""

import pytest
from sklearn.utils import get_tags

from pygpfast import VGPClassifier, VGPPoissonRegressor
from sklearn_checks import parametrize_with_checks


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@parametrize_with_checks([
    VGPClassifier(optimize_hyperparameters=False, inner_max_iter=50),
    VGPClassifier(likelihood="softmax", optimize_hyperparameters=False, inner_max_iter=50),
    VGPPoissonRegressor(optimize_hyperparameters=False, inner_max_iter=50),
])
def test_sklearn_compatible(estimator, check):
    check(estimator)


def test_poisson_regressor_declares_positive_targets():
    assert get_tags(VGPPoissonRegressor()).target_tags.positive_only
    assert not get_tags(VGPClassifier()).target_tags.positive_only
