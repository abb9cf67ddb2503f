"""Optimisers of the SVGP ELBO: parameter packing, Adam, Adadelta, natural gradients for q(u),
full-batch L-BFGS-B with the paper's schedule, the minibatch trainer, and the natural-gradient
gap of q(u) (:func:`natural_gap`) by which the estimators tell a plateau of Adam's ELBO that is
an optimum from one that is Adam's own.

Everything here maximises the ELBO of a :class:`pygpfast.svgp.SVGP` model in place; the
estimators in :mod:`pygpfast.svgp` choose among these and report progress.

Natural gradients (Hensman, Fusi & Lawrence 2013, section 4.2). For each latent
function, q = N(m, S) has canonical parameters theta = (S^-1 m, -S^-1 / 2) and expectation
parameters eta = (m, S + m m^T); the natural gradient of the ELBO in theta is its ordinary
gradient in eta. With ELBO = ELL(m, S) - KL[q || N(0, P^-1)] (P = I whitened, Kzz^-1
otherwise), dELL/d eta_2 = dELL/dS and dELL/d eta_1 = dELL/dm - 2 dELL/dS m, so a step of size
rho is::

    S^-1     <- (1 - rho) S^-1     + rho (P - 2 dELL/dS)
    S^-1 m   <- (1 - rho) S^-1 m   + rho (dELL/dm - 2 dELL/dS m)

For a Gaussian likelihood on the full data, rho = 1 lands on the optimal q in one step (the
bracket is then the exact posterior precision and shift; Titsias' collapsed bound is reached).
For log-concave likelihoods dELL/dS is negative semi-definite, so the new precision stays
positive definite for any rho in (0, 1]; the step is nevertheless guarded (see
:class:`NaturalGradient`). q is kept in precision form between steps; the lower Cholesky
factor of S = Lambda^-1 that the core needs comes from the Cholesky factor R of the reversed
precision J Lambda J = R R^T (J the exchange matrix): q_sqrt = J R^-T J.
"""

import time

import numpy as np
import scipy.optimize
from scipy.linalg import lapack

from .._base._optimize import lbfgs
from .._validation import power_of_two_unit
from ..exceptions import warn_at_caller
from ..kernels import hyper_bounds
from ..likelihoods import Gaussian, Poisson
from ..priors import log_prior as _log_prior

__all__ = [
    "Adadelta",
    "Adam",
    "NaturalGradient",
    "Packer",
    "StochasticTrainer",
    "column_spread",
    "fit_lbfgs",
    "natural_gap",
]


def column_spread(Z):
    """The standard deviation of each column of Z [M, D] (1 where a column does not vary): the
    unit in which the optimisers move the inducing inputs."""
    unit = power_of_two_unit(Z, axis=0)  # (np.std's squares overflow beyond ~1e154)
    spread = np.std(Z / unit, axis=0) * unit
    return np.where(spread > 0, spread, 1.0)


