"""Likelihoods p(y | f) of GP models and their Gaussian expectations.

A likelihood is declarative: its name and parameters. The per-point work runs in the compiled
core (closed forms where they exist, Gauss-Hermite quadrature otherwise), in OpenMP loops
whose results do not depend on the thread count.

The central quantity is the variational expectation of seed 000, eqs. (21)-(22), for each
point n with marginal q(f_n) = N(mu_n, var_n)::

    value_n = E_{q(f_n)}[log p(y_n | f_n)]

with its derivatives in mu_n and var_n. Parameters are positive; ``theta`` holds their logs
(the unconstrained coordinates that optimisers use).
"""

import numbers

import numpy as np

from . import _core
from ._validation import as_vector

__all__ = ["Likelihood", "Gaussian", "Bernoulli", "Poisson"]

# Codes of pygpfast::likelihoods::LikelihoodType (csrc/include/pygpfast/likelihoods.hpp).
_GAUSSIAN, _BERNOULLI_PROBIT, _BERNOULLI_LOGIT, _POISSON = 0, 1, 2, 3
_LINKS = {"probit": _BERNOULLI_PROBIT, "logit": _BERNOULLI_LOGIT}
_MAX_GH_POINTS = 100


def _check_n_gh(n_gh):
    if (
        not isinstance(n_gh, numbers.Integral)
        or isinstance(n_gh, bool)
        or not 1 <= n_gh <= _MAX_GH_POINTS
    ):
        raise ValueError(
            f"n_gh (Gauss-Hermite points) must be an int between 1 and {_MAX_GH_POINTS}, "
            f"got {n_gh!r}"
        )
    return int(n_gh)


