"""pygpfast._core.svgp: the SVGP ELBO with its gradients, predictions, and the sparse mean-field bound."""

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

def elbo(
    codes: NDArray[np.int32],
    params: F64,
    lik_kind: int,
    lik_param: float,
    n_gh: int,
    num_classes: int,
    *,
    Z: F64,
    q_mu: F64,
    q_sqrt: F64,
    whiten: bool,
    X: F64,
    y: F64,
    scale: float,
    jitter: float,
    with_grad: bool,
    natural: bool = False,
    path: str = "auto",
    return_path: bool = False,
    prior_mean: F64 | None = None,
) -> tuple: ...  # (elbo, ell, kl, extra_jitter, grads | None[, path]); grads ends with d_prior_mean
def predict_f(
    codes: NDArray[np.int32],
    params: F64,
    *,
    Z: F64,
    q_mu: F64,
    q_sqrt: F64,
    whiten: bool,
    Xnew: F64,
    jitter: float,
    prior_mean: F64 | None = None,
) -> tuple[F64, F64, float]: ...

# the sparse mean-field method (y in {0, 1})
def mf_bound(
    codes: NDArray[np.int32],
    params: F64,
    *,
    Z: F64,
    X: F64,
    y: F64,
    a: F64,
    jitter: float,
    solve_a: bool,
    max_iter: int,
    tol: float,
    with_grad: bool,
) -> tuple[float, F64, float, tuple[int, float, bool], tuple[F64, F64, F64] | None]: ...
def mf_posterior(
    codes: NDArray[np.int32], params: F64, *, Z: F64, X: F64, y: F64, a: F64, jitter: float
) -> tuple[F64, F64, float]: ...
