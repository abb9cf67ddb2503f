"""Sparse variational Gaussian processes (SVGP; Hensman, Matthews & Ghahramani 2015).

``q(u) = N(q_mu, q_sqrt q_sqrt^T)`` at M inducing inputs Z; the ELBO of seed 000 eq. (21) and all
of its gradients come from one call into the compiled core per (mini)batch.

Public estimators: :class:`SVGPClassifier` (binary) and :class:`SVGPRegressor`.
"""

import copy
import numbers
import time
import warnings

import numpy as np
import scipy.optimize
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.preprocessing import LabelEncoder
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from . import _core
from . import _svgp_mf
from . import kernels as _kernels
from . import likelihoods as _likelihoods
from ._validation import as_matrix, as_vector, check_same_dim
from .exceptions import NumericalWarning

__all__ = ["SVGP", "SVGPClassifier", "SVGPRegressor"]


class SVGP:
    """The SVGP model: kernel, likelihood, inducing inputs and q(u), with the ELBO.

    Parameters
    ----------
    kernel : pygpfast.kernels.Kernel
    likelihood : pygpfast.likelihoods.Likelihood
    Z : array_like [M, D]
        Inducing inputs.
    q_mu : array_like [M], optional
        Mean of q(u) (of q(v) when whitened); zeros by default.
    q_sqrt : array_like [M, M], optional
        Lower-triangular square root of the covariance of q(u) (of q(v) when whitened).
        Defaults to the prior: I when whitened, chol(Kzz) otherwise.
    whiten : bool
        Parameterise q through v = Lz^-1 u with p(v) = N(0, I) (default; better conditioned).
    jitter : float
        Added to the diagonal of Kzz.
    """

    def __init__(self, kernel, likelihood, Z, q_mu=None, q_sqrt=None, *, whiten=True, jitter=1e-6):
        self.kernel = kernel
        self.likelihood = likelihood
        self.Z = as_matrix(Z, "Z").copy()
        M = self.Z.shape[0]
        self.whiten = bool(whiten)
        self.jitter = float(jitter)
        self.q_mu = np.zeros(M) if q_mu is None else as_vector(q_mu, "q_mu", size=M).copy()
        if q_sqrt is None:
            if self.whiten:
                q_sqrt = np.eye(M)
            else:
                Kzz = self.kernel(self.Z) + self.jitter * np.eye(M)
                q_sqrt = np.linalg.cholesky(Kzz)
        q_sqrt = as_matrix(q_sqrt, "q_sqrt")
        if q_sqrt.shape != (M, M):
            raise ValueError(f"q_sqrt must be [{M}, {M}], got {q_sqrt.shape}")
        self.q_sqrt = np.tril(q_sqrt)

    @property
    def num_inducing(self):
        return self.Z.shape[0]

    def _core_args(self):
        codes, params = self.kernel._spec(self.Z.shape[1])
        return (codes, params, *self.likelihood._core_args())

    def elbo(self, X, y, *, scale=1.0, with_grad=False):
        """ELBO on a batch, optionally with its gradients.

        Parameters
        ----------
        X : ndarray [B, D], float64 C-contiguous
        y : ndarray [B]
        scale : float
            N / B, so that the batch estimates the full-data ELBO.
        with_grad : bool

        Returns
        -------
        elbo : float
        grads : dict or None
            ``q_mu`` [M], ``q_sqrt`` [M, M] (lower), ``Z`` [M, D], ``kernel`` [P] (w.r.t. the
            positive kernel parameters) and ``likelihood`` [L] (w.r.t. the positive likelihood
            parameters) — gradients of the ELBO.
        """
        value, _, _, extra, g = _core.svgp_elbo(
            *self._core_args(), self.Z, self.q_mu, self.q_sqrt, self.whiten,
            X, y, float(scale), self.jitter, bool(with_grad),
        )
        self._warn_jitter(extra)
        if not with_grad:
            return value, None
        d_mu, d_sqrt, d_Z, d_kern, d_lik = g
        d_lik = np.array([d_lik]) if self.likelihood.n_params else np.zeros(0)
        return value, {"q_mu": d_mu, "q_sqrt": d_sqrt, "Z": d_Z, "kernel": d_kern, "likelihood": d_lik}

    def predict_f(self, Xnew):
        """Mean [T] and variance [T] of q(f) at Xnew [T, D] (O(M^2) per point)."""
        codes, params = self.kernel._spec(self.Z.shape[1])
        mean, var, extra = _core.svgp_predict_f(
            codes, params, self.Z, self.q_mu, self.q_sqrt, self.whiten, Xnew, self.jitter
        )
        self._warn_jitter(extra)
        return mean, var

    @staticmethod
    def _warn_jitter(extra):
        if extra > 0:
            warnings.warn(
                f"SVGP: K(Z, Z) was not numerically positive definite; added jitter {extra:.3g}. "
                "Inducing points may be duplicated; consider fewer of them or a larger jitter.",
                NumericalWarning,
                stacklevel=3,
            )


