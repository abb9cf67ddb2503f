"""Priors on positive hyperparameters, for fits at the MAP point.

A prior is attached to a hyperparameter by name, on the kernel leaf (or likelihood) that holds
it::

    k = RBF(lengthscale=[1.0, 2.0], priors={"lengthscale": LogNormal(0.0, 1.7)})
    k.set_params(priors__variance=LogNormal(0.0, 1.7))   # scikit-learn's protocol

and ``Kernel.log_prior()`` / ``Kernel.grad_log_prior()`` sum them over the kernel's tree, in the
layout of :attr:`pygpfast.kernels.Kernel.theta`. A hyperparameter without a prior (or with
``None``) is flat.

Convention. Optimisers move theta = log p, so a prior here is a density **on theta**:
:meth:`LogNormal.log_density` is ``log N(theta | loc, scale)``. As a density on p itself
(the usual log-normal), that is the log-normal density times the Jacobian |dp/dtheta| = p. Its
maximum is at p = exp(loc). (A library that puts the log-normal density on p, as GPyTorch and
BoTorch do, maximises ``log N(theta | loc, scale) - theta``, which is
``log N(theta | loc - scale^2, scale)`` up to a constant: the same MAP point as
``LogNormal(loc - scale^2, scale)`` here.)
"""

import numpy as np

__all__ = ["LogNormal", "Prior"]

_HALF_LOG_2PI = 0.5 * np.log(2.0 * np.pi)


class Prior:
    """Base class of the priors on a positive hyperparameter p, as densities on theta = log p.

    Subclasses implement :meth:`log_density` and :meth:`grad` (elementwise, for theta a float or
    an array [n]: one entry per entry of a per-dimension hyperparameter).
    """

    def log_density(self, theta):
        """log density of theta = log p (elementwise, the shape of theta)."""
        raise NotImplementedError

    def grad(self, theta):
        """d log_density / d theta (elementwise, the shape of theta)."""
        raise NotImplementedError

    def _check_size(self, size, name):
        """ValueError unless the prior applies to a hyperparameter of `size` entries."""


def _as_location(value, name):
    """A finite float, or a finite non-empty 1-D float64 array (a copy)."""
    try:
        if np.asarray(value).dtype == bool:
            raise TypeError("a bool is not a number here")
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a finite number or 1-D array, got {value!r}") from e
    if arr.ndim > 1 or arr.size == 0 or not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be a finite number or a non-empty 1-D array of finite "
                         f"numbers, got {value!r}")
    return float(arr) if arr.ndim == 0 else arr.copy()


class LogNormal(Prior):
    """Log-normal prior on a positive hyperparameter p: theta = log p ~ N(loc, scale^2).

    ``log_density(theta) = log N(theta | loc, scale)``, the density of theta (see the module
    docstring for the Jacobian convention); its maximum is at p = exp(loc).

    Parameters
    ----------
    loc : float or array_like [n]
        Mean of log p; an array gives one per entry of a per-dimension hyperparameter (ARD
        lengthscales) and must have its length.
    scale : float or array_like [n]
        Standard deviation of log p, > 0.
    """

    def __init__(self, loc=0.0, scale=1.0):
        self.loc = _as_location(loc, "LogNormal.loc")
        scale = _as_location(scale, "LogNormal.scale")
        if np.any(np.asarray(scale) <= 0):
            raise ValueError(f"LogNormal.scale must be > 0, got {scale!r}")
        self.scale = scale

    def log_density(self, theta):
        z = (np.asarray(theta, dtype=np.float64) - self.loc) / self.scale
        return -0.5 * z * z - np.log(self.scale) - _HALF_LOG_2PI

    def grad(self, theta):
        return -(np.asarray(theta, dtype=np.float64) - self.loc) / (self.scale * self.scale)

    def _check_size(self, size, name):
        for what in ("loc", "scale"):
            value = getattr(self, what)
            if np.ndim(value) and len(value) != size:
                raise ValueError(f"the prior on {name} has {len(value)} values of {what} but "
                                 f"{name} has {size} entries; give a scalar or one per entry")

    def __repr__(self):
        def fmt(v):
            return repr(v.tolist()) if isinstance(v, np.ndarray) else repr(v)
        return f"LogNormal(loc={fmt(self.loc)}, scale={fmt(self.scale)})"

    def __eq__(self, other):
        return (type(other) is type(self) and np.array_equal(self.loc, other.loc)
                and np.array_equal(self.scale, other.scale))

    def __hash__(self):
        return hash((type(self), np.asarray(self.loc).tobytes(), np.asarray(self.scale).tobytes()))


def check_priors(priors, names, owner):
    """A validated copy of `priors` (a dict of hyperparameter name -> Prior or None, or None for
    none) for an object whose hyperparameters are `names`; ValueError naming what to change."""
    if priors is None:
        return {}
    if not isinstance(priors, dict):
        raise ValueError(f"{owner}.priors must be a dict of hyperparameter name -> Prior (or "
                         f"None), got {priors!r}")
    out = {}
    for name, prior in priors.items():
        if name not in names:
            raise ValueError(f"{owner}.priors names {name!r}, which is not one of its "
                             f"hyperparameters {list(names)}")
        if prior is not None and not isinstance(prior, Prior):
            raise ValueError(f"{owner}.priors[{name!r}] must be a pygpfast.priors.Prior (e.g. "
                             f"LogNormal(loc, scale)) or None, got {prior!r}")
        out[name] = prior
    return out


def log_prior(blocks, theta):
    """(sum of the log densities, gradient [n]) over ``blocks``: a list of (size, Prior or None,
    name) in the layout of theta [n]."""
    theta = np.asarray(theta, dtype=np.float64)
    total, grad, start = 0.0, np.zeros(theta.size), 0
    for size, prior, name in blocks:
        stop = start + size
        if prior is not None:
            prior._check_size(size, name)
            chunk = theta[start:stop]
            total += float(np.sum(prior.log_density(chunk)))
            grad[start:stop] = prior.grad(chunk)
        start = stop
    if start != theta.size:
        raise ValueError(f"theta has {theta.size} entries, the priors describe {start}")
    return total, grad


def is_flat(blocks):
    """Whether every block of ``blocks`` (as for :func:`log_prior`) is flat (no prior)."""
    return all(prior is None for _, prior, _ in blocks)
