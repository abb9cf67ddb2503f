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

# The core's OpenMP threads wait passively (sleep) at barriers. libgomp spins by default for up to
# ~0.1 ms first; when another process holds one of two cores, the spinning thread takes CPU from
# the thread it waits for (measured, SVGP step M=64, B=4096 with one busy core: 7.1 ms spinning
# against 5.5 ms passive; 2.9 and 3.2 ms on an idle machine). libgomp reads the setting when it
# loads, i.e. with _core below, so it is set only for that and restored after; a value set by the
# user is kept, and it has no effect when another module loaded the same libgomp first.
_omp_wait_policy = _os.environ.get("OMP_WAIT_POLICY")
_os.environ["OMP_WAIT_POLICY"] = _omp_wait_policy or "PASSIVE"
try:
    from . import _core  # noqa: E402
except ImportError as e:  # pragma: no cover - only when the extension is missing
    raise ImportError(
        "pygpfast's compiled core (pygpfast._core) could not be imported. Install the package "
        "with `pip install .` (which compiles it), or for development build it in place with "
        "`cmake -S . -B build/dev -DPYGPFAST_BUILD_PYTHON=ON -DPYGPFAST_INPLACE=ON "
        f"&& cmake --build build/dev`. Original error: {e}"
    ) from e
finally:
    if _omp_wait_policy is None:
        del _os.environ["OMP_WAIT_POLICY"]

from . import cvi, datasets, ivm, kernels, likelihoods, linalg, moe, piecewise, priors
from ._threads import get_num_threads, set_num_threads
from .cvi import VGPClassifier, VGPPoissonRegressor
from .ivm import IVMClassifier
from .moe import ISMOEClassifier, ISMOERegressor
from .svgp import SVGPClassifier, SVGPRegressor
from ._version import __version__

__all__ = [
    "ISMOEClassifier",
    "ISMOERegressor",
    "IVMClassifier",
    "LinAlgError",
    "NumericalWarning",
    "SVGPClassifier",
    "SVGPRegressor",
    "VGPClassifier",
    "VGPPoissonRegressor",
    "cvi",
    "datasets",
    "get_num_threads",
    "ivm",
    "kernels",
    "likelihoods",
    "linalg",
    "moe",
    "piecewise",
    "priors",
    "set_num_threads",
    "__version__",
]