class Packer:
    """Map the trainable parameters of an SVGP model to one unconstrained vector and back.

    Layout: q_mu [M, L] (row-major), the lower triangles of q_sqrt [L, M, M], Z [M, D]
    divided by :attr:`z_scale`, the constant prior mean [L] (when the model has one), log
    kernel parameters [P], log likelihood parameters. Groups can be left out (frozen, or moved
    by another optimiser such as natural gradients for q); the prior mean is trained with the
    hyperparameters.

    Scale: Z is packed in units of the spread (standard deviation) of its columns at
    construction (1 where a column does not vary), an unwhitened q in units of
    :attr:`q_scale`, the prior standard deviation sqrt(mean(diag Kzz)) at construction (1 when
    whitened: v's prior is N(0, I)), and the log hyperparameters are bounded by
    :func:`pygpfast.kernels.hyper_bounds` around their starting values, so that the
    optimisers take the same steps whatever the units of the features (without it, Adam's
    steps of 0.01 on Z scatter the inducing inputs of features on a scale of 1e-3, and the
    bounds clipped the starting lengthscales of features on a scale of 1e6; and L-BFGS-B,
    its gradients in u = q_mu scaled by 1 / sqrt(diag Kzz), stopped after one iteration on
    unwhitened models of targets of order 1e-20, the hyperparameters at their start).

    Optimisers call :meth:`apply` every step: it sets q and Z on the model and returns the
    hyperparameters in the core's form without writing them to the kernel and likelihood
    objects (which validate every assignment); :meth:`commit` writes everything back.

    Priors on the kernel's and the likelihood's parameters (:mod:`pygpfast.priors`):
    :attr:`has_prior` says whether there are any, :meth:`log_prior` gives their log density
    and its gradient in the hyperparameter slots, which the optimisers add to the ELBO's.
    """

    def __init__(self, model, *, train_q=True, train_Z=True, train_hyper=True):
        self.model = model
        self.M, self.D = model.Z.shape
        self.L = model.n_latent
        self.tril = np.tril_indices(self.M)
        self.train_q, self.train_Z, self.train_hyper = train_q, train_Z, train_hyper
        self.n_kern = model.kernel.n_params if train_hyper else 0
        self.n_lik = model.likelihood.n_params if train_hyper else 0
        n_q = self.M * self.L + self.L * len(self.tril[0]) if train_q else 0
        n_Z = self.M * self.D if train_Z else 0
        self.n_mean = self.L if train_hyper and model.prior_mean is not None else 0
        self._mean_start = n_q + n_Z
        self._hyper_start = self._mean_start + self.n_mean
        self.size = self._hyper_start + self.n_kern + self.n_lik
        self._fixed_hyper = model.core_hyper()
        self._prior_blocks = model.kernel._prior_blocks() + model.likelihood._prior_blocks()
        self.has_prior = any(prior is not None for _, prior, _ in self._prior_blocks)
        self.z_scale = column_spread(model.Z)
        self.q_scale = 1.0  # (a power of two: packing and unpacking q are exact)
        if train_q and not model.whiten:
            diag = model.kernel.diag(model.Z)
            top = float(np.max(diag))
            if 0.0 < top < np.inf:
                self.q_scale = float(power_of_two_unit(np.sqrt(np.mean(diag / top)) * np.sqrt(top)))
        # Box constraints (on the log positive parameters, none elsewhere).
        self.lower = np.full(self.size, -np.inf)
        self.upper = np.full(self.size, np.inf)
        if train_hyper:
            for i, (lower, upper) in ((self._hyper_start, hyper_bounds(model.kernel.theta)),
                                      (self._hyper_start + self.n_kern, model.likelihood.theta_bounds())):
                self.lower[i : i + len(lower)], self.upper[i : i + len(upper)] = lower, upper

    def _q_views(self, q_mu, q_sqrt):
        return q_mu.reshape(self.M, self.L), q_sqrt.reshape(self.L, self.M, self.M)

    def get(self):
        """The packed vector [size] at the model's current parameters."""
        m = self.model
        parts = []
        if self.train_q:
            mu, sq = self._q_views(m.q_mu, m.q_sqrt)
            parts += [mu.ravel() / self.q_scale, sq[:, self.tril[0], self.tril[1]].ravel() / self.q_scale]
        if self.train_Z:
            parts.append((m.Z / self.z_scale).ravel())
        if self.n_mean:
            parts.append(m.prior_mean)
        if self.train_hyper:
            parts += [m.kernel.theta, m.likelihood.theta]
        return np.concatenate(parts) if parts else np.zeros(0)

    def apply(self, x):
        """Set q and Z from x (new arrays) and return the hyperparameters for
        ``SVGP.elbo(..., hyper=...)``."""
        m, M, L = self.model, self.M, self.L
        i = 0
        if self.train_q:
            m.q_mu = x[: M * L].reshape(m.q_mu.shape) * self.q_scale
            i = M * L
            n_tril = len(self.tril[0])
            q_sqrt = np.zeros((L, M, M))
            q_sqrt[:, self.tril[0], self.tril[1]] = x[i : i + L * n_tril].reshape(L, n_tril) * self.q_scale
            m.q_sqrt = q_sqrt.reshape(m.q_sqrt.shape)
            i += L * n_tril
        if self.train_Z:
            m.Z = x[i : i + M * self.D].reshape(M, self.D) * self.z_scale
        if self.n_mean:
            m.prior_mean = x[self._mean_start : self._hyper_start].copy()
        if not self.train_hyper:
            return self._fixed_hyper
        (codes, _), lik = self._fixed_hyper
        params = np.exp(x[self._hyper_start :])
        if self.n_lik:  # the core's one likelihood parameter (noise variance or label noise)
            lik = (lik[0], float(params[self.n_kern]), *lik[2:])
        return (codes, params[: self.n_kern]), lik

    def commit(self, x):
        """Set every parameter of the model, kernel and likelihood objects included, from x."""
        self.apply(x)
        if self.train_hyper:
            i = self._hyper_start
            self.model.kernel.theta = x[i : i + self.n_kern]
            self.model.likelihood.theta = x[i + self.n_kern :]

    def log_prior(self, x):
        """(log prior density of the hyperparameters at x, its gradient w.r.t. x's hyperparameter
        slots [size - hyper_start]): at the model's own hyperparameters, a constant, when they
        are not trained."""
        if self.train_hyper:
            theta = x[self._hyper_start :]
        else:
            theta = np.concatenate([self.model.kernel.theta, self.model.likelihood.theta])
        value, grad = _log_prior(self._prior_blocks, theta)
        return value, grad if self.train_hyper else np.zeros(0)

    def add_log_prior(self, value, grad, x):
        """The log joint: ``value`` (an ELBO) plus the log prior at x, and ``grad`` (the ELBO's,
        from :meth:`grad`; changed in place) plus the prior's gradient. Both as given when
        there are no priors."""
        if not self.has_prior:
            return value, grad
        lp, d_lp = self.log_prior(x)
        if d_lp.size:
            grad[self._hyper_start :] += d_lp
        return value + lp, grad

    def grad(self, g, x):
        """Gradient w.r.t. the packed vector x, from the gradient dict of ``SVGP.elbo``."""
        parts = []
        if self.train_q:
            mu, sq = self._q_views(g["q_mu"], g["q_sqrt"])
            parts += [mu.ravel() * self.q_scale, sq[:, self.tril[0], self.tril[1]].ravel() * self.q_scale]
        if self.train_Z:
            parts.append((g["Z"] * self.z_scale).ravel())
        if self.n_mean:
            parts.append(g["prior_mean"])
        if self.train_hyper:
            # theta = log(params): d/dtheta = params * d/dparams
            parts += [g["kernel"], g["likelihood"]]
        out = np.concatenate(parts) if parts else np.zeros(0)
        out[self._hyper_start :] *= np.exp(x[self._hyper_start :])
        return out


