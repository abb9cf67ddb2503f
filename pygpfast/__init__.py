"""pygpfast: fast Gaussian-process models with non-Gaussian likelihoods.

A C++17 core (BLAS/LAPACK through scipy's own BLAS, OpenMP for per-point loops) under a
scikit-learn style API.
"""

import os as _os

# OpenBLAS worker threads busy-wait for ~0.1 s after each threaded call by default; on a
# 2-core machine they then take the core from pygpfast's OpenMP loops that follow (measured:
# an SVGP step at M=64, B=4096 went from 18 ms to 56 ms). Ask them to sleep at once. This only
# takes effect for an OpenBLAS loaded after this line (scipy.linalg's, if not imported yet);
# a value set by the user is kept.
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from .exceptions import LinAlgError, NumericalWarning  # noqa: E402

try:
    from . import _core  # noqa: E402
except ImportError as e:  # pragma: no cover - only when the extension is missing
    raise ImportError(
        "pygpfast's compiled core (pygpfast._core) could not be imported. Install the package "
        "with `pip install .` (which compiles it), or for development build it in place with "
        "`cmake -S . -B build/dev -DPYGPFAST_BUILD_PYTHON=ON -DPYGPFAST_INPLACE=ON "
        f"&& cmake --build build/dev`. Original error: {e}"
    ) from e

from . import cvi, datasets, kernels, likelihoods, linalg, piecewise
from ._threads import get_num_threads, set_num_threads
from .cvi import VGPClassifier, VGPPoissonRegressor
from .svgp import SVGPClassifier, SVGPRegressor

__version__ = "0.1.0"

__all__ = [
    "LinAlgError",
    "NumericalWarning",
    "SVGPClassifier",
    "SVGPRegressor",
    "VGPClassifier",
    "VGPPoissonRegressor",
    "cvi",
    "datasets",
    "get_num_threads",
    "kernels",
    "likelihoods",
    "linalg",
    "piecewise",
    "set_num_threads",
    "__version__",
]
