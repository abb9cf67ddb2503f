"""The work of IS-MOE on a batch of importance samples, with no estimator in it: draw each
sample's partition (:mod:`._proposal`), fit its experts in one call of the compiled core
(``_core.moe.fit_blocks``: every (sample, expert) block on OpenMP threads), and return what the
weights and the predictions need. :func:`fit_chunk` is a plain function of arrays, so a Dask
worker runs it as it is (:mod:`._dask`).
"""

from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from .. import _core
from .._base import _optimize
from .._threads import one_blas_thread
from ..priors import LogNormal
from . import _proposal


@dataclass(frozen=True)
class Config:
    """Everything a chunk's fit needs besides the data (picklable, small)."""

    codes: np.ndarray  # int32 kernel codes
    params0: np.ndarray  # [P] starting kernel parameters
    likelihood: str  # 'gaussian', 'probit', 'logit'
    K: int
    B: int
    partition: str  # 'gmm' or 'random'
    prior: _proposal.Prior
    seed: int
    gamma: float  # the weight's power on the block evidences (1, or N / B)
    share: bool  # one kernel per sample, shared by its experts
    optimize: bool
    noise0: float
    lower: np.ndarray  # [P + 2] bounds in u = (log params, log noise, mean)
    upper: np.ndarray
    max_iter: int
    tol: float
    jitter: float
    min_block_size: int
    fit_mean: bool
    # [P + 2] each, in u: a Gaussian prior on each coordinate (scale 0: none), or None for
    # plain type-II maximum likelihood
    prior_loc: np.ndarray = None
    prior_scale: np.ndarray = None

    @property
    def gaussian(self):
        return self.likelihood == "gaussian"