class _Packer:
    """Map the trainable parameters of an SVGP to one unconstrained vector and back.

    Layout: q_mu [M], tril(q_sqrt) [M(M+1)/2], Z [M*D], log kernel params [P],
    log likelihood params [L]. Groups can be frozen (kept out of the vector).
    """

    def __init__(self, model, *, train_Z=True, train_hyper=True):
        self.model = model
        M, D = model.Z.shape
        self.M, self.D = M, D
        self.tril = np.tril_indices(M)
        self.train_Z = train_Z
        self.train_hyper = train_hyper

    def get(self):
        m = self.model
        parts = [m.q_mu, m.q_sqrt[self.tril]]
        if self.train_Z:
            parts.append(m.Z.ravel())
        if self.train_hyper:
            parts += [m.kernel.theta, m.likelihood.theta]
        return np.concatenate(parts)

    def set(self, x):
        m, M, D = self.model, self.M, self.D
        i = 0
        m.q_mu = x[i : i + M].copy()
        i += M
        n_tril = M * (M + 1) // 2
        q_sqrt = np.zeros((M, M))
        q_sqrt[self.tril] = x[i : i + n_tril]
        m.q_sqrt = q_sqrt
        i += n_tril
        if self.train_Z:
            m.Z = np.ascontiguousarray(x[i : i + M * D].reshape(M, D))
            i += M * D
        if self.train_hyper:
            P = m.kernel.n_params
            m.kernel.theta = x[i : i + P]
            i += P
            L = m.likelihood.n_params
            m.likelihood.theta = x[i : i + L]
            i += L

    def grad(self, g):
        """Gradient w.r.t. the packed vector from the model's gradient dict."""
        m = self.model
        parts = [g["q_mu"], g["q_sqrt"][self.tril]]
        if self.train_Z:
            parts.append(g["Z"].ravel())
        if self.train_hyper:
            # theta = log(params): d/dtheta = params * d/dparams
            parts += [g["kernel"] * m.kernel.params, g["likelihood"] * m.likelihood.params]
        return np.concatenate(parts)


