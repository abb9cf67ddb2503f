"""Importance-sampled mixtures of Gaussian-process experts (IS-MOE; Zhang & Williamson, seed
003): :class:`ISMOERegressor`, :class:`ISMOEClassifier`."""

from ._estimators import ISMOEClassifier, ISMOERegressor

__all__ = ["ISMOEClassifier", "ISMOERegressor"]