def _csr(blocks):
    offsets = np.zeros(len(blocks) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([b.size for b in blocks])
    rows = np.concatenate(blocks).astype(np.int64) if blocks else np.zeros(0, np.int64)
    return offsets, rows


def _fit_call(cfg, X, y, offsets, rows, *, params, noise, mean, optimize):
    return _core.moe.fit_blocks(
        cfg.codes, params, X, y, offsets, rows, likelihood=cfg.likelihood, optimize=optimize,
        max_iter=cfg.max_iter, tol=cfg.tol, noise_variance=noise, mean=mean,
        fit_noise=True, fit_mean=cfg.fit_mean and cfg.gaussian, lower=cfg.lower, upper=cfg.upper,
        scale=1.0, jitter=max(cfg.jitter, 1e-10), max_jitter=max(cfg.jitter, 1e-4),
        prior_loc=cfg.prior_loc, prior_scale=cfg.prior_scale)


def log_prior(cfg, u):
    """(sum of the log densities of u's coordinates under cfg's prior, gradient) for u [n_u]
    (the first n_u coordinates of the core's P + 2): LogNormal's densities on the coordinates
    with a prior; (0, 0) without one."""
    grad = np.zeros(u.size)
    on = np.zeros(u.size, dtype=bool) if cfg.prior_loc is None else cfg.prior_scale[:u.size] > 0
    if not on.any():
        return 0.0, grad
    prior = LogNormal(cfg.prior_loc[:u.size][on], cfg.prior_scale[:u.size][on])
    grad[on] = prior.grad(u[on])
    return float(np.sum(prior.log_density(u[on]))), grad


def _shared_theta(cfg, X, y, blocks):
    """One sample's kernel (and noise) shared by its experts: L-BFGS-B on the sum of the block
    evidences (each from ``_core.moe.block_evidence``) plus the log prior, in u = (log params,
    log noise[, mean])."""
    P = cfg.params0.size
    gaussian = cfg.gaussian
    n_u = P + (2 if gaussian and cfg.fit_mean else 1 if gaussian else 0)
    u0 = np.concatenate([np.log(cfg.params0), [np.log(cfg.noise0)] if gaussian else [],
                         [0.0] if gaussian and cfg.fit_mean else []])
    sub = [(np.ascontiguousarray(X[r]), np.ascontiguousarray(y[r])) for r in blocks]

    def objective(u):
        params = np.exp(u[:P])
        noise = float(np.exp(u[P])) if gaussian else 1.0
        mean = float(u[P + 1]) if gaussian and cfg.fit_mean else 0.0
        value, grad = log_prior(cfg, u)
        for Xb, yb in sub:
            r = _core.moe.block_evidence(cfg.codes, params, Xb, yb, likelihood=cfg.likelihood,
                                         noise_variance=noise, mean=mean, with_grad=True,
                                         jitter=max(cfg.jitter, 1e-10))
            value += r["log_evidence"]
            grad[:P] += r["d_params"] * params
            if gaussian:
                grad[P] += r["d_noise_variance"] * noise
                if cfg.fit_mean:
                    grad[P + 1] += r["d_mean"]
        return -value, -grad

    bounds = list(zip(cfg.lower[:n_u], cfg.upper[:n_u]))
    # (small blocks, one after another: the BLAS on one thread, as fit_blocks runs each block;
    # threaded BLAS on blocks of ~100 rows ran 10-50 times slower on the loaded 2-core machine)
    with one_blas_thread():
        res = _optimize.lbfgs(objective, u0, bounds=bounds, max_iter=cfg.max_iter, ftol=cfg.tol,
                              gtol=1e-6)
    u = res.x
    return (np.exp(u[:P]), float(np.exp(u[P])) if gaussian else 1.0,
            float(u[P + 1]) if gaussian and cfg.fit_mean else 0.0)


def fit_chunk(X, Xs, y, cfg, samples):
    """Fit the importance samples `samples` (ints) on X [N, D] (Xs: standardised, for the
    proposal), y [N]. Returns a dict of arrays; blocks in sample order, then expert order:

    ``samples`` [S], ``log_weight`` [S] (gamma x the sum of the sample's block log evidences),
    ``n_blocks`` [S], ``expert`` [blocks], ``offsets`` [blocks + 1], ``rows`` [offsets[-1]] (into
    X), ``params`` [blocks, P], ``noise_variance``, ``mean``, ``log_evidence`` [blocks],
    ``iterations`` [blocks], ``alpha`` [rows], ``factor`` (the blocks' Cholesky factors, one after
    another), ``W`` [rows] (Laplace), ``log_pi`` [S, K], ``mu`` [S, K, D], ``R`` [S, K, D, D]
    (the mixtures; absent for partition='random').
    """
    # (the BLAS on one thread for the whole chunk, also where only threadpoolctl can set it:
    # see _threads.one_blas_thread)
    with one_blas_thread(process_wide=True):
        return _fit_samples(X, Xs, y, cfg, samples)


def _fit_samples(X, Xs, y, cfg, samples):
    """:func:`fit_chunk`'s work."""
    draws = [_proposal.draw_sample(Xs, cfg.seed, j, K=cfg.K, B=cfg.B, partition=cfg.partition,
                                   prior=cfg.prior) for j in samples]
    blocks, experts, owner = [], [], []
    for s, d in enumerate(draws):
        for k, r in d.blocks:
            blocks.append(r)
            experts.append(k)
            owner.append(s)
    n = np.array([b.size for b in blocks])
    P = cfg.params0.size
    nb = len(blocks)
    params = np.tile(cfg.params0, (nb, 1))
    noise = np.full(nb, cfg.noise0)
    mean = np.zeros(nb)
    optimize = np.full(nb, cfg.optimize and not cfg.share)
    if cfg.share and cfg.optimize:
        for s in range(len(draws)):
            idx = [p for p in range(nb) if owner[p] == s]
            theta, s2, m = _shared_theta(cfg, X, y, [blocks[p] for p in idx])
            params[idx], noise[idx], mean[idx] = theta, s2, m
    # Blocks under min_block_size keep the starting (or the sample's shared) hyperparameters:
    # ML-II on a handful of rows is wild (note section 4).
    optimize &= n >= cfg.min_block_size
    out = {k: None for k in ("params", "noise_variance", "mean", "log_evidence", "iterations")}
    out.update(params=np.empty((nb, P)), noise_variance=np.empty(nb), mean=np.empty(nb),
               log_evidence=np.empty(nb), iterations=np.zeros(nb, dtype=np.int32))
    per_block = {}
    for flag in (True, False):
        sel = np.flatnonzero(optimize == flag)
        if sel.size == 0:
            continue
        offsets, rows = _csr([blocks[p] for p in sel])
        r = _fit_call(cfg, X, y, offsets, rows, params=np.ascontiguousarray(params[sel]),
                      noise=np.ascontiguousarray(noise[sel]), mean=np.ascontiguousarray(mean[sel]),
                      optimize=flag)
        out["params"][sel] = r["params"]
        out["log_evidence"][sel] = r["log_evidence"]
        out["iterations"][sel] = r["iterations"]
        if cfg.gaussian:
            out["noise_variance"][sel] = r["noise_variance"]
            out["mean"][sel] = r["mean"]
        fo = r["factor_offsets"]
        for c, p in enumerate(sel):
            a, b = offsets[c], offsets[c + 1]
            per_block[p] = (r["alpha"][a:b], r["factor"][fo[c]:fo[c + 1]],
                            r["W"][a:b] if not cfg.gaussian else None)
    if not cfg.gaussian:
        out["noise_variance"][:] = 0.0
        out["mean"][:] = 0.0
    offsets, rows = _csr(blocks)
    owner = np.asarray(owner, dtype=np.int64)
    log_weight = cfg.gamma * np.bincount(owner, weights=out["log_evidence"], minlength=len(draws))
    res = {
        "samples": np.asarray(samples, dtype=np.int64),
        "log_weight": log_weight,
        "n_blocks": np.bincount(owner, minlength=len(draws)).astype(np.int64),
        "expert": np.asarray(experts, dtype=np.int64),
        "offsets": offsets,
        "rows": rows,
        "alpha": np.concatenate([per_block[p][0] for p in range(nb)]),
        "factor": np.concatenate([per_block[p][1] for p in range(nb)]),
        **out,
    }
    if not cfg.gaussian:
        res["W"] = np.concatenate([per_block[p][2] for p in range(nb)])
    if cfg.partition == "gmm":
        res["log_pi"] = np.stack([d.log_pi for d in draws])
        res["mu"] = np.stack([d.mu for d in draws])
        res["R"] = np.stack([d.R for d in draws])
    return res


# ---------------------------------------------------------------------- the fitted state

_PER_SAMPLE = ("log_pi", "mu", "R")
_PER_BLOCK = ("expert", "params", "noise_variance", "mean", "log_evidence", "iterations")
_PER_ROW = ("rows", "alpha", "W")


def merge(parts):
    """One state (the dict of :func:`fit_chunk`) from several, in their order."""
    nonempty = [p for p in parts if p["samples"].size]
    parts = nonempty or parts[:1]
    out = {}
    for key in parts[0]:
        if key == "offsets":
            sizes = np.concatenate([np.diff(p["offsets"]) for p in parts])
            out[key] = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        else:
            out[key] = np.concatenate([p[key] for p in parts])
    return out


def select_samples(state, keep):
    """The state of the samples where `keep` [S] (bool) is true."""
    keep = np.asarray(keep, dtype=bool)
    nb = state["n_blocks"]
    block_keep = np.repeat(keep, nb)
    sizes = np.diff(state["offsets"])
    row_keep = np.repeat(block_keep, sizes)
    fsizes = sizes ** 2
    factor_keep = np.repeat(block_keep, fsizes)
    out = {}
    for key, value in state.items():
        if key in ("samples", "log_weight", "n_blocks") or key in _PER_SAMPLE:
            out[key] = value[keep]
        elif key in _PER_BLOCK:
            out[key] = value[block_keep]
        elif key in _PER_ROW:
            out[key] = value[row_keep]
        elif key == "factor":
            out[key] = value[factor_keep]
        elif key == "offsets":
            out[key] = np.concatenate([[0], np.cumsum(sizes[block_keep])]).astype(np.int64)
    return out


#: Samples whose weight is below 1e-16 of the largest (log weight this far below it) are left
#: out of the fitted state and of predictions: their share of any mixture prediction is below
#: float64 rounding. (The running maximum only grows, so the fit may drop them as it goes.)
PRUNE_LOG_RATIO = float(np.log(1e16))


def prune(state):
    """Drop the samples whose weight is negligible (see PRUNE_LOG_RATIO)."""
    lw = state["log_weight"]
    keep = lw >= lw.max() - PRUNE_LOG_RATIO
    return state if keep.all() else select_samples(state, keep)


def normalised(log_weight):
    """Self-normalised weights exp(log w - logsumexp(log w))."""
    return np.exp(log_weight - logsumexp(log_weight))
