"""Likelihoods p(y | f) of GP models and their Gaussian expectations.

A likelihood is declarative: its name and parameters. The per-point work runs in the compiled
core (closed forms where they exist, Gauss-Hermite quadrature otherwise), in OpenMP loops
whose results do not depend on the thread count.

The central quantity is the variational expectation of Hensman, Matthews & Ghahramani 2015, eqs. (21)-(22), for each
point n with marginal q(f_n) = N(mu_n, var_n)::

    value_n = E_{q(f_n)}[log p(y_n | f_n)]

with its derivatives in mu_n and var_n. Most likelihoods have one latent function per point
(mu, var [N]); :class:`Softmax` and :class:`RobustMax` have C of them with independent marginals
(mu, var [N, C]).
Parameters are positive; ``theta`` holds their logs (the unconstrained coordinates that
optimisers use).
"""

import numbers
import warnings

import numpy as np

from . import _core
from . import priors as _priors
from ._validation import as_matrix, as_vector
from .kernels import hyper_bounds
from .exceptions import NumericalWarning

__all__ = ["Likelihood", "Gaussian", "Bernoulli", "Poisson", "Softmax", "RobustMax"]

# Codes of pygpfast::likelihoods::LikelihoodType (csrc/include/pygpfast/likelihoods.hpp).
_GAUSSIAN, _BERNOULLI_PROBIT, _BERNOULLI_LOGIT, _POISSON, _SOFTMAX, _ROBUST_MAX = 0, 1, 2, 3, 4, 5
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


