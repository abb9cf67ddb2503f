"""Type stubs for pygpfast._core, the compiled core (private; use the public API): one
submodule per building block and per model family, each with its own stub file.

Arrays are float64 C-contiguous unless stated; kernel ``codes`` are int32. Shapes follow
GPflow's glossary: X [N, D], X2 [M, D], Z [M, D].
"""

from . import blas as blas
from . import cvi as cvi
from . import ivm as ivm
from . import kernels as kernels
from . import likelihoods as likelihoods
from . import linalg as linalg
from . import moe as moe
from . import piecewise as piecewise
from . import svgp as svgp
from . import threads as threads
