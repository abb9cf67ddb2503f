"""pygpfast._core.piecewise: expectations of piecewise bounds on llp(x) = log(1 + e^x)."""

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

def expected_bound(
    knots: F64, a: F64, b: F64, c: F64, m: F64, v: F64
) -> tuple[F64, F64, F64]: ...