class Adam:
    """Adam (Kingma & Ba 2015): descent steps on a loss from its gradient.

    With ``decay_steps`` the step size decays as lr / sqrt(1 + t / decay_steps).
    """

    def __init__(self, lr, beta1=0.9, beta2=0.999, eps=1e-8, decay_steps=None):
        self.lr, self.b1, self.b2, self.eps = lr, beta1, beta2, eps
        self.decay_steps = decay_steps
        self.m = self.v = None
        self.t = 0

    def step(self, x, grad):
        """x - lr * m_hat / (sqrt(v_hat) + eps) for the loss gradient ``grad`` at x."""
        if self.m is None:
            self.m, self.v = np.zeros_like(x), np.zeros_like(x)
        self.t += 1
        self.m *= self.b1
        self.m += (1 - self.b1) * grad
        self.v *= self.b2
        self.v += (1 - self.b2) * grad * grad
        lr = self.lr * np.sqrt(1 - self.b2**self.t) / (1 - self.b1**self.t)
        if self.decay_steps:
            lr /= np.sqrt(1 + self.t / self.decay_steps)
        return x - lr * self.m / (np.sqrt(self.v) + self.eps * np.sqrt(1 - self.b2**self.t))


class Adadelta:
    """Adadelta (Zeiler 2012) with a step rate, as in climin (the optimiser of Hensman, Matthews & Ghahramani's
    MNIST experiment, step rate 0.1): x -= rate * RMS[dx] / RMS[g] * g, with climin's offset
    eps = 1e-4 inside both RMS and decay 0.9."""

    def __init__(self, lr, decay=0.9, eps=1e-4):
        self.lr, self.decay, self.eps = lr, decay, eps
        self.g2 = self.dx2 = None

    def step(self, x, grad):
        if self.g2 is None:
            self.g2, self.dx2 = np.zeros_like(x), np.zeros_like(x)
        rho = self.decay
        self.g2 *= rho
        self.g2 += (1 - rho) * grad * grad
        dx = np.sqrt(self.dx2 + self.eps) / np.sqrt(self.g2 + self.eps) * grad
        self.dx2 *= rho
        self.dx2 += (1 - rho) * dx * dx
        return x - self.lr * dx


