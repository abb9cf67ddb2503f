"""The SVGP model: kernel, likelihood, inducing inputs Z and q(u) = N(m, S) per latent function,
with the ELBO of Hensman, Matthews & Ghahramani (2015, eq. 21) and all its gradients from one
call into the compiled core per (mini)batch."""

import numpy as np
from scipy.linalg import cho_solve

from .. import _core
from .._validation import as_matrix, core_array
from ..exceptions import warn_at_caller, warn_inducing_jitter

__all__ = ["SVGP"]


class SVGP:
    """The SVGP model: kernel, likelihood, inducing inputs and q(u), with the ELBO.

    Parameters
    ----------
    kernel : pygpfast.kernels.Kernel
        Shared by the L latent functions.
    likelihood : pygpfast.likelihoods.Likelihood
        L = its ``n_latent`` latent functions (the number of classes for Softmax, else 1).
    Z : array_like [M, D]
        Inducing inputs.
    q_mu : array_like [M] (L = 1) or [M, L], optional
        Means of q(u_l) (of q(v_l) when whitened); zeros by default.
    q_sqrt : array_like [M, M] (L = 1) or [L, M, M], optional
        Lower-triangular square roots of the covariances of q(u_l) (of q(v_l) when
        whitened). Default: the prior, I when whitened, chol(Kzz) otherwise.
    whiten : bool
        Parameterise q through v = Lz^-1 u with p(v) = N(0, I) (default; better conditioned).
    jitter : float
        Added to the diagonal of Kzz, relative to its mean diagonal.
    prior_mean : array_like [L], optional
        A constant prior mean of each latent function (f_l = prior_mean_l + a zero-mean GP),
        learned with the hyperparameters. None (default): zero, and not learned.
    """

    def __init__(self, kernel, likelihood, Z, q_mu=None, q_sqrt=None, *, whiten=True, jitter=1e-6,
                 prior_mean=None):
        self.kernel = kernel
        self.likelihood = likelihood
        self.Z = as_matrix(Z, "Z").copy()
        M = self.Z.shape[0]
        L = likelihood.n_latent
        self.whiten = bool(whiten)
        self.jitter = float(jitter)
        mu_shape, sqrt_shape = ((M,), (M, M)) if L == 1 else ((M, L), (L, M, M))
        if q_mu is None:
            q_mu = np.zeros(mu_shape)
        if q_sqrt is None:
            prior = np.eye(M) if self.whiten else self._inducing_factor(self.kernel(self.Z))
            q_sqrt = np.broadcast_to(prior, sqrt_shape)
        self.q_mu = _as_array(q_mu, "q_mu", mu_shape)
        self.q_sqrt = np.tril(_as_array(q_sqrt, "q_sqrt", sqrt_shape))
        self.prior_mean = None if prior_mean is None else _as_array(prior_mean, "prior_mean", (L,))

    @property
    def n_inducing(self):
        """M, the number of inducing inputs."""
        return self.Z.shape[0]

    @property
    def n_latent(self):
        """L, the number of latent functions (1, or C for the softmax)."""
        return 1 if self.q_mu.ndim == 1 else self.q_mu.shape[1]

    def core_hyper(self):
        """The kernel and likelihood in the core's form: ((codes, params), likelihood args)."""
        return self.kernel._spec(self.Z.shape[1]), self.likelihood._core_args()

    def elbo(self, X, y, *, scale=1.0, with_grad=False, natural=False, hyper=None):
        """ELBO on a batch, optionally with its gradients.

        Parameters
        ----------
        X : array_like [B, D]
            float64 C-contiguous aligned rows are used as they are, anything else converted.
        y : array_like [B]
        scale : float
            N / B, so that the batch estimates the full-data ELBO.
        with_grad : bool
        natural : bool
            Return, instead of the gradients in q_mu and q_sqrt, those that natural-gradient
            steps need (see ``grads``).

        Returns
        -------
        elbo : float
        grads : dict or None
            ``q_mu`` (shaped like q_mu), ``q_sqrt`` (shaped like q_sqrt, lower), ``Z`` [M, D],
            ``kernel`` [P] (w.r.t. the positive kernel parameters), ``likelihood``
            (w.r.t. the positive likelihood parameters) and ``prior_mean`` [L]: gradients
            of the ELBO. With ``natural``, ``d_ell_m`` and ``d_ell_S`` (symmetric) replace
            ``q_mu`` and ``q_sqrt``: the gradients of the scaled expected log-likelihood
            alone (no KL) with respect to the mean and the covariance of q, in q's
            coordinates.
        hyper : tuple, optional
            Hyperparameters in the form of :meth:`core_hyper`, used instead of the kernel's
            and likelihood's own (optimisers pass them to skip updating those objects).
        """
        (codes, params), lik = self.core_hyper() if hyper is None else hyper
        value, _, _, extra, g = _core.svgp.elbo(
            codes, params, *lik, Z=self.Z, q_mu=self.q_mu, q_sqrt=self.q_sqrt,
            whiten=self.whiten, X=core_array(X), y=core_array(y), scale=float(scale),
            jitter=self.jitter,
            with_grad=bool(with_grad), natural=bool(natural), prior_mean=self.prior_mean,
        )
        self._warn_jitter(extra, codes, params)
        if not with_grad:
            return value, None
        d_mu, d_sqrt, d_Z, d_kern, d_lik, d_mean = g
        keys = ("d_ell_m", "d_ell_S") if natural else ("q_mu", "q_sqrt")
        d_lik = np.array([d_lik]) if self.likelihood.n_params else np.zeros(0)
        return value, {keys[0]: d_mu, keys[1]: d_sqrt, "Z": d_Z, "kernel": d_kern, "likelihood": d_lik,
                       "prior_mean": d_mean}

    def prior_precision(self, hyper=None):
        """Kzz^-1 [M, M] (with the model's jitter): the precision of the unwhitened prior p(u)
        (at the hyperparameters ``hyper`` of :meth:`elbo` when given)."""
        M = self.Z.shape[0]
        codes, params = (self.core_hyper() if hyper is None else hyper)[0]
        return cho_solve((self._inducing_factor(_core.kernels.K(codes, params, self.Z, None)), True),
                         np.eye(M))

    def _inducing_factor(self, Kzz):
        """Lower Cholesky factor of Kzz [M, M] with the model's jitter, escalated as the core
        escalates it (with its warning), or pygpfast.LinAlgError. For the unwhitened
        parameterisation, which it serves: a NumericalWarning when Kzz is near-singular."""
        Kzz = self._jittered(Kzz)
        L, extra = _core.linalg.cholesky(Kzz, 1e-10, 1e-4)
        mean_diag = np.mean(np.diag(Kzz))
        if extra > 0:
            warn_inducing_jitter("SVGP", extra, mean_diag)
        # The smallest pivot^2 bounds the smallest eigenvalue's share (on duplicated Z it is
        # the jitter): below ~1e-7 the unwhitened ELBO is too ill-conditioned to optimise
        # (L-BFGS-B stopped at the prior, p = 0.5 everywhere, after 0 to 2 iterations, at jitter
        # 1e-9 to 1e-15 on duplicated Z; the default 1e-6 fits).
        pivot = np.min(np.diag(L)) ** 2 / mean_diag
        if pivot < 1e-7:
            warn_at_caller(
                f"SVGP: K(Z, Z) is near-singular (smallest Cholesky pivot^2 {pivot:.0e} of its mean "
                "diagonal): an unwhitened q(u) cannot be optimised reliably on it; use "
                "whiten=True, a larger jitter or distinct inducing points")
        return L

    def _jittered(self, Kzz):
        """Kzz [M, M] with the jitter added in place, relative to its mean diagonal, as the core
        adds it."""
        Kzz.flat[:: len(Kzz) + 1] += self.jitter * np.mean(np.diag(Kzz))
        return Kzz

    def predict_f(self, Xnew):
        """Mean and variance of q(f) at Xnew [T, D]: [T] each (L = 1) or [T, L]; O(M^2) per point."""
        codes, params = self.kernel._spec(self.Z.shape[1])
        mean, var, extra = _core.svgp.predict_f(
            codes, params, Z=self.Z, q_mu=self.q_mu, q_sqrt=self.q_sqrt, whiten=self.whiten, Xnew=core_array(Xnew),
            jitter=self.jitter,
            prior_mean=self.prior_mean,
        )
        self._warn_jitter(extra, codes, params)
        return mean, var

    def _warn_jitter(self, extra, codes, params):
        if extra > 0:
            warn_inducing_jitter("SVGP", extra, np.mean(_core.kernels.Kdiag(codes, params, self.Z)))


def _as_array(a, name, shape):
    """A finite float64 C-contiguous copy of `a` with the given shape, or ValueError."""
    try:
        a = np.array(a, dtype=np.float64, order="C")
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a numeric array: {e}") from e
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(a.shape)}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains NaN or infinity")
    return a
