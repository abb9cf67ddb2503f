"""pygpfast._core.blas: the core's BLAS/LAPACK table (filled from scipy's at import)."""

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

thread_control: bool
source: str

def gemm(A: F64, B: F64, trans_a: bool = False, trans_b: bool = False) -> F64: ...
