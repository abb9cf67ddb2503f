"""Type stubs for pygpfast._core.moe: the per-expert work of IS-MOE (csrc/include/pygpfast/moe/
experts.hpp). Blocks are CSR: offsets int64 [blocks + 1], rows int64 [offsets[-1]] into X [N, D].
Kernel parameters are [P] shared or [blocks, P] per block; noise_variance and mean a float or
[blocks]; prior_loc, prior_scale, lower, upper [P + 2] in u = (log params, log noise, mean)."""

from typing import Any, Literal, Optional, Union

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
Likelihood = Literal["gaussian", "probit", "logit"]

def fit_blocks(
    codes: NDArray[np.int32], params: F64, X: F64, y: F64, offsets: I64, rows: I64, *,
    likelihood: Likelihood = "gaussian", optimize: bool = True, max_iter: int = 200,
    tol: float = 1e-10, gtol: float = 1e-6, noise_variance: Union[float, F64] = 1.0,
    mean: Union[float, F64] = 0.0, fit_noise: bool = True, fit_mean: bool = False,
    prior_loc: Optional[F64] = None, prior_scale: Optional[F64] = None,
    lower: Optional[F64] = None, upper: Optional[F64] = None, scale: float = 1.0,
    jitter: float = 1e-10, max_jitter: float = 1e-4, newton_max_iter: int = 100,
    newton_tol: float = 1e-10,
) -> dict[str, Any]:
    """Keys: params [blocks, P], log_evidence, log_prior, objective, jitter [blocks],
    iterations, evaluations, status (int32 [blocks]), alpha [rows], factor [sum n_p^2],
    factor_offsets [blocks + 1]; noise_variance, mean [blocks] (Gaussian) or f, W [rows]."""
    ...

def predict_blocks(
    codes: NDArray[np.int32], params: F64, X: F64, offsets: I64, rows: I64, Xnew: F64,
    alpha: F64, factor: F64, *, likelihood: Likelihood = "gaussian",
    noise_variance: Union[None, float, F64] = None, mean: Union[None, float, F64] = None,
    W: Optional[F64] = None,
) -> dict[str, F64]:
    """Keys: mean, var [T, blocks] (latent), and var_y (Gaussian) or prob (P(y = 1))."""
    ...

def block_evidence(
    codes: NDArray[np.int32], params: F64, X: F64, y: F64, *,
    likelihood: Likelihood = "gaussian", noise_variance: float = 1.0, mean: float = 0.0,
    with_grad: bool = True, jitter: float = 1e-10, max_jitter: float = 1e-4,
    newton_max_iter: int = 100, newton_tol: float = 1e-10,
) -> dict[str, Any]:
    """Keys: log_evidence, jitter, alpha [n], factor [n, n]; with with_grad d_params [P]
    (and d_noise_variance, d_mean for 'gaussian'); f, W, a [n], newton_iterations (Laplace)."""
    ...
