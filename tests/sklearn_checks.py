"""scikit-learn's ``parametrize_with_checks`` with its cases handed to pytest as a list.
scikit-learn 1.6 hands ``pytest.mark.parametrize`` a generator, which pytest 9 deprecates
(PytestRemovedIn10Warning, an error under the suite's filterwarnings); later versions pass a
list."""

import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks as _parametrize_with_checks


def parametrize_with_checks(estimators):
    mark = _parametrize_with_checks(estimators)
    argnames, argvalues = mark.args
    return pytest.mark.parametrize(argnames, list(argvalues), **mark.kwargs)