def _check_label_noise(value):
    if (
        not isinstance(value, numbers.Real)
        or isinstance(value, bool)
        or not 0.0 <= value < 0.5
    ):
        raise ValueError(f"label_noise must be a number in [0, 0.5), got {value!r}")
    return float(value)


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
    """Base class of the likelihoods p(y | f).

    Subclasses name their positive parameters in ``param_names`` (stored as attributes of the
    same names) and give the compiled core their description in ``_core_args``. The latent
    values of N points are [N] arrays when ``n_latent`` is 1 and [N, n_latent] arrays
    otherwise (one column per latent function).

    Attributes
    ----------
    param_names : tuple of str
        Names of the parameters, in the order of ``params`` and ``theta``.
    """

    param_names = ()

    @property
    def n_latent(self):
        """Number of latent functions per point (int): 1 here, C for the multi-class likelihoods."""
        return 1

    def _core_args(self):
        """(kind, variance, n_gh, n_classes) for the core's functions (n_classes is 0 for
        the likelihoods of one latent function)."""
        raise NotImplementedError

    def _check_labels(self, y):
        """ValueError naming the first entry of y [N] (float64) outside the support: the core's
        check of variational_expectations, for callers that pass y in parts."""
        _core.likelihoods.check_labels(*self._core_args(), y)

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
            setattr(self, name, self._check_param(name, value))

    def _check_param(self, name, value):
        """`value` as the float of parameter `name`; ValueError outside its range."""
        return _check_positive(value, name)

    def theta_bounds(self):
        """Box constraints (lower [n_params], upper [n_params]) of a search over :attr:`theta`
        from its current value (:func:`pygpfast.kernels.hyper_bounds`, capped where a
        parameter has an upper limit)."""
        return hyper_bounds(self.theta)

    @property
    def theta(self):
        """Log parameters [n_params]: the unconstrained coordinates, ``params = exp(theta)``."""
        return np.log(self.params)

    @theta.setter
    def theta(self, values):
        values = as_vector(values, "theta", size=self.n_params, allow_empty=True)
        with np.errstate(over="ignore"):
            params = np.exp(values)
        if not np.all(np.isfinite(params) & (params > 0)):
            raise ValueError(f"exp(theta) must be finite and > 0, got theta = {values}")
        self.params = params

    @property
    def priors(self):
        """Priors on the parameters (dict of name -> :class:`pygpfast.priors.Prior` or None, see
        :mod:`pygpfast.priors`); a parameter not named has none."""
        return self.__dict__.get("_priors", {})

    @priors.setter
    def priors(self, value):
        self._priors = _priors.check_priors(value, self.param_names, type(self).__name__)

    def _prior_blocks(self):
        return [(1, self.priors.get(name), f"{type(self).__name__}.{name}")
                for name in self.param_names]

    @property
    def has_priors(self):
        """Whether any parameter has a prior (bool)."""
        return any(prior is not None for prior in self.priors.values())

    def log_prior(self, theta=None):
        """Sum of the parameters' log prior densities on theta (0.0 without priors), at `theta`
        [n_params] (default: :attr:`theta`)."""
        return _priors.log_prior(self._prior_blocks(), self.theta if theta is None else theta)[0]

    def grad_log_prior(self, theta=None):
        """Gradient of :meth:`log_prior` with respect to theta [n_params]."""
        return _priors.log_prior(self._prior_blocks(), self.theta if theta is None else theta)[1]

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
        mu, var : array_like [N] (or [N, n_latent] when ``n_latent > 1``)
            Means and variances (>= 0) of the marginals q(f_n) = N(mu_n, var_n) (independent
            across latent functions).
        return_param_grad : bool, default False
            Also return the derivatives with respect to ``params``.

        Returns
        -------
        value : ndarray [N]
            ``E_q[log p(y_n | f_n)]``.
        d_mu, d_var : ndarray, the shape of ``mu``
            Derivatives of ``value_n`` with respect to ``mu`` and ``var`` (entry by entry).
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
        value, d_mu, d_var, d_param = _core.likelihoods.variational_expectations(
            *self._core_args(), y, mu, var
        )
        if not return_param_grad:
            return value, d_mu, d_var
        # The core's one likelihood parameter: a Gaussian variance, or a learned label noise.
        d_params = d_param[:, None] if self.n_params else np.empty((y.shape[0], 0))
        return value, d_mu, d_var, d_params

    def predict_mean_and_var(self, mu, var):
        """Mean and variance of y under ``p(y) = integral p(y | f) N(f | mu, var) df``.

        Parameters
        ----------
        mu, var : array_like [N] (or [N, n_latent])
            Means and variances (>= 0) of the latent functions' marginals.

        Returns
        -------
        mean, variance : ndarray, the shape of ``mu``
            For the multi-class likelihoods, the class probabilities P(y = c) and
            P(y = c)(1 - P(y = c)). Where a moment exceeds float64 (a Poisson rate's
            exp(mu + var / 2) past about 1.8e308) it is inf, with a NumericalWarning.
        """
        mu, var = self._points(mu, var)
        mean, variance = _core.likelihoods.predict_mean_and_var(*self._core_args(), mu, var)
        over = ~(np.isfinite(mean) & np.isfinite(variance))
        if over.any():
            warnings.warn(
                f"{type(self).__name__}: the predictive mean or variance overflows float64 at "
                f"{int(over.sum())} of {over.size} points (latent mean up to {mu[over].max():.4g}, "
                f"latent variance up to {var[over].max():.4g}); they are inf there. Latent "
                "moments that large come from a kernel variance too large for the data: use a "
                "smaller one (priors or bounds that keep it moderate).",
                NumericalWarning, stacklevel=2)
        return mean, variance

    def predict_log_density(self, y, mu, var):
        """Log predictive density ``log integral p(y_n | f) N(f | mu_n, var_n) df``.

        Parameters
        ----------
        y : array_like [N]
            Observations, in the likelihood's support.
        mu, var : array_like [N] (or [N, n_latent])
            Means and variances (>= 0) of the latent functions' marginals.

        Returns
        -------
        log_density : ndarray [N]
        """
        y, mu, var = self._points(mu, var, y)
        return _core.likelihoods.predict_log_density(*self._core_args(), y, mu, var)

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
    priors : dict or None, default None
        ``{"variance": prior}`` (:mod:`pygpfast.priors`) for fits at the MAP point; None: flat.
    """

    param_names = ("variance",)

    def __init__(self, variance=1.0, priors=None):
        self.variance = _check_positive(variance, "variance")
        self.priors = priors

    def _core_args(self):
        return (_GAUSSIAN, self.variance, 1, 0)


class _LearnedNoise:
    """The label-noise probability of Bernoulli and RobustMax as a learned parameter: named in
    ``param_names`` when learned (none otherwise), in (0, ``_NOISE_MAX``), its search box capped
    just below that limit."""

    #: The probability's name (the attribute and its prior's key).
    _NOISE = ""

    def _init_noise(self, learn, priors):
        if not isinstance(learn, (bool, np.bool_)):
            raise ValueError(f"learn_{self._NOISE} must be True or False, got {learn!r}")
        if learn and not getattr(self, self._NOISE) > 0.0:
            raise ValueError(f"learn_{self._NOISE}=True needs {self._NOISE} > 0 to start from "
                             f"(it is learned in log space), got {getattr(self, self._NOISE)!r}")
        self.param_names = (self._NOISE,) if learn else ()
        self.priors = priors

    def _check_param(self, name, value):
        if (not isinstance(value, numbers.Real) or isinstance(value, bool)
                or not 0.0 < value < self._NOISE_MAX):
            raise ValueError(f"{name} must be a number in (0, {self._NOISE_MAX:g}), got {value!r}")
        return float(value)

    def theta_bounds(self):
        lower, upper = hyper_bounds(self.theta)
        return lower, np.minimum(upper, np.log(self._NOISE_MAX) + np.log1p(-1e-9))


class Bernoulli(_LearnedNoise, Likelihood):
    """Binary labels y in {0, 1}, ``p(y = 1 | f) = Phi(f)`` (probit) or ``sigmoid(f)`` (logit),
    optionally robust to mislabelled points.

    With ``label_noise`` epsilon > 0 each label is, with probability 2 epsilon, drawn at random:
    ``p(y | f) = epsilon + (1 - 2 epsilon) p0(y | f)`` with p0 the link's (Kim & Ghahramani 2008,
    "Outlier robust Gaussian process classification"). The likelihood then never falls below
    epsilon, so a point on the wrong side of the boundary costs at most ``-log epsilon`` nats,
    where the plain link's cost grows without bound (quadratically in f for the probit).
    GPflow's probit, clipped to [1e-3, 1 - 1e-3], is close to epsilon = 1e-3.

    Expectations use Gauss-Hermite quadrature, computed in log space (finite however small p0
    is); the derivatives come from the same rule by Bonnet's and Price's theorems, and so does
    the derivative in epsilon. The predictive mean is exact for the probit, ``epsilon + (1 - 2
    epsilon) Phi(mu / sqrt(1 + var))``.

    Parameters
    ----------
    link : {"probit", "logit"}, default "probit"
    n_gh : int, default 20
        Gauss-Hermite points (1 to 100).
    label_noise : float, default 0.0
        epsilon in [0, 0.5): the probability floor of each label; 0 is the plain link. With
        ``learn_label_noise``, the starting value, > 0.
    learn_label_noise : bool, default False
        Whether epsilon is a parameter (``param_names == ("label_noise",)``), learned with the
        hyperparameters in log space, its search box capped below 0.5; otherwise the
        likelihood has no parameters and epsilon stays fixed.
    priors : dict or None, default None
        ``{"label_noise": prior}`` (:mod:`pygpfast.priors`, a density on log epsilon) when
        learned; None: flat.
    """

    _NOISE = "label_noise"
    _NOISE_MAX = 0.5

    def __init__(self, link="probit", n_gh=20, label_noise=0.0, learn_label_noise=False,
                 priors=None):
        if not isinstance(link, str) or link not in _LINKS:
            raise ValueError(f"link must be 'probit' or 'logit', got {link!r}")
        self.link = link
        self.n_gh = _check_n_gh(n_gh)
        self.label_noise = _check_label_noise(label_noise)
        self._init_noise(learn_label_noise, priors)

    @property
    def learn_label_noise(self):
        """Whether epsilon is learned (bool)."""
        return bool(self.param_names)

    def _core_args(self):
        return (_LINKS[self.link], self.label_noise, self.n_gh, 0)

    def _repr_args(self):
        args = {"link": self.link, "n_gh": self.n_gh}
        if self.label_noise:
            args["label_noise"] = self.label_noise
        if self.param_names:
            args["learn_label_noise"] = True
        return args


class Poisson(Likelihood):
    """Counts y in {0, 1, 2, ...} with rate ``exp(f)``: ``p(y | f) = exp(y f - e^f) / y!``.

    Non-integer targets y >= 0 are taken by the same formula,
    ``log p(y | f) = y f - e^f - lgamma(y + 1)``, as scikit-learn's Poisson models take them: a
    quasi-likelihood (not normalised over real y) whose derivatives in f, ``y - e^f``, do not
    involve lgamma.

    Variational expectations and predictive moments are closed form; the log predictive
    density uses Gauss-Hermite quadrature in log space. No parameters.

    Far tails: every output is finite for log rates ``mu + var / 2`` up to log(max float64)
    ~ 709.78 (and however far below; a latent mean of -1e5 with variance 1e3 included), the
    predictive variance while ``2 (mu + var)`` is. Beyond that the rate itself overflows: the
    expected log-likelihood, its derivatives and the log predictive density are -inf and the
    predictive mean and variance +inf (never NaN).

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


