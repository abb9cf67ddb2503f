"""Sparse variational Gaussian processes (Hensman, Matthews & Ghahramani 2015; Hensman,
Fusi & Lawrence 2013): the model :class:`SVGP` and the estimators :class:`SVGPClassifier` and
:class:`SVGPRegressor`."""

from ._estimators import SVGPClassifier, SVGPRegressor
from ._model import SVGP

__all__ = ["SVGP", "SVGPClassifier", "SVGPRegressor"]
