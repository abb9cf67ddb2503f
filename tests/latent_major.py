"""cvi.infer and cvi.oa_objective with their latent arrays latent-major [L, N], as the dense
references of tests/dense.py and the core take them; the API's are [N, L]."""

import dataclasses

import numpy as np

from pygpfast import cvi


def _T(x):
    return None if x is None else np.asarray(x, dtype=float).T


def infer(Sigma, y, lb, *, alpha=None, lambda_=None, **kw):
    """cvi.infer with alpha, lambda_ (in and out) [L, N]."""
    r = cvi.infer(Sigma, y, lb, alpha=_T(alpha), lambda_=_T(lambda_), **kw)
    return dataclasses.replace(r, alpha=r.alpha.T, lambda_=r.lambda_.T)


def oa_objective(Sigma, y, lb, alpha, lambda_, **kw):
    """cvi.oa_objective with alpha, lambda_ and the gradients [L, N]."""
    value, da, dl = cvi.oa_objective(Sigma, y, lb, _T(alpha), _T(lambda_), **kw)
    return value, da.T, dl.T
