"""Informative vector machines (Lawrence, Seeger & Herbrich 2003; Seeger & Jordan 2004)."""

from ._estimators import IVMClassifier

__all__ = ["IVMClassifier"]
