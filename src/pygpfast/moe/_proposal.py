"""The IS-MOE proposal over partitions (Zhang & Williamson, seed 003, eq. 1; notes/ismoe-math.md
sections 2 and 6): per importance sample j, a minibatch U_j of B rows, a Gaussian mixture phi_j
drawn from its Dirichlet x Normal-inverse-Wishart prior, and the labels z_ji ~ Cat(r_i(phi_j)) of
the rows of U_j; or, for partition="random", uniform labels.

Every draw of sample j comes from its own generator, seeded by (seed, j): a sample's partition
does not depend on where (thread, process, Dask worker) or with which other samples it is drawn.
Inputs are standardised (column means and scales of the training X) before the mixture sees them.
"""

from dataclasses import dataclass

import numpy as np

from .. import _core
from .._threads import one_blas_thread

_LOG_2PI = float(np.log(2.0 * np.pi))


@dataclass(frozen=True)
class Prior:
    """Dirichlet x NIW hyperparameters on standardised inputs (note section 2 defaults:
    mu0 = 0, nu = D + 3, Psi = (nu - D - 1) s^2 I with s^2 = K^(-2/D), lambda = s^2, alpha = 2)."""

    alpha: float
    nu: float
    psi: float  # Psi = psi * I
    lam: float

    @classmethod
    def default(cls, K, D, alpha=2.0):
        s2 = float(K) ** (-2.0 / D)
        nu = D + 3.0
        return cls(alpha=float(alpha), nu=nu, psi=(nu - D - 1.0) * s2, lam=s2)


def sample_generator(seed, j):
    """The generator of importance sample j."""
    return np.random.default_rng([int(seed), int(j)])


def draw_mixture(rng, K, D, prior):
    """phi ~ Dir(alpha 1_K) x prod_k NIW: (log_pi [K], mu [K, D], R [K, D, D]) with R_k the lower
    Cholesky factor of the precision Gamma_k^-1 (Bartlett: Gamma_k^-1 ~ Wishart(Psi^-1, nu))."""
    log_pi = np.log(np.maximum(rng.dirichlet(np.full(K, prior.alpha)), 1e-300))
    R = np.zeros((K, D, D))
    mu = np.empty((K, D))
    il = np.tril_indices(D, -1)
    scale = 1.0 / np.sqrt(prior.psi)
    for k in range(K):
        A = np.zeros((D, D))
        A[np.diag_indices(D)] = np.sqrt(rng.chisquare(prior.nu - np.arange(D)))
        A[il] = rng.standard_normal(il[0].size)
        R[k] = A * scale
        # mu_k ~ N(0, Gamma_k / lambda): Gamma_k = R^-T R^-1, so mu = R^-T z / sqrt(lambda)
        z = rng.standard_normal(D) / np.sqrt(prior.lam)
        mu[k] = np.linalg.solve(R[k].T, z)
    return log_pi, mu, R


def log_component_density(Xs, log_pi, mu, R, experts=None):
    """log pi_k + log N(x | mu_k, Gamma_k) [T, len(experts)] for standardised rows Xs [T, D]."""
    experts = np.arange(len(log_pi)) if experts is None else np.asarray(experts)
    T, D = Xs.shape
    E = experts.size
    Rk = R[experts]  # [E, D, D]
    # u_k = (x - mu_k) R_k = x R_k - mu_k R_k (R_k lower: |u_k|^2 = (x - mu_k)^T R_k R_k^T
    # (x - mu_k)), for every expert in one product with the R_k side by side [D, E D]. Through
    # the core's BLAS, which the scope holds to one thread: numpy's matmul calls numpy's own
    # BLAS on all its threads, 16 times slower here (20 experts x 3177 rows, D = 28, under load)
    with one_blas_thread(), np.errstate(over="ignore", invalid="ignore"):  # (-inf beyond ~1e154)
        u = _core.blas.gemm(Xs, Rk.transpose(1, 0, 2).reshape(D, E * D)).reshape(T, E, D)
        u -= np.einsum("ed,edf->ef", mu[experts], Rk)
        quad = np.einsum("ted,ted->te", u, u)
        quad[np.isnan(quad)] = np.inf  # (x R_k overflowed: inf - inf)
    const = (log_pi[experts] + np.log(np.diagonal(Rk, axis1=1, axis2=2)).sum(axis=1)
             - 0.5 * D * _LOG_2PI)
    return const - 0.5 * quad


def normalise_rows(a):
    """Subtract each row's log-sum-exp from a [T, K], in place, where the row has a finite
    entry; returns that mask [T]. (By hand: scipy's logsumexp costs 0.6 ms of checks per call,
    1.4 s of a 10 000-row prediction from 128 samples.)"""
    top = np.max(a, axis=1, keepdims=True)
    kept = top[:, 0] > -np.inf
    a[kept] -= top[kept] + np.log(np.sum(np.exp(a[kept] - top[kept]), axis=1, keepdims=True))
    return kept


def log_responsibilities(Xs, log_pi, mu, R, experts):
    """log rho_k(x) [T, len(experts)]: the components' log densities normalised over
    `experts`. A row at which every density underflows (a test point beyond about 1e154
    standard deviations from the data, whose squared distances overflow) goes, in equal
    shares, to the experts nearest to it in Mahalanobis distance: the limit of rho along
    its direction."""
    logr = log_component_density(Xs, log_pi, mu, R, experts)
    lost = np.flatnonzero(~normalise_rows(logr))
    if lost.size:
        far = Xs[lost]
        unit = np.maximum(np.max(np.abs(far), axis=1, keepdims=True), 1.0)
        dist = np.column_stack([np.sum(((far - mu[k]) / unit @ R[k]) ** 2, axis=1)
                                for k in experts])
        nearest = dist == np.min(dist, axis=1, keepdims=True)
        logr[lost] = np.where(nearest, -np.log(np.sum(nearest, axis=1, keepdims=True)), -np.inf)
    return logr


@dataclass
class Sample:
    """One importance sample's partition: the minibatch rows grouped by expert."""

    blocks: list  # [(expert k, sorted rows int64)] of the non-empty experts, k ascending
    log_pi: np.ndarray = None  # [K]   (None for the random partition)
    mu: np.ndarray = None  # [K, D]
    R: np.ndarray = None  # [K, D, D]


def draw_sample(Xs, seed, j, *, K, B, partition, prior):
    """Sample j's minibatch and partition. Xs [N, D]: the standardised training inputs."""
    rng = sample_generator(seed, j)
    N, D = Xs.shape
    U = np.arange(N, dtype=np.int64) if B >= N else np.sort(rng.choice(N, size=B, replace=False))
    if partition == "random":
        z = rng.integers(0, K, size=U.size)
        phi = (None, None, None)
    else:
        phi = draw_mixture(rng, K, D, prior)
        logr = log_component_density(Xs[U], *phi)
        normalise_rows(logr)
        cdf = np.cumsum(np.exp(logr), axis=1)
        u = rng.random(U.size) * cdf[:, -1]
        z = np.minimum((cdf < u[:, None]).sum(axis=1), K - 1)
    blocks = [(k, U[z == k]) for k in range(K) if np.any(z == k)]
    return Sample(blocks, *phi)
