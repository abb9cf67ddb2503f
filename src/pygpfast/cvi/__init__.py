"""Concave variational inference for full GPs (Khan, Mohamed & Murphy 2012)."""

from ._estimators import (InferenceResult, LocalBound, VGPClassifier, VGPPoissonRegressor, infer,
                          oa_objective)

__all__ = ["InferenceResult", "LocalBound", "VGPClassifier", "VGPPoissonRegressor", "infer",
           "oa_objective"]