def _check_positive(value, name):
    if (
        not isinstance(value, numbers.Real)
        or isinstance(value, bool)
        or not np.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


class Likelihood:
    """Base class of the likelihoods p(y | f) with a scalar latent function f.

    Subclasses name their positive parameters in ``param_names`` (stored as attributes of the
    same names) and give the compiled core their description in ``_core_args``.

    Attributes
    ----------
    param_names : tuple of str
        Names of the parameters, in the order of ``params`` and ``theta``.
    """

    param_names = ()

    def _core_args(self):
        """(kind, variance, n_gh, num_classes) for the core's functions (num_classes is 0 for
        the likelihoods of one latent function)."""
        raise NotImplementedError

    @property
    def n_params(self):
        """Number of parameters (int)."""
        return len(self.param_names)

    @property
    def params(self):
        """Parameters [n_params] (positive), in the order of ``param_names``; a copy."""
        return np.array([getattr(self, name) for name in self.param_names], dtype=np.float64)

    @params.setter
    def params(self, values):
        values = as_vector(values, "params", size=self.n_params, allow_empty=True)
        for name, value in zip(self.param_names, values):
            setattr(self, name, _check_positive(value, name))

    @property
    def theta(self):
        """Log parameters [n_params]: the unconstrained coordinates, ``params = exp(theta)``."""
        return np.log(self.params)

    @theta.setter
    def theta(self, values):
        self.params = np.exp(as_vector(values, "theta", size=self.n_params, allow_empty=True))

    def _points(self, mu, var, y=None):
        mu = as_vector(mu, "mu")
        var = as_vector(var, "var", size=mu.shape[0])
        if y is None:
            return mu, var
        return as_vector(y, "y", size=mu.shape[0]), mu, var

    def variational_expectations(self, y, mu, var, *, return_param_grad=False):
        """Expected log-likelihood under Gaussian marginals, with its derivatives.

        Parameters
        ----------
        y : array_like [N]
            Observations, in the likelihood's support.
        mu, var : array_like [N]
            Means and variances (>= 0) of the marginals q(f_n) = N(mu_n, var_n).
        return_param_grad : bool, default False
            Also return the derivatives with respect to ``params``.

        Returns
        -------
        value : ndarray [N]
            ``E_q[log p(y_n | f_n)]``.
        d_mu, d_var : ndarray [N]
            Derivatives of ``value`` with respect to ``mu`` and ``var``.
        d_params : ndarray [N, n_params]
            Only when ``return_param_grad``: ``d_params[n, j] = d value_n / d params[j]``
            (multiply by ``params[j]`` for the derivative in ``theta[j]``).

        Raises
        ------
        ValueError
            For non-finite inputs, mismatched lengths, ``var < 0``, or labels outside the
            support (the message names the first bad one).
        """
        y, mu, var = self._points(mu, var, y)
        value, d_mu, d_var, d_variance = _core.variational_expectations(
            *self._core_args(), y, mu, var
        )
        if not return_param_grad:
            return value, d_mu, d_var
        # The core's only likelihood parameter is the Gaussian variance.
        d_params = d_variance[:, None] if self.n_params else np.empty((y.shape[0], 0))
        return value, d_mu, d_var, d_params

    def predict_mean_and_var(self, mu, var):
        """Mean and variance of y under ``p(y) = integral p(y | f) N(f | mu, var) df``.

        Parameters
        ----------
        mu, var : array_like [N]
            Means and variances (>= 0) of the latent function's marginals.

        Returns
        -------
        mean, variance : ndarray [N]
        """
        mu, var = self._points(mu, var)
        return _core.predict_mean_and_var(*self._core_args(), mu, var)

    def predict_log_density(self, y, mu, var):
        """Log predictive density ``log integral p(y_n | f) N(f | mu_n, var_n) df``.

        Parameters
        ----------
        y : array_like [N]
            Observations, in the likelihood's support.
        mu, var : array_like [N]
            Means and variances (>= 0) of the latent function's marginals.

        Returns
        -------
        log_density : ndarray [N]
        """
        y, mu, var = self._points(mu, var, y)
        return _core.predict_log_density(*self._core_args(), y, mu, var)

    def __repr__(self):
        args = ", ".join(f"{name}={value!r}" for name, value in self._repr_args().items())
        return f"{type(self).__name__}({args})"

    def _repr_args(self):
        return {name: getattr(self, name) for name in self.param_names}


class Gaussian(Likelihood):
    """Gaussian noise, ``p(y | f) = N(y | f, variance)``; closed-form expectations.

    Parameters
    ----------
    variance : float, default 1.0
        Noise variance (positive); the likelihood's one parameter.
    """

    param_names = ("variance",)

    def __init__(self, variance=1.0):
        self.variance = _check_positive(variance, "variance")

    def _core_args(self):
        return (_GAUSSIAN, self.variance, 1, 0)


class Bernoulli(Likelihood):
    """Binary labels y in {0, 1}, ``p(y = 1 | f) = Phi(f)`` (probit) or ``sigmoid(f)`` (logit).

    Expectations use Gauss-Hermite quadrature; the derivatives come from the same rule by
    Bonnet's and Price's theorems. The probit predictive mean is exact,
    ``Phi(mu / sqrt(1 + var))``. No parameters.

    Parameters
    ----------
    link : {"probit", "logit"}, default "probit"
    n_gh : int, default 20
        Gauss-Hermite points (1 to 100).
    """

    def __init__(self, link="probit", n_gh=20):
        if link not in _LINKS:
            raise ValueError(f"link must be 'probit' or 'logit', got {link!r}")
        self.link = link
        self.n_gh = _check_n_gh(n_gh)

    def _core_args(self):
        return (_LINKS[self.link], 1.0, self.n_gh, 0)

    def _repr_args(self):
        return {"link": self.link, "n_gh": self.n_gh}


class Poisson(Likelihood):
    """Counts y in {0, 1, 2, ...} with rate ``exp(f)``: ``p(y | f) = exp(y f - e^f) / y!``.

    Variational expectations and predictive moments are closed form; the log predictive
    density uses Gauss-Hermite quadrature in log space. No parameters.

    Parameters
    ----------
    n_gh : int, default 20
        Gauss-Hermite points (1 to 100) for ``predict_log_density``. The quadrature error
        grows with the latent variance: with 20 points the log density is within about 4e-5
        (relative) at ``var = 0.5`` but 2e-3 at ``var = 1``; 100 points reach 1e-6 at
        ``var = 2``.
    """

    def __init__(self, n_gh=20):
        self.n_gh = _check_n_gh(n_gh)

    def _core_args(self):
        return (_POISSON, 1.0, self.n_gh, 0)

    def _repr_args(self):
        return {"n_gh": self.n_gh}
