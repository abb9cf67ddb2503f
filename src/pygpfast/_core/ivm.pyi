"""pygpfast._core.ivm: the informative vector machine, binary and joint multi-class (greedy selection,
ADF sites, stub buffers, the constrained site projection, cubature, prediction, the bound)."""

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

def binary_adf(
    y: NDArray,
    h: NDArray,
    a: NDArray,
    *,
    likelihood: str = 'probit',
    bias: float = 0.0,
    noise_variance: float = 1.0,
    label_noise: float = 0.0,
) -> dict: ...
def binary_bound(
    codes: NDArray,
    params: NDArray,
    X: NDArray,
    y: NDArray,
    *,
    active: NDArray,
    site_b: NDArray,
    site_pi: NDArray,
    likelihood: str = 'probit',
    bias: float = 0.0,
    noise_variance: float = 1.0,
    label_noise: float = 0.0,
    n_gh: int = 32,
    with_grad: bool = True,
    distances: tuple[NDArray, float] | None = None,
) -> dict: ...
def binary_predict(
    codes: NDArray,
    params: NDArray,
    X_active: NDArray,
    *,
    site_pi: NDArray,
    L: NDArray,
    beta: NDArray,
    Xnew: NDArray,
    likelihood: str = 'probit',
    bias: float = 0.0,
    noise_variance: float = 1.0,
    label_noise: float = 0.0,
) -> dict: ...
def binary_select(
    codes: NDArray,
    params: NDArray,
    X: NDArray,
    y: NDArray,
    *,
    active_size: int,
    n_random: int = 2,
    seed: int = 0,
    likelihood: str = 'probit',
    bias: float = 0.0,
    noise_variance: float = 1.0,
    label_noise: float = 0.0,
    criterion: str = 'entropy',
) -> dict: ...
def cubature(
    rule: int,
    C: int,
) -> tuple[F64, F64]: ...
def multiclass_bound(
    codes: NDArray,
    params: NDArray,
    X: NDArray,
    y: NDArray,
    active: NDArray,
    pi: NDArray,
    b: NDArray,
    *,
    beta: object = None,
    rule: int = 0,
    with_grad: bool = False,
    distances: tuple[NDArray, float] | None = None,
) -> dict: ...
def multiclass_expected_nll(
    h: NDArray,
    A: NDArray,
    y: NDArray,
    *,
    beta: object = None,
    rule: int = 0,
) -> dict: ...
def multiclass_predict(
    codes: NDArray,
    params: NDArray,
    X_active: NDArray,
    pi: NDArray,
    b: NDArray,
    Xnew: NDArray,
    *,
    beta: object = None,
    rule: int = 0,
    with_cov: bool = True,
    with_prob: bool = True,
) -> dict: ...
def multiclass_project(
    h: NDArray,
    A: NDArray,
    h_hat: NDArray,
    A_hat: NDArray,
    pi0: NDArray,
    *,
    max_iterations: int = 50,
) -> dict: ...
def multiclass_projection_objective(
    A: NDArray,
    A_hat: NDArray,
    pi: NDArray,
) -> tuple[float, F64, F64]: ...
def multiclass_select(
    codes: NDArray,
    params: NDArray,
    X: NDArray,
    y: NDArray,
    *,
    num_classes: int,
    active_size: int,
    n_random: int = 2,
    seed: int = 0,
    rule: int = 0,
    keep_fraction: float = 0.5,
    selection_size: int = 0,
    beta: object = None,
    max_newton: int = 50,
    record_marginals: bool = False,
) -> dict: ...
def multiclass_tilted(
    h: NDArray,
    A: NDArray,
    y: NDArray,
    *,
    beta: object = None,
    rule: int = 0,
) -> dict: ...