def _flip(A):
    return A[::-1, ::-1]


class NaturalGradient:
    """Natural-gradient steps on q(u) (all latent functions), in precision form.

    The precision S^-1 and the shift S^-1 m of the current q are cached between steps (with
    rows and columns in reverse order, the order the Cholesky factorisation needs); they are
    recomputed from the model's q_sqrt whenever the model holds q arrays that this object
    did not write (the cache is keyed on the arrays' identity).

    A step whose new precision is not numerically positive definite (possible only for
    likelihoods that are not log-concave, or through rounding) is retried with half the step
    size, up to 30 times, with a NumericalWarning the first time (none with ``warn=False``); if
    none succeeds q is left unchanged.
    """

    _MAX_HALVINGS = 30

    def __init__(self, warn=True):
        self._prec = self._shift = None
        self._written = (None, None)
        self.n_halved = 0
        self.warn = warn  # (whether the first halving warns; natural_gap's trial steps do not)

    def _cache(self, model, M, L):
        if self._written[0] is model.q_mu and self._written[1] is model.q_sqrt:
            return
        mu = model.q_mu.reshape(M, L)
        sq = model.q_sqrt.reshape(L, M, M)
        self._prec = np.empty((L, M, M))
        self._shift = np.empty((L, M))
        for l in range(L):
            Linv, info = lapack.dtrtri(np.tril(sq[l]), lower=1)
            if info != 0:
                raise np.linalg.LinAlgError("q_sqrt is singular; natural gradients need S > 0")
            prec = Linv.T @ Linv
            self._prec[l] = _flip(prec)
            self._shift[l] = (prec @ mu[:, l])[::-1]

    def snapshot(self, model):
        """The model's q and this object's cache, for :meth:`restore` (steps replace the
        arrays, so references suffice)."""
        return model.q_mu, model.q_sqrt, self._prec, self._shift, self._written

    def restore(self, model, snapshot):
        model.q_mu, model.q_sqrt, self._prec, self._shift, self._written = snapshot

    def step(self, model, d_m, d_S, rho, prior_prec=None):
        """One natural-gradient step of size rho in (0, 1] on the model's q, in place.

        Parameters
        ----------
        model : pygpfast.svgp.SVGP
        d_m, d_S : ndarray
            dELL/dm [M] or [M, L] and dELL/dS [M, M] or [L, M, M] (symmetric) at the model's q,
            from ``SVGP.elbo(..., natural=True)``.
        rho : float
        prior_prec : ndarray [M, M], optional
            Precision of the prior of q: None for the whitened N(0, I), Kzz^-1 otherwise.
        """
        M, L = model.Z.shape[0], model.n_latent
        self._cache(model, M, L)
        mu = model.q_mu.reshape(M, L)
        d_m = d_m.reshape(M, L)
        d_S = d_S.reshape(L, M, M)
        new_mu = np.empty((M, L))
        new_sqrt = np.empty((L, M, M))
        new_prec = np.empty((L, M, M))
        new_shift = np.empty((L, M))
        for l in range(L):
            # The target (prior plus likelihood) precision and shift, reversed (J . J) so that
            # the Cholesky factor R of the new reversed precision gives q_sqrt = J R^-T J.
            target_prec = _flip(d_S[l]) * -2.0
            if prior_prec is None:
                target_prec.flat[:: M + 1] += 1.0
            else:
                target_prec += _flip(prior_prec)
            target_shift = (d_m[:, l] - 2.0 * (d_S[l] @ mu[:, l]))[::-1]
            r = rho
            for _ in range(self._MAX_HALVINGS + 1):
                np.multiply(target_prec, r, out=new_prec[l])
                new_prec[l] += (1.0 - r) * self._prec[l]
                # The precision is symmetric: a C-ordered copy read in Fortran order is itself,
                # so LAPACK factors the copy in place.
                R, info = lapack.dpotrf(new_prec[l].T.copy(order="F"), lower=1, clean=1, overwrite_a=1)
                if info == 0:
                    break
                r *= 0.5
            else:
                R = None
            if r < rho:
                self.n_halved += 1
                # (it may recur at every step: n_halved counts them)
                if self.n_halved == 1 and self.warn:
                    warn_at_caller(
                        f"natural-gradient step: the new precision of q(u) was not positive "
                        f"definite at step size {rho:.3g}; "
                        + (f"used {r:.3g}" if R is not None else "q(u) left unchanged")
                        + " (said once per optimiser; later steps halve as needed)")
            if R is None:
                new_prec[l], new_shift[l] = self._prec[l], self._shift[l]
                new_mu[:, l] = mu[:, l]
                new_sqrt[l] = model.q_sqrt.reshape(L, M, M)[l]
                continue
            shift = target_shift * r
            shift += (1.0 - r) * self._shift[l]
            new_shift[l] = shift
            new_mu[::-1, l] = lapack.dpotrs(R, shift, lower=1)[0]
            Rinv = lapack.dtrtri(R, lower=1, overwrite_c=1)[0]
            new_sqrt[l] = _flip(Rinv.T)
        model.q_mu = new_mu.reshape(model.q_mu.shape)
        model.q_sqrt = new_sqrt.reshape(model.q_sqrt.shape)
        self._prec, self._shift = new_prec, new_shift
        self._written = (model.q_mu, model.q_sqrt)


