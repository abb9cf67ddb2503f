"""pygpfast._core.kernels: kernel matrices and their vector-Jacobian products."""

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

def K(
    codes: NDArray[np.int32], params: F64, X: F64, X2: F64 | None, *, distances: bool = False
) -> F64: ...
def Kdiag(codes: NDArray[np.int32], params: F64, X: F64) -> F64: ...
def squared_distances(X: F64, X2: F64) -> tuple[F64, float]: ...
def K_vjp(
    codes: NDArray[np.int32],
    params: F64,
    X: F64,
    X2: F64 | None,
    G: F64,
    want_dX: bool = False,
    want_dX2: bool = False,
    values: F64 | None = None,
    *,
    distances: bool = False,
) -> tuple[F64, F64 | None, F64 | None]: ...
def Kdiag_vjp(codes: NDArray[np.int32], params: F64, X: F64, g: F64) -> F64: ...
def dimension_spread(rows: F64, others: F64) -> F64: ...
