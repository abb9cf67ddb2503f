"""Concave variational inference for full GPs (Khan, Mohamed & Murphy 2012): the estimators
:class:`VGPClassifier` and :class:`VGPPoissonRegressor`, and the inference for a given prior
covariance (:func:`infer`, :func:`oa_objective`, :class:`LocalBound`)."""

from ._estimators import VGPClassifier, VGPPoissonRegressor
from ._inference import InferenceResult, LocalBound, infer, oa_objective

__all__ = ["InferenceResult", "LocalBound", "VGPClassifier", "VGPPoissonRegressor", "infer",
           "oa_objective"]
