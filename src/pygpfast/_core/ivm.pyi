"""Type stubs for pygpfast._core.ivm: the informative vector machine (seed 002).

Binary IVM (probit labels +-1, or Gaussian targets; ``noise_variance`` also scales the probit:
P(y | u) = Phi(y (u + bias) / sqrt(noise_variance))) and the joint multi-class IVM (softmax
over C latent functions, labels 0..C-1 as float64; ``params`` [P] for one kernel shared by the
classes or [C, P] for one per class, the same ``codes``). ``rule``: 0 the 3-point
Gauss-Hermite product (3^C nodes), 1 Stroud's degree-5 rule (2 C^2 + 1 nodes). Every entry
point releases the GIL.
"""

from typing import Any

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
I32 = NDArray[np.int32]

# binary
def binary_select(
    codes: I32,
    params: F64,
    X: F64,
    y: F64,
    *,
    active_size: int,
    n_random: int = 2,
    seed: int = 0,
    likelihood: str = "probit",
    bias: float = 0.0,
    noise_variance: float = 1.0,
    criterion: str = "entropy",
) -> dict[str, Any]: ...  # active (int32 [d]), site_b, site_pi, log_z, score, beta, xi [d],
# h, a [n], L [d, d], M [d, n], stats (dict)
def binary_adf(
    y: F64,
    h: F64,
    a: F64,
    *,
    likelihood: str = "probit",
    bias: float = 0.0,
    noise_variance: float = 1.0,
) -> dict[str, F64]: ...  # log_z, alpha, nu, site_b, site_pi [n]
def binary_predict(
    codes: I32,
    params: F64,
    X_active: F64,
    *,
    site_pi: F64,
    L: F64,
    beta: F64,
    Xnew: F64,
    likelihood: str = "probit",
    bias: float = 0.0,
    noise_variance: float = 1.0,
) -> dict[str, F64]: ...  # mean, var [T] (bias not included), proba [T] (probit)
def binary_bound(
    codes: I32,
    params: F64,
    X: F64,
    y: F64,
    *,
    active: NDArray[np.integer],
    site_b: F64,
    site_pi: F64,
    likelihood: str = "probit",
    bias: float = 0.0,
    noise_variance: float = 1.0,
    n_gh: int = 32,
    with_grad: bool = True,
) -> dict[str, Any]: ...  # value, expected_neg_log_lik, kl, h, a [n]; with_grad: grad_params [P],
# grad_bias, grad_noise_variance

# multi-class
def cubature(rule: int, C: int) -> tuple[F64, F64]: ...  # nodes [N, C], weights [N]
def multiclass_tilted(
    h: F64, A: F64, y: F64, *, beta: F64 | None = None, rule: int = 0
) -> dict[str, Any]: ...  # log_Z [m], mean [m, C], cov [m, C, C], p_cavity [m, C], valid [m]
def multiclass_expected_nll(
    h: F64, A: F64, y: F64, *, beta: F64 | None = None, rule: int = 0
) -> dict[str, F64]: ...  # value [m], g_h [m, C], G_A [m, C, C]
def multiclass_project(
    h: F64, A: F64, h_hat: F64, A_hat: F64, pi0: F64, *, max_iterations: int = 50
) -> dict[str, Any]: ...  # pi, b, g [C], objective, iterations, majoriser_steps, converged
def multiclass_projection_objective(A: F64, A_hat: F64, pi: F64) -> tuple[float, F64, F64]: ...
def multiclass_select(
    codes: I32,
    params: F64,
    X: F64,
    y: F64,
    *,
    num_classes: int,
    active_size: int,
    n_random: int = 2,
    seed: int = 0,
    rule: int = 0,
    keep_fraction: float = 0.5,
    selection_size: int = 0,
    beta: F64 | None = None,
    max_newton: int = 50,
    record_marginals: bool = False,
) -> dict[str, Any]: ...  # active (int64 [d]), pi, b [d, C], h [n, C], A [n, C, C], scores,
# log_Z, newton_iterations, newton_converged, score_seconds, update_seconds [d],
# quadrature_fallbacks; with record_marginals history_h [d, n, C], history_A [d, n, C, C]
def multiclass_predict(
    codes: I32,
    params: F64,
    X_active: F64,
    pi: F64,
    b: F64,
    Xnew: F64,
    *,
    beta: F64 | None = None,
    rule: int = 0,
    with_cov: bool = True,
    with_prob: bool = True,
) -> dict[str, F64 | None]: ...  # mean [T, C], cov [T, C, C] or None, prob [T, C] or None
def multiclass_bound(
    codes: I32,
    params: F64,
    X: F64,
    y: F64,
    active: NDArray[np.int64],
    pi: F64,
    b: F64,
    *,
    beta: F64 | None = None,
    rule: int = 0,
    with_grad: bool = False,
) -> dict[str, Any]: ...  # value, expected_nll, kl; d_params (like params), d_beta [C] or None