class _MultiClass(Likelihood):
    """Labels y in {0, ..., C - 1} with one latent function per class (``n_latent = n_classes``);
    the marginals of the C latent values of a point are independent, ``f_c ~ N(mu_c, var_c)``
    (as for C latent GPs with independent q(u_c) sharing inducing inputs)."""

    def __init__(self, n_classes, n_gh=20):
        if (
            not isinstance(n_classes, numbers.Integral)
            or isinstance(n_classes, bool)
            or n_classes < 2
        ):
            raise ValueError(f"n_classes must be an int >= 2, got {n_classes!r}")
        self.n_classes = int(n_classes)
        self.n_gh = _check_n_gh(n_gh)

    @property
    def n_latent(self):
        """Number of latent functions per point: ``n_classes``."""
        return self.n_classes

    def _points(self, mu, var, y=None):
        shape = f"[N, {self.n_classes}] (one column per class)"
        mu = as_matrix(mu, "mu")
        if mu.shape[1] != self.n_classes:
            raise ValueError(f"mu must have shape {shape}, got {mu.shape}")
        var = as_matrix(var, "var")
        if var.shape != mu.shape:
            raise ValueError(f"var must have the shape of mu, {mu.shape}, got {var.shape}")
        if y is None:
            return mu, var
        return as_vector(y, "y", size=mu.shape[0]), mu, var

    def predict_proba(self, mu, var):
        """Class probabilities ``P(y = c)`` [N, C]; rows sum to 1.

        Parameters
        ----------
        mu, var : array_like [N, C]
            Means and variances (>= 0) of the latent functions' marginals.

        Returns
        -------
        proba : ndarray [N, C]
        """
        return self.predict_mean_and_var(mu, var)[0]

    def predict_log_proba(self, mu, var):
        """``log P(y = c)`` [N, C].

        Parameters
        ----------
        mu, var : array_like [N, C]
            Means and variances (>= 0) of the latent functions' marginals.

        Returns
        -------
        log_proba : ndarray [N, C]
        """
        mu, var = self._points(mu, var)
        return _core.likelihoods.predict_log_class_probabilities(*self._core_args(), mu, var)