class StochasticTrainer:
    """Minibatch maximisation of the ELBO: natural gradients on q(u) with Adam on Z and the
    hyperparameters (``optimizer="natgrad"``), or Adam / Adadelta on everything.

    The object holds the optimiser state (moments, step count, natural-gradient cache), so
    successive :meth:`run` calls (epochs, or ``partial_fit`` chunks) continue one run.

    Parameters
    ----------
    model : pygpfast.svgp.SVGP
    optimizer : {"natgrad", "adam", "adadelta"}
    learning_rate : float
        Step size of Adam or Adadelta.
    natgrad_step : callable
        ``natgrad_step(t, batch_fraction) -> rho`` for step t = 0, 1, ... and the minibatch's
        share B / n_total of the data (natgrad only).
    train_Z, train_hyper : bool

    :meth:`reduce_step` scales Adam's or Adadelta's step size (the estimators' fit does so at a
    plateau of the ELBO with q(u) far from its optimum); the scale is part of the state that
    later :meth:`run` calls continue.

    With natural gradients, Adam's step size on Z and the hyperparameters decays as
    learning_rate / sqrt(1 + t / HYPER_DECAY_STEPS): once q(u) is near its optimum (which
    natural gradients reach within an epoch) the remaining error is the minibatch noise of
    Adam's steps on the hyperparameters, and the decay averages it out. Measured on the peers'
    100 000-row problem (bench/python/svgp_fit.py, M = 100, B = 256): hold-out NLPD after
    2 epochs 0.2399 with the decay against 0.2435 with a constant 0.01 and 0.2403 with a
    constant 0.002 (which is slower from a poor start).

    Priors on the hyperparameters: each minibatch's objective is its ELBO estimate of the full
    data (the expected log-likelihood scaled by N / B, the KL once) plus the log prior, once
    and whole, as the KL: an unbiased estimate of the full-data log joint, whose gradient the
    steps follow. (Summed over an epoch's N / B minibatches rather than averaged, the prior
    would be weighted B / N per minibatch; the steps here average.)
    """

    #: Decay of Adam's step size on Z and the hyperparameters under natural gradients.
    HYPER_DECAY_STEPS = 100
    #: Halvings of a Poisson natural step before q(u) is left unchanged (_checked_natural_step).
    _MAX_HALVINGS = 30
    #: The factor by which :meth:`reduce_step` has scaled Adam's or Adadelta's step size.
    step_scale = 1.0
    #: The largest change of one packed coordinate (a log hyperparameter, a coordinate of Z in
    #: units of its column's spread, of q in its prior's) in one step of the last :meth:`run`.
    largest_move = 0.0
    #: The ELBO estimate of the first minibatch of the last :meth:`run`, at the parameters it
    #: started from.
    first_value = -np.inf

    def __init__(self, model, *, optimizer, learning_rate, natgrad_step=None, train_Z=True,
                 train_hyper=True):
        self.model = model
        self.natural = optimizer == "natgrad"
        self.packer = Packer(model, train_q=not self.natural, train_Z=train_Z, train_hyper=train_hyper)
        if optimizer == "adadelta":
            self.opt = Adadelta(learning_rate)
        else:
            self.opt = Adam(learning_rate, decay_steps=self.HYPER_DECAY_STEPS if self.natural else None)
        self.natgrad = NaturalGradient() if self.natural else None
        self.natgrad_step = natgrad_step
        self.t = 0

    def reduce_step(self, factor):
        """Scale Adam's or Adadelta's step size by ``factor`` for the rest of the run (the
        estimators' reduction on a plateau of the ELBO; not used with natural gradients)."""
        self.opt.lr *= factor
        self.step_scale *= factor

    def run(self, batches, n_steps, n_total):
        """Take ``n_steps`` steps on minibatches drawn from the iterator ``batches``, each
        weighted as a sample of ``n_total`` rows. Returns the mean minibatch ELBO
        estimate and the number of rows used.

        A minibatch whose ELBO or gradient is not finite (a step so large that a rate exp(f)
        overflowed, say) ends the run there without a step: the parameters stay those that gave
        it, and the mean returned is -inf (the estimators' fit then restores its best ones)."""
        model, packer = self.model, self.packer
        x = packer.get()
        hyper = packer.apply(x)
        total, rows = 0.0, 0
        self.largest_move = 0.0
        for _ in range(n_steps):
            X_b, t_b = next(batches)
            value, g = model.elbo(X_b, t_b, scale=n_total / X_b.shape[0], with_grad=True,
                                  natural=self.natural, hyper=hyper)
            if rows == 0:
                self.first_value = value
            if not (np.isfinite(value) and all(np.isfinite(v).all() for v in g.values())):
                total, rows = -np.inf, rows + X_b.shape[0]
                break
            if self.natural:
                prior = None if model.whiten else model.prior_precision(hyper)
                rho = self.natgrad_step(self.t, X_b.shape[0] / n_total)
                if isinstance(model.likelihood, Poisson):
                    self._checked_natural_step(X_b, t_b, n_total / X_b.shape[0], hyper, value,
                                               g, rho, prior)
                else:
                    self.natgrad.step(model, g["d_ell_m"], g["d_ell_S"], rho, prior)
            if packer.size:
                value, grad = packer.add_log_prior(value, packer.grad(g, x), x)
                new_x = np.clip(self.opt.step(x, grad / -n_total), packer.lower, packer.upper)
                self.largest_move = max(self.largest_move, float(np.max(np.abs(new_x - x))))
                x = new_x
                hyper = packer.apply(x)
            elif packer.has_prior:
                value = packer.add_log_prior(value, np.zeros(0), x)[0]
            self.t += 1
            total += value
            rows += X_b.shape[0]
        packer.commit(x)
        return total / n_steps, rows

    def _checked_natural_step(self, X_b, t_b, scale, hyper, value, g, rho, prior):
        """A natural step for a likelihood of unbounded curvature (Poisson: exp(f)), halved
        until the minibatch's ELBO does not fall. The step is Newton's on the expected
        log-likelihood at the current q, and exp(f)'s curvature there says nothing about it
        a few units of f away: from the prior, counts of ~20 sent the rates to 1e12 and then
        1e68 (the minibatch ELBO to -7e12). Costs one ELBO value per try (one, once q is near
        its optimum); after _MAX_HALVINGS q(u) is left unchanged."""
        model, natgrad = self.model, self.natgrad
        before = natgrad.snapshot(model)
        for _ in range(self._MAX_HALVINGS + 1):
            natgrad.step(model, g["d_ell_m"], g["d_ell_S"], rho, prior)
            new_value = model.elbo(X_b, t_b, scale=scale, hyper=hyper)[0]
            if np.isfinite(new_value) and new_value >= value:
                return
            natgrad.restore(model, before)
            rho *= 0.5


