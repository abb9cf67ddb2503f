"""Type stubs for pygpfast._core, the compiled core (private; use the public API).

Arrays are float64 C-contiguous unless stated; kernel ``codes`` are int32. Shapes follow
GPflow's glossary: X [N, D], X2 [M, D], Z [M, D].
"""

import numpy as np
from numpy.typing import NDArray

from . import moe as moe

F64 = NDArray[np.float64]

blas_source: str

# threads
def get_num_threads() -> int: ...
def set_num_threads(n: int) -> None: ...
def enter_one_blas_thread() -> bool: ...
def leave_one_blas_thread() -> None: ...
def blas_threads() -> int: ...
def openmp_enabled() -> bool: ...

# BLAS table and linear algebra
def blas_gemm(A: F64, B: F64, trans_a: bool = False, trans_b: bool = False) -> F64: ...
def cholesky(
    A: F64, initial_relative_jitter: float = 1e-10, max_relative_jitter: float = 1e-4
) -> tuple[F64, float]: ...
def solve_lower(L: F64, B: F64, transpose: bool = False) -> F64: ...
def cholesky_update(L: F64, x: F64) -> F64: ...
def cholesky_downdate(L: F64, x: F64) -> F64: ...

# kernels
def kernel_K(codes: NDArray[np.int32], params: F64, X: F64, X2: F64 | None) -> F64: ...
def kernel_Kdiag(codes: NDArray[np.int32], params: F64, X: F64) -> F64: ...
def kernel_K_vjp(
    codes: NDArray[np.int32],
    params: F64,
    X: F64,
    X2: F64 | None,
    G: F64,
    want_dX: bool = False,
    want_dX2: bool = False,
    values: F64 | None = None,
) -> tuple[F64, F64 | None, F64 | None]: ...
def kernel_Kdiag_vjp(codes: NDArray[np.int32], params: F64, X: F64, g: F64) -> F64: ...

# quadrature and likelihoods (kind: 0 Gaussian, 1 Bernoulli-probit, 2 Bernoulli-logit, 3 Poisson,
# 4 softmax)
def gauss_hermite(n: int) -> tuple[F64, F64]: ...
# (num_classes: 0 for the likelihoods of one latent function, C >= 2 for the softmax; mu, var and
# the per-latent outputs are [N], or [N, C] for the softmax)
def variational_expectations(
    kind: int, variance: float, n_gh: int, num_classes: int, y: F64, mu: F64, var: F64
) -> tuple[F64, F64, F64, F64]: ...
def check_labels(kind: int, variance: float, n_gh: int, num_classes: int, y: F64) -> None: ...
def predict_mean_and_var(
    kind: int, variance: float, n_gh: int, num_classes: int, mu: F64, var: F64
) -> tuple[F64, F64]: ...
def predict_log_density(
    kind: int, variance: float, n_gh: int, num_classes: int, y: F64, mu: F64, var: F64
) -> F64: ...
def predict_log_class_probabilities(
    kind: int, variance: float, n_gh: int, num_classes: int, mu: F64, var: F64
) -> F64: ...  # softmax only: [N, C]

# SVGP
def svgp_elbo(
    codes: NDArray[np.int32],
    params: F64,
    lik_kind: int,
    lik_variance: float,
    n_gh: int,
    num_classes: int,
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
def svgp_predict_f(
    codes: NDArray[np.int32],
    params: F64,
    Z: F64,
    q_mu: F64,
    q_sqrt: F64,
    whiten: bool,
    Xnew: F64,
    jitter: float,
    prior_mean: F64 | None = None,
) -> tuple[F64, F64, float]: ...

# piecewise bounds on llp(x) = log(1 + e^x)
def piecewise_expected_bound(
    knots: F64, a: F64, b: F64, c: F64, m: F64, v: F64
) -> tuple[F64, F64, F64]: ...

# sparse mean-field SVGP (seed 000 section 3.1; y in {0, 1})
def svgp_mf_bound(
    codes: NDArray[np.int32],
    params: F64,
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
def svgp_mf_posterior(
    codes: NDArray[np.int32], params: F64, Z: F64, X: F64, y: F64, a: F64, jitter: float
) -> tuple[F64, F64, float]: ...

# concave variational inference (seed 004). Local bound: kind (0 logit, 1 Poisson,
# 2 multinomial, 3 stick-breaking, 4 ordinal), the llp bound's knots [R + 1], a, b, c [R],
# num_classes, thresholds [K - 1]. Latent arrays are [L, N] (latent-major).
def cvi_local_bounds(
    kind: int, knots: F64, a: F64, b: F64, c: F64, num_classes: int, thresholds: F64,
    y: F64, m: F64, v: F64,
) -> tuple[F64, F64, F64, F64, F64]: ...
def cvi_infer(
    kind: int, knots: F64, a: F64, b: F64, c: F64, num_classes: int, thresholds: F64,
    y: F64, Sigma: F64, mean: F64, alpha: F64, lambda_: F64, max_iter: int, tol: float,
    block_size: int, max_newton: int, skip_tol: float, return_V: bool,
) -> tuple[dict, F64, F64, F64 | None]: ...
def cvi_fit_step(
    codes: NDArray[np.int32], params: F64,
    kind: int, knots: F64, a: F64, b: F64, c: F64, num_classes: int, thresholds: F64,
    X: F64, y: F64, mean: F64, jitter: float, alpha: F64, lambda_: F64, max_iter: int,
    tol: float, block_size: int, max_newton: int, skip_tol: float, with_grad: bool,
    return_Pi: bool,
) -> tuple[dict, F64, F64, tuple[F64, F64, F64] | None, F64 | None]: ...
def cvi_oa_objective(
    kind: int, knots: F64, a: F64, b: F64, c: F64, num_classes: int, thresholds: F64,
    y: F64, Sigma: F64, mean: F64, alpha: F64, lambda_: F64,
) -> tuple[float, F64, F64, float, float]: ...
def cvi_prior_covariance(codes: NDArray[np.int32], params: F64, X: F64, jitter: float) -> F64: ...
def cvi_predictive_factor(
    codes: NDArray[np.int32], params: F64, X: F64, jitter: float, lambda_: F64,
) -> F64: ...
def cvi_predict_f(
    codes: NDArray[np.int32], params: F64, X: F64, mean: F64, alpha: F64, lambda_: F64, F: F64,
    Xnew: F64,
) -> tuple[F64, F64]: ...
