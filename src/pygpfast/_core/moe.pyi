"""pygpfast._core.moe: IS-MOE's experts (exact GP and Laplace evidence with gradients, batched
fits and predictions of (sample, expert) blocks on OpenMP threads)."""

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

def block_evidence(
    codes: NDArray,
    params: NDArray,
    X: NDArray,
    y: NDArray,
    *,
    likelihood: str = 'gaussian',
    noise_variance: float = 1.0,
    mean: float = 0.0,
    with_grad: bool = True,
    jitter: float = 1e-10,
    max_jitter: float = 0.0001,
    newton_max_iter: int = 100,
    newton_tol: float = 1e-10,
) -> dict: ...
def fit_blocks(
    codes: NDArray,
    params: NDArray,
    X: NDArray,
    y: NDArray,
    offsets: NDArray,
    rows: NDArray,
    *,
    likelihood: str = 'gaussian',
    optimize: bool = True,
    max_iter: int = 200,
    tol: float = 1e-10,
    gtol: float = 1e-06,
    noise_variance: object = 1.0,
    mean: object = 0.0,
    fit_noise: bool = True,
    fit_mean: bool = False,
    prior_loc: object = None,
    prior_scale: object = None,
    lower: object = None,
    upper: object = None,
    scale: float = 1.0,
    jitter: float = 1e-10,
    max_jitter: float = 0.0001,
    newton_max_iter: int = 100,
    newton_tol: float = 1e-10,
) -> dict: ...
def predict_blocks(
    codes: NDArray,
    params: NDArray,
    X: NDArray,
    offsets: NDArray,
    rows: NDArray,
    Xnew: NDArray,
    alpha: NDArray,
    factor: NDArray,
    *,
    likelihood: str = 'gaussian',
    noise_variance: object = None,
    mean: object = None,
    W: object = None,
    test_offsets: object = None,
    test_rows: object = None,
) -> dict: ...