class Softmax(_MultiClass):
    """Multi-class labels y in {0, ..., C - 1}, ``p(y = c | f) = exp(f_c) / sum_d exp(f_d)``.

    One latent function per class (``n_latent = n_classes``), with independent marginals
    ``f_c ~ N(mu_c, var_c)``. No parameters.

    The C-dimensional expectation ``E[log softmax_y(f)] = mu_y - E[log sum_c exp(f_c)]`` is
    reduced to one-dimensional ones by Frullani's integral
    ``log S = integral_0^inf (e^-t - e^-tS) dt / t``: with ``S = sum_c exp(f_c)`` and
    independent f_c, ``E[e^-tS]`` is the product over classes of ``E[exp(-t e^{f_c})]``, each
    taken by ``n_gh``-point Gauss-Hermite quadrature, and the integral over ``log t`` by the
    trapezoidal rule (step 1/2, spectrally accurate) with the control variate ``e^{-tA}``,
    ``A`` the rule's ``E[S]``, which makes ``var -> 0`` exact (``log softmax_y(mu)``). Class
    probabilities ``E[softmax_c(f)]`` come from the same sums, in log space. Everything is
    deterministic: the derivatives are exact for the computed value, so the ELBO is smooth for
    L-BFGS. Cost per point: about 25 to 60 times ``C * n_gh`` exponentials for latent variances
    up to about 10 (see ``csrc/include/pygpfast/softmax.hpp``).

    Accuracy is set by ``n_gh`` and the latent variances; the outer rule's floor is about 1e-8
    in values and 1e-7 in gradients and probabilities. On the marginals of softmax SVGPs fitted
    to USPS (latent variances up to 12) the default's largest errors were 4e-8 in the value and
    1.4e-7 in gradients and class probabilities; on glass (variances up to 9) 2e-5 and 5e-5
    (``bench/python/bench_softmax.py``, ``bench/README.md``). A quasi-Monte-Carlo rule with 4096
    points was 10^2 to 10^5 times less accurate there. Above latent variance 10 the
    Gauss-Hermite rule no longer resolves ``exp(-t e^f)`` (errors of 2.5e-3 at variance 30 and
    4e-2 at 1000 against Monte Carlo): a point with such a class takes ``E[exp(-t e^{f_c})]``
    in its Gumbel form ``E_W[Phi((W - log t - mu_c) / sqrt(var_c))]`` (W standard Gumbel-min,
    a 20-point Gauss rule for its density), accurate to the outer rule's floor at any variance.
    A point whose classes all have variances above 10 costs about 5 times one below 10,
    whatever the variances (1e-14 relative in the value at 10^12), as long as they lie within
    a factor of about 2e8 of each other (the grid's step follows the narrowest class across the
    widest one's range; a point beyond that is refused, ValueError); one that mixes classes
    below and above 10 costs more as the largest variance grows (150 times at 1000), and one
    with variances beyond ~1e7 beside a class below 10 is refused (ValueError).

    Parameters
    ----------
    n_classes : int
        Number of classes C (at least 2).
    n_gh : int, default 20
        Gauss-Hermite points per class (1 to 100).
    """

    def _core_args(self):
        return (_SOFTMAX, 1.0, self.n_gh, self.n_classes)

    def predict_log_proba(self, mu, var):
        """``log P(y = c)`` [N, C], computed in log space: finite however far class c lies
        below the others (``log(predict_proba)`` is -inf there). At points with a latent
        variance above 10, a class below 1e-8 is recomputed by tilting (exact in log space,
        ~0.3 ms a class for C = 10), as in :meth:`predict_log_density`; ``predict_proba``
        keeps the faster value, whose error there is below 1e-12 absolute.

        Parameters
        ----------
        mu, var : array_like [N, C]
            Means and variances (>= 0) of the latent functions' marginals.

        Returns
        -------
        log_proba : ndarray [N, C]
        """
        return super().predict_log_proba(mu, var)

    def _repr_args(self):
        return {"n_classes": self.n_classes, "n_gh": self.n_gh}