def natural_gap(model, passes, n_total, max_halvings=3, min_step=1e-9):
    """A lower bound on how far q(u) is from its optimum at the model's Z and hyperparameters:
    the gain in the ELBO per row of one natural-gradient step on q over the full data, of size
    1 (Newton's step on the expected log-likelihood: for a Gaussian likelihood it lands on the
    optimal q, so the gain is the whole gap) or, when that lowers the ELBO, 1/2, 1/4, ... up to
    ``max_halvings`` times, then steps 8 times smaller down to ``min_step``: the first that
    raises the ELBO gives the gain.

    Where no step raises it: 0 when the whole step of size 1 changed the ELBO by rounding only
    (the natural gradient vanishes: q at its optimum), else inf (the gap is unknown: q sits where the
    ELBO is so sharply curved, or overflows, that even a step of ``min_step`` overshoots; large
    Poisson counts from a q far from the data do this).

    The model is left as it was. Costs two passes over the data (one with gradients), plus one
    per smaller step tried (at most ``max_halvings`` + 10).

    Parameters
    ----------
    model : pygpfast.svgp.SVGP
    passes : callable
        ``passes()`` -> an iterator of ``(X_block, t_block)`` that covers the data once (float64
        C-contiguous blocks).
    n_total : int
        Rows in the data.

    Returns
    -------
    gap : float
        The gain per row (>= 0; inf when not measurable).
    elbo : float
        The full-data ELBO at the model's q.
    """
    def full_elbo(with_grad):
        # Each block's ELBO estimates the whole (scale N / n), weighted n / N: the KL comes out once.
        value, d_m, d_S = 0.0, 0.0, 0.0
        for X_b, t_b in passes():
            w = X_b.shape[0] / n_total
            v, g = model.elbo(X_b, t_b, scale=1.0 / w, with_grad=with_grad, natural=True)
            value += w * v
            if with_grad:
                d_m = d_m + w * g["d_ell_m"]
                d_S = d_S + w * g["d_ell_S"]
        return value, d_m, d_S

    value, d_m, d_S = full_elbo(True)
    prior = None if model.whiten else model.prior_precision()
    natgrad = NaturalGradient(warn=False)
    before = natgrad.snapshot(model)
    steps = [0.5**k for k in range(max_halvings + 1)]
    while steps[-1] / 8.0 >= min_step:
        steps.append(steps[-1] / 8.0)
    negligible = 1e-9 * max(n_total, abs(value))
    try:
        for rho in steps:
            natgrad.step(model, d_m, d_S, rho, prior)
            whole = natgrad.n_halved == 0  # (step() halves a step whose precision is not PD)
            new_value = full_elbo(False)[0]
            natgrad.restore(model, before)
            natgrad.n_halved = 0
            if np.isfinite(new_value) and new_value > value:
                return (new_value - value) / n_total, value
            if rho == 1.0 and whole and abs(new_value - value) <= negligible:
                return 0.0, value
        return np.inf, value
    finally:
        natgrad.restore(model, before)


