"""pygpfast._core.likelihoods: quadrature, variational expectations, predictive densities."""

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

# quadrature and likelihoods (kind: 0 Gaussian, 1 Bernoulli-probit, 2 Bernoulli-logit, 3 Poisson,
# 4 softmax, 5 robust-max)
def gauss_hermite(n: int) -> tuple[F64, F64]: ...
# (num_classes: 0 for the likelihoods of one latent function, C >= 2 for the softmax and robust-max;
# mu, var and the per-latent outputs are [N], or [N, C] for those two)
def variational_expectations(
    kind: int, param: float, n_gh: int, num_classes: int, y: F64, mu: F64, var: F64
) -> tuple[F64, F64, F64, F64]: ...
def check_labels(kind: int, param: float, n_gh: int, num_classes: int, y: F64) -> None: ...
def predict_mean_and_var(
    kind: int, param: float, n_gh: int, num_classes: int, mu: F64, var: F64
) -> tuple[F64, F64]: ...
def predict_log_density(
    kind: int, param: float, n_gh: int, num_classes: int, y: F64, mu: F64, var: F64
) -> F64: ...
def predict_log_class_probabilities(
    kind: int, param: float, n_gh: int, num_classes: int, mu: F64, var: F64
) -> F64: ...  # softmax and robust-max only: [N, C]