class RobustMax(_LearnedNoise, _MultiClass):
    """Multi-class labels y in {0, ..., C - 1} by the robust max (Hernandez-Lobato,
    Hernandez-Lobato & Dupont 2011, "Robust multi-class Gaussian process classification"): the
    label is the class of the largest latent value with probability ``1 - epsilon``, and any
    other class with ``epsilon / (C - 1)``::

        p(y | f) = 1 - epsilon          if y = argmax_c f_c
                   epsilon / (C - 1)    otherwise.

    One latent function per class; the marginals of a point's C latent values are independent,
    ``f_c ~ N(mu_c, var_c)`` (as for C latent GPs with independent q(u_c) sharing inducing
    inputs). The expected log-likelihood is ``log(epsilon / (C - 1)) + A_y (log(1 - epsilon) -
    log(epsilon / (C - 1)))`` with ``A_y = P(f_y > f_c for all c != y)``, a one-dimensional
    integral over f_y of ``prod_{c != y} Phi((f_y - mu_c) / sqrt(var_c))``, taken by ``n_gh``-point
    Gauss-Hermite quadrature (GPflow's ``RobustMax`` takes it the same way); the derivatives are
    exact for that sum. A point's cost is about ``n_gh (C - 1)`` evaluations of ``log Phi``, far
    below the softmax's. The quadrature resolves the product of Phi's as long as the other
    classes' standard deviations are not much narrower than the node spacing ``sqrt(2 var_y)``;
    the error grows as they shrink below it (a class with ``var_c = 0`` is a step).

    Predictive probabilities are ``P(y = c) = epsilon / (C - 1) + (1 - epsilon - epsilon / (C -
    1)) A_c`` with the A_c rescaled to sum to 1 (their quadrature error, which the rescaling
    spreads over the classes); they lie in ``[epsilon / (C - 1), 1 - epsilon]``, so a confident
    mistake costs at most ``log((C - 1) / epsilon)`` nats. The derivative in epsilon comes
    from the same rule.

    Parameters
    ----------
    n_classes : int
        Number of classes C (at least 2).
    epsilon : float, default 1e-3
        Probability of a label other than the latent argmax, in ``(0, 1 - 1/C)`` (GPflow's
        default is 1e-3, fixed). With ``learn_epsilon``, the starting value.
    n_gh : int, default 20
        Gauss-Hermite points over the label's latent value (1 to 100).
    learn_epsilon : bool, default False
        Whether epsilon is a parameter (``param_names == ("epsilon",)``), learned with the
        hyperparameters in log space, its search box capped below 1 - 1/C; otherwise fixed.
    priors : dict or None, default None
        ``{"epsilon": prior}`` (:mod:`pygpfast.priors`, a density on log epsilon) when learned;
        None: flat.
    """

    _NOISE = "epsilon"

    def __init__(self, n_classes, epsilon=1e-3, n_gh=20, learn_epsilon=False, priors=None):
        super().__init__(n_classes, n_gh)
        self.epsilon = self._check_param("epsilon", epsilon)
        self._init_noise(learn_epsilon, priors)

    @property
    def _NOISE_MAX(self):  # (1 - 1/C: every class equally likely whatever f)
        return 1.0 - 1.0 / self.n_classes

    @property
    def learn_epsilon(self):
        """Whether epsilon is learned (bool)."""
        return bool(self.param_names)

    def _core_args(self):
        return (_ROBUST_MAX, self.epsilon, self.n_gh, self.n_classes)

    def _repr_args(self):
        args = {"n_classes": self.n_classes, "epsilon": self.epsilon, "n_gh": self.n_gh}
        if self.param_names:
            args["learn_epsilon"] = True
        return args
