"""Pareto-smoothed importance sampling (PSIS; Vehtari, Simpson, Gelman, Yao & Gabry, "Pareto
smoothed importance sampling", arXiv:1507.02646 2015, JMLR 25(72) 2024): the largest weights are
replaced by the expected order statistics of a generalized Pareto distribution fitted to them
(Zhang & Stephens 2009, "A new and efficient estimation method for the generalized Pareto
distribution", Technometrics 51(3), with the weakly informative prior on the shape of Vehtari et
al.), truncated at the largest raw weight. The fitted shape k-hat says how far the estimate can
be trusted: below 0.5 fine, above 0.7 (or 1 - 1/log10(S) for small S) unreliable.
"""

import numpy as np
from scipy.special import logsumexp

__all__ = ["psis"]


def _fit_generalized_pareto(x):
    """(k, sigma) of a generalized Pareto fitted to x [n] > 0 (sorted ascending) by Zhang &
    Stephens' empirical-Bayes estimate, shrunk towards k = 0.5 by a prior worth 10 observations
    (Vehtari et al., Appendix C)."""
    n = x.size
    m = 30 + int(np.sqrt(n))
    quartile = x[max(int(n / 4 + 0.5) - 1, 0)]
    # candidate theta = -b of Zhang & Stephens' parameterisation (b < 1 / x_max)
    b = 1.0 / x[-1] + (1.0 - np.sqrt(m / (np.arange(1, m + 1) - 0.5))) / (3.0 * quartile)
    k = np.mean(np.log1p(-b[:, None] * x[None, :]), axis=1)
    profile = n * (np.log(-b / k) - k - 1.0)  # profile log likelihood of each candidate
    weight = 1.0 / np.sum(np.exp(profile[None, :] - profile[:, None]), axis=1)
    keep = weight >= 10 * np.finfo(float).eps
    weight, b = weight[keep] / weight[keep].sum(), b[keep]
    b_post = float(np.sum(b * weight))
    k_post = float(np.mean(np.log1p(-b_post * x)))
    sigma = -k_post / b_post
    k_post = (n * k_post + 10 * 0.5) / (n + 10)
    return k_post, sigma


def _generalized_pareto_quantile(p, k, sigma):
    if abs(k) < 1e-12:
        return -sigma * np.log1p(-p)
    return sigma * np.expm1(-k * np.log1p(-p)) / k


def psis(log_weights):
    """Pareto-smoothed log weights [S] (normalised: logsumexp 0) and the shape k-hat (inf when
    the tail has 4 or fewer weights, as for S < 10: no smoothing then).

    The tail is the M = ceil(min(S / 5, 3 sqrt(S))) largest weights."""
    lw = np.asarray(log_weights, dtype=np.float64).copy()
    S = lw.size
    lw -= lw.max()
    M = int(np.ceil(min(0.2 * S, 3.0 * np.sqrt(S))))
    order = np.argsort(lw, kind="stable")
    cutoff = max(lw[order[-M - 1]] if M < S else -np.inf, np.log(np.finfo(float).tiny))
    tail = np.flatnonzero(lw > cutoff)
    k = np.inf
    if tail.size > 4:
        t_order = tail[np.argsort(lw[tail], kind="stable")]
        excess = np.exp(lw[t_order]) - np.exp(cutoff)
        k, sigma = _fit_generalized_pareto(excess)
        if np.isfinite(k):
            p = (np.arange(tail.size) + 0.5) / tail.size
            smoothed = np.log(_generalized_pareto_quantile(p, k, sigma) + np.exp(cutoff))
            lw[t_order] = np.minimum(smoothed, 0.0)  # (truncated at the largest raw weight)
    return lw - logsumexp(lw), float(k)