class _Adam:
    def __init__(self, lr, beta1=0.9, beta2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, beta1, beta2, eps
        self.m = self.v = None
        self.t = 0

    def step(self, x, grad):
        """One step of gradient *descent* on the objective whose gradient is `grad`."""
        if self.m is None:
            self.m = np.zeros_like(x)
            self.v = np.zeros_like(x)
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * grad
        self.v = self.b2 * self.v + (1 - self.b2) * grad * grad
        mhat = self.m / (1 - self.b1**self.t)
        vhat = self.v / (1 - self.b2**self.t)
        return x - self.lr * mhat / (np.sqrt(vhat) + self.eps)


def _init_inducing(X, M, random_state):
    """k-means centres of (a subsample of) X; fast on millions of rows."""
    N = X.shape[0]
    if M >= N:
        return X.copy()
    n_sub = min(N, max(20 * M, 20000))
    idx = random_state.choice(N, n_sub, replace=False) if n_sub < N else np.arange(N)
    sub = np.asarray(X[np.sort(idx)], dtype=np.float64)
    km = KMeans(n_clusters=M, n_init=1, max_iter=50, random_state=random_state.randint(2**31 - 1))
    km.fit(sub)
    return np.ascontiguousarray(km.cluster_centers_)


def _default_kernel(X, random_state):
    """RBF with ARD lengthscales set by the median-distance heuristic per input dimension."""
    N, D = X.shape
    idx = random_state.choice(N, min(N, 1000), replace=False)
    sub = np.asarray(X[idx])
    spread = np.median(np.abs(sub[:, None, :] - sub[None, : min(len(sub), 200), :]).reshape(-1, D), axis=0)
    spread = np.where(spread > 0, spread, 1.0)
    return _kernels.RBF(variance=1.0, lengthscale=spread * np.sqrt(D))


class _SVGPEstimator(BaseEstimator):
    """Shared fitting logic of SVGPClassifier and SVGPRegressor."""

    _LBFGS_AUTO_MAX_ROWS = 10_000

    def _likelihood_for_fit(self):
        raise NotImplementedError

    def _encode_targets(self, y):
        raise NotImplementedError

    # ---------------------------------------------------------------- fitting
    def _check_params(self):
        if self.method not in ("kl", "mf"):
            raise ValueError(f"method must be 'kl' or 'mf', got {self.method!r}")
        if self.method == "mf":
            _svgp_mf.check_estimator_params(self)
        if self.optimizer not in ("auto", "lbfgs", "adam"):
            raise ValueError(f"optimizer must be 'auto', 'lbfgs' or 'adam', got {self.optimizer!r}")
        if not (isinstance(self.n_inducing, numbers.Integral) and self.n_inducing >= 1):
            raise ValueError(f"n_inducing must be a positive int, got {self.n_inducing!r}")
        if not (isinstance(self.max_iter, numbers.Integral) and self.max_iter >= 1):
            raise ValueError(f"max_iter must be a positive int, got {self.max_iter!r}")
        if self.batch_size != "auto" and not (
            isinstance(self.batch_size, numbers.Integral) and self.batch_size >= 1
        ):
            raise ValueError(f"batch_size must be 'auto' or a positive int, got {self.batch_size!r}")
        if not (self.learning_rate > 0):
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate!r}")
        if not (self.tol >= 0):
            raise ValueError(f"tol must be >= 0, got {self.tol!r}")

    def fit(self, X, y):
        """Fit the SVGP by maximising the ELBO.

        Parameters
        ----------
        X : array_like [N, D]
        y : array_like [N]

        Returns
        -------
        self
        """
        self._check_params()
        X, y = validate_data(self, X, y, dtype=np.float64, order="C", y_numeric=False)
        t = self._encode_targets(y)
        rs = check_random_state(self.random_state)
        N, D = X.shape

        kernel = copy.deepcopy(self.kernel) if self.kernel is not None else _default_kernel(X, rs)
        if self.inducing_points is not None:
            Z = as_matrix(self.inducing_points, "inducing_points")
            check_same_dim(X, Z, "inducing_points")
        else:
            Z = _init_inducing(X, min(self.n_inducing, N), rs)
        model = SVGP(kernel, self._likelihood_for_fit(), Z, whiten=self.whiten, jitter=self.jitter)
        if self.method == "mf":
            return self._fit_mf(model, X, t)

        optimizer = self.optimizer
        if optimizer == "auto":
            optimizer = "lbfgs" if N <= self._LBFGS_AUTO_MAX_ROWS else "adam"
        self.history_ = []
        if optimizer == "lbfgs":
            self._fit_lbfgs(model, X, t)
        else:
            self._fit_adam(model, X, t, rs)
        self.optimizer_ = optimizer
        self.model_ = model
        self.kernel_ = model.kernel
        self.likelihood_ = model.likelihood
        self.inducing_points_ = model.Z
        self.elbo_ = model.elbo(X, t, scale=1.0)[0] if N <= 200_000 else self.history_[-1]
        return self

    def _report(self, it, elbo, rows_per_s):
        self.history_.append(float(elbo))
        if self.verbose and (it % max(1, int(self.verbose)) == 0):
            print(f"[pygpfast SVGP] iter {it:6d}  ELBO {elbo: .6e}  {rows_per_s:,.0f} rows/s")
        if self.callback is not None:
            return bool(self.callback(self, it, elbo))
        return False

    def _fit_lbfgs(self, model, X, t):
        N = X.shape[0]
        state = {"it": 0, "elbo": -np.inf, "clock": time.perf_counter(), "stopped": False}

        class _Stop(Exception):
            pass

        def run(packer, maxiter):
            if state["stopped"]:
                return None

            def objective(x):
                packer.set(x)
                value, g = model.elbo(X, t, scale=1.0, with_grad=True)
                state["elbo"] = value
                return -value / N, -packer.grad(g) / N

            def callback(xk):
                state["it"] += 1
                now = time.perf_counter()
                rate = N / max(now - state["clock"], 1e-12)
                state["clock"] = now
                if self._report(state["it"], state["elbo"], rate):
                    state["stopped"] = True
                    packer.set(xk)  # the accepted iterate, not the last line-search trial
                    raise _Stop

            try:
                res = scipy.optimize.minimize(
                    objective, packer.get(), jac=True, method="L-BFGS-B", callback=callback,
                    options={"maxiter": maxiter, "ftol": self.tol, "gtol": 1e-8},
                )
            except _Stop:
                return None
            packer.set(res.x)
            return res

        # The paper's schedule: variational parameters first with the kernel and Z frozen,
        # then everything.
        run(_Packer(model, train_Z=False, train_hyper=False), max(1, min(self.max_iter // 4, 100)))
        res = run(
            _Packer(model, train_Z=self.train_inducing, train_hyper=self.optimize_hyperparameters),
            self.max_iter,
        )
        self.n_iter_ = state["it"]
        if res is not None and not res.success and res.nit >= self.max_iter:
            warnings.warn(
                f"SVGP L-BFGS-B stopped after max_iter={self.max_iter} iterations; "
                "increase max_iter for a tighter fit",
                ConvergenceWarning,
                stacklevel=3,
            )

    def _fit_mf(self, model, X, t):
        """The sparse mean-field method (seed 000 section 3.1); see pygpfast._svgp_mf."""
        if len(self.classes_) != 2:
            raise ValueError(
                f"Only binary classification is supported by method='mf'; y has {len(self.classes_)} classes"
            )
        self.history_ = []
        fit = _svgp_mf.fit(
            model.kernel, model.Z, X, t, jitter=self.jitter, train_Z=self.train_inducing,
            train_hyper=self.optimize_hyperparameters, max_iter=self.max_iter, tol=self.tol,
            report=self._report,
        )
        # Its Gaussian approximation of q(u), whitened whatever `whiten` says.
        self.model_ = SVGP(model.kernel, model.likelihood, fit.Z, fit.q_mu, fit.q_sqrt, whiten=True,
                           jitter=self.jitter)
        self.optimizer_ = "lbfgs"
        self.n_iter_ = fit.n_iter
        self.kernel_ = self.model_.kernel
        self.likelihood_ = self.model_.likelihood
        self.inducing_points_ = self.model_.Z
        self.elbo_ = fit.bound
        self.mf_a_ = fit.a
        return self

    def _fit_adam(self, model, X, t, rs):
        N = X.shape[0]
        B = min(N, 256 if self.batch_size == "auto" else int(self.batch_size))
        packer = _Packer(model, train_Z=self.train_inducing, train_hyper=self.optimize_hyperparameters)
        adam = _Adam(self.learning_rate)
        x = packer.get()
        steps_per_epoch = max(1, N // B)
        window, best = [], -np.inf
        patience = 0
        perm, pos = rs.permutation(N), 0
        t_start = time.perf_counter()
        for it in range(1, self.max_iter + 1):
            if pos + B > N:
                perm, pos = rs.permutation(N), 0
            idx = np.sort(perm[pos : pos + B])
            pos += B
            Xb = np.ascontiguousarray(X[idx], dtype=np.float64)
            tb = np.ascontiguousarray(t[idx], dtype=np.float64)
            value, g = model.elbo(Xb, tb, scale=N / B, with_grad=True)
            x = adam.step(x, -packer.grad(g) / N)
            packer.set(x)
            window.append(value)
            if it % steps_per_epoch == 0 or it == self.max_iter:
                elbo = float(np.mean(window))
                window = []
                rate = it * B / max(time.perf_counter() - t_start, 1e-12)
                if self._report(it, elbo, rate):
                    break
                if self.tol > 0:
                    if elbo > best + self.tol * abs(best if np.isfinite(best) else elbo):
                        best, patience = elbo, 0
                    else:
                        patience += 1
                        if patience >= 3:
                            break
        self.n_iter_ = it

    # ---------------------------------------------------------------- prediction
    def predict_latent(self, X):
        """Mean [T] and variance [T] of the latent function at X [T, D]."""
        check_is_fitted(self, "model_")
        X = validate_data(self, X, dtype=np.float64, order="C", reset=False)
        return self.model_.predict_f(X)


_COMMON_DOC = """
    Parameters
    ----------
    kernel : pygpfast.kernels.Kernel, optional
        Prior covariance. Default: RBF with ARD lengthscales from the median-distance heuristic.
    n_inducing : int
        Number of inducing points M (initialised by k-means on at most max(20 M, 20000) rows).
    inducing_points : array_like [M, D], optional
        Initial inducing inputs (overrides n_inducing).
    method : {'kl', 'mf'}
        'kl': the KL method of seed 000 section 4. 'mf': the sparse mean-field method of
        section 3.1 (SVGPClassifier with link='probit' only; full-batch L-BFGS-B; ``elbo_`` is
        then its bound, eq. 12, predictions use its Gaussian approximation of q(u), and
        ``whiten`` does not apply).
    whiten : bool
        Whitened parameterisation (default).
    optimizer : {'auto', 'lbfgs', 'adam'}
        'auto' uses full-batch L-BFGS-B up to 10 000 rows and minibatch Adam above.
    batch_size : int or 'auto'
        Minibatch size for Adam ('auto' = 256).
    learning_rate : float
        Adam step size.
    max_iter : int
        L-BFGS-B iterations or Adam steps.
    tol : float
        Relative ELBO tolerance for stopping.
    train_inducing : bool
        Learn Z.
    optimize_hyperparameters : bool
        Learn the kernel and likelihood parameters.
    jitter : float
        Added to the diagonal of K(Z, Z).
    random_state : int, RandomState or None
    verbose : int
        Print progress every `verbose` iterations (0 = silent).
    callback : callable, optional
        ``callback(estimator, iteration, elbo)``; return True to stop.
"""


class SVGPClassifier(ClassifierMixin, _SVGPEstimator):
    __doc__ = (
        "Binary Gaussian-process classifier with a sparse variational posterior (SVGP).\n"
        + _COMMON_DOC
        + """    link : {'probit', 'logit'}
        Bernoulli link.

    Attributes
    ----------
    classes_ : ndarray [2]
    model_ : SVGP
    kernel_, likelihood_, inducing_points_ [M, D], elbo_, history_, n_iter_
    mf_a_ : ndarray [N]
        method='mf' only: locations a of the truncated Gaussians q(g_n) (seed 000 eq. 11).
    """
    )

    def __init__(self, kernel=None, *, link="probit", n_inducing=100, inducing_points=None,
                 method="kl", whiten=True, optimizer="auto", batch_size="auto", learning_rate=0.01,
                 max_iter=1000, tol=1e-6, train_inducing=True, optimize_hyperparameters=True,
                 jitter=1e-6, random_state=None, verbose=0, callback=None):
        self.kernel = kernel
        self.link = link
        self.n_inducing = n_inducing
        self.inducing_points = inducing_points
        self.method = method
        self.whiten = whiten
        self.optimizer = optimizer
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.tol = tol
        self.train_inducing = train_inducing
        self.optimize_hyperparameters = optimize_hyperparameters
        self.jitter = jitter
        self.random_state = random_state
        self.verbose = verbose
        self.callback = callback

    def _likelihood_for_fit(self):
        return _likelihoods.Bernoulli(link=self.link)

    def _encode_targets(self, y):
        check_classification_targets(y)
        self._label_encoder = LabelEncoder().fit(y)
        self.classes_ = self._label_encoder.classes_
        if len(self.classes_) != 2:
            raise ValueError(
                f"SVGPClassifier handles binary problems; y has {len(self.classes_)} classes"
            )
        return self._label_encoder.transform(y).astype(np.float64)

    def predict_proba(self, X):
        """Class probabilities [T, 2] (columns in the order of ``classes_``)."""
        mean, var = self.predict_latent(X)
        p1, _ = self.likelihood_.predict_mean_and_var(mean, var)
        p1 = np.clip(p1, 0.0, 1.0)
        return np.column_stack([1.0 - p1, p1])

    def predict(self, X):
        """Most probable class [T]."""
        p1 = self.predict_proba(X)[:, 1]
        return self.classes_[(p1 > 0.5).astype(int)]

    def predict_log_proba(self, X):
        """log p(y = class | X) [T, 2], computed in log space."""
        mean, var = self.predict_latent(X)
        n = len(mean)
        lp0 = self.likelihood_.predict_log_density(np.zeros(n), mean, var)
        lp1 = self.likelihood_.predict_log_density(np.ones(n), mean, var)
        return np.column_stack([lp0, lp1])


class SVGPRegressor(RegressorMixin, _SVGPEstimator):
    __doc__ = (
        "Sparse variational GP regression (Gaussian likelihood; seed 001's model).\n"
        + _COMMON_DOC
        + """    noise_variance : float
        Initial Gaussian noise variance (learned with the hyperparameters).

    Attributes
    ----------
    model_ : SVGP
    kernel_, likelihood_, inducing_points_ [M, D], elbo_, history_, n_iter_
    """
    )

    def __init__(self, kernel=None, *, noise_variance=1.0, n_inducing=100, inducing_points=None,
                 method="kl", whiten=True, optimizer="auto", batch_size="auto", learning_rate=0.01,
                 max_iter=1000, tol=1e-6, train_inducing=True, optimize_hyperparameters=True,
                 jitter=1e-6, random_state=None, verbose=0, callback=None):
        self.kernel = kernel
        self.noise_variance = noise_variance
        self.n_inducing = n_inducing
        self.inducing_points = inducing_points
        self.method = method
        self.whiten = whiten
        self.optimizer = optimizer
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.max_iter = max_iter
        self.tol = tol
        self.train_inducing = train_inducing
        self.optimize_hyperparameters = optimize_hyperparameters
        self.jitter = jitter
        self.random_state = random_state
        self.verbose = verbose
        self.callback = callback

    def _likelihood_for_fit(self):
        return _likelihoods.Gaussian(variance=self.noise_variance)

    def _encode_targets(self, y):
        return as_vector(y, "y").astype(np.float64)

    def predict(self, X, return_std=False):
        """Predictive mean [T] of y, and its standard deviation [T] (noise included)."""
        mean, var = self.predict_latent(X)
        if not return_std:
            return mean
        ymean, yvar = self.likelihood_.predict_mean_and_var(mean, var)
        return ymean, np.sqrt(yvar)
