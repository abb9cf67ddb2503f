"""Type stubs for pygpfast._core.cvi: concave variational inference for full GPs (seed 004).

The local bound is passed as the seven values of ``pygpfast.cvi.LocalBound._core_args()``:
kind (0 logit, 1 Poisson, 2 multinomial, 3 stick-breaking, 4 ordinal), the llp bound's knots
[R + 1], a, b, c [R], num_classes and thresholds [K - 1]. The kernel (codes, params), the local
bound and the data (X or Sigma, y) are positional; everything after them is keyword-only.
Latent arrays are [L, N] (latent-major).
"""

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

def local_bounds(
    kind: int, knots: F64, a: F64, b: F64, c: F64, num_classes: int, thresholds: F64,
    y: F64, *, m: F64, v: F64,
) -> tuple[F64, F64, F64, F64, F64]: ...  # (value [N], dm, dv, d2m [L, N], dthresholds [K-1])
def infer(
    kind: int, knots: F64, a: F64, b: F64, c: F64, num_classes: int, thresholds: F64,
    y: F64, Sigma: F64, *, mean: F64, alpha: F64, lambda_: F64, max_iter: int, tol: float,
    block_size: int, max_newton: int, skip_tol: float, coupled_means: bool, return_V: bool,
) -> tuple[dict, F64, F64, F64 | None]: ...  # (result, alpha, lambda, V [L, N, N] | None)
def fit_step(
    codes: NDArray[np.int32], params: F64,
    kind: int, knots: F64, a: F64, b: F64, c: F64, num_classes: int, thresholds: F64,
    X: F64, y: F64, *, mean: F64, jitter: float, alpha: F64, lambda_: F64, max_iter: int,
    tol: float, block_size: int, max_newton: int, skip_tol: float, with_grad: bool,
    return_Pi: bool,
) -> tuple[dict, F64, F64, tuple[F64, F64, F64] | None, F64 | None]: ...
def oa_objective(
    kind: int, knots: F64, a: F64, b: F64, c: F64, num_classes: int, thresholds: F64,
    y: F64, Sigma: F64, *, mean: F64, alpha: F64, lambda_: F64,
) -> tuple[float, F64, F64, float, float]: ...  # (value, d_alpha, d_lambda, flops, evaluations)
def prior_covariance(
    codes: NDArray[np.int32], params: F64, X: F64, *, jitter: float
) -> F64: ...
def predictive_factor(
    codes: NDArray[np.int32], params: F64, X: F64, *, jitter: float, lambda_: F64,
) -> F64: ...  # F [L, N, N]
def predict_f(
    codes: NDArray[np.int32], params: F64, X: F64, Xnew: F64, *, mean: F64, alpha: F64,
    lambda_: F64, F: F64,
) -> tuple[F64, F64]: ...  # (mean [T, L], var [T, L])