def fit_lbfgs(model, X, t, *, train_Z, train_hyper, max_iter, tol, report):
    """Full-batch L-BFGS-B on the ELBO with the paper's schedule (Hensman, Matthews & Ghahramani 2015 section 5: "freezing
    the kernel hyper parameters at the beginning of optimization and then unfreezing them once
    a reasonable set of variational parameters has been attained").

    Stage 1 sets q with Z and the hyperparameters frozen: for a Gaussian likelihood by one
    natural-gradient step of size 1 (the exact optimum), otherwise by L-BFGS-B on q alone
    (at most max(1, min(max_iter // 4, 100)) iterations, or max_iter when nothing else is trained, as
    stage 1 is then the whole fit). Stage 2 optimises everything that is trained.

    Parameters
    ----------
    model : pygpfast.svgp.SVGP
    X : ndarray [N, D], float64 C-contiguous
    t : ndarray [N]
    train_Z, train_hyper : bool
    max_iter : int
        L-BFGS-B iterations of stage 2 (of stage 1 when neither Z nor the hyperparameters are
        trained).
    tol : float
        scipy's ``ftol``: stop when the ELBO per row changes by less than ``tol`` (relative to
        max(|ELBO / N|, 1)) in one iteration.
    report : callable
        ``report(iteration, elbo, rows_per_s) -> stop`` after every iteration (the ELBO plus
        the log prior of the hyperparameters when they have priors: the objective maximised).

    Returns
    -------
    n_iter : int
    problem : str or None
        None when the fit converged or ``report`` stopped it; otherwise why the last stage
        stopped: at ``max_iter``, or L-BFGS-B's own message when it gave up early (a failed
        line search, e.g. on gradients spoiled by a near-singular K(Z, Z)).
    """
    N = X.shape[0]
    state = {"it": 0, "elbo": -np.inf, "clock": time.perf_counter(), "stopped": False}

    def run(packer, maxiter):
        def objective(x):
            value, g = model.elbo(X, t, scale=1.0, with_grad=True, hyper=packer.apply(x))
            value, grad = packer.add_log_prior(value, packer.grad(g, x), x)
            state["elbo"] = value
            return -value / N, grad / -N

        def on_iteration(_, x, __):
            state["it"] += 1
            now = time.perf_counter()
            rate = N / max(now - state["clock"], 1e-12)
            state["clock"] = now
            packer.commit(x)  # the accepted iterate, not the last line-search trial
            state["stopped"] = bool(report(state["it"], state["elbo"], rate))
            return state["stopped"]

        res = lbfgs(objective, packer.get(), bounds=scipy.optimize.Bounds(packer.lower, packer.upper),
                    max_iter=maxiter, ftol=tol, gtol=1e-8, on_iteration=on_iteration)
        packer.commit(res.x)
        return res

    res = None
    frozen = not (train_Z or train_hyper)  # then stage 1 is the whole fit
    if isinstance(model.likelihood, Gaussian):
        _, g = model.elbo(X, t, scale=1.0, with_grad=True, natural=True)
        prior = None if model.whiten else model.prior_precision()
        NaturalGradient().step(model, g["d_ell_m"], g["d_ell_S"], 1.0, prior)
    else:
        res = run(Packer(model, train_Z=False, train_hyper=False),
                  max_iter if frozen else max(1, min(max_iter // 4, 100)))
    if not state["stopped"] and not frozen:
        res = run(Packer(model, train_Z=train_Z, train_hyper=train_hyper), max_iter)
    return state["it"], None if res is None else res.problem
