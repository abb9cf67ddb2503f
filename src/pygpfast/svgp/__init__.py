"""Sparse variational Gaussian processes (Hensman, Matthews & Ghahramani 2015; Hensman,
Fusi & Lawrence 2013): the model :class:`SVGP` and the estimators :class:`SVGPClassifier` and
:class:`SVGPRegressor`."""

from ._estimators import SVGP, SVGPClassifier, SVGPRegressor

__all__ = ["SVGP", "SVGPClassifier", "SVGPRegressor"]
