"""Covariance functions (kernels).

A kernel object is declarative: it holds its positive hyperparameters (floats, or 1-D arrays
for per-dimension values) and every evaluation hands a flat description of the kernel to the
compiled core. Kernels combine with ``+`` and ``*``::

    k = RBF(lengthscale=[1.0, 2.0]) * Linear() + White(1e-2)

Notation (GPflow's glossary): X [N, D], X2 [M, D], K(X, X2) [N, M].

Hyperparameters are positive. :attr:`Kernel.params` lists them flat, in the order of
:attr:`Kernel.param_names`; :attr:`Kernel.theta` is their logarithm, the unconstrained
parameterisation that optimisers use (the positivity transform is ``exp``), with box
constraints :attr:`Kernel.bounds`.

Each leaf may carry priors on its hyperparameters (:mod:`pygpfast.priors`), by name, for fits at
the MAP point: ``RBF(priors={"lengthscale": LogNormal(0.0, 1.7)})``, or through scikit-learn's
protocol, ``set_params(priors__lengthscale=...)`` (``kernel__priors__lengthscale`` from an
estimator). :meth:`Kernel.log_prior` and :meth:`Kernel.grad_log_prior` sum their log densities
over the tree, in the layout of :attr:`Kernel.theta`.
"""

import copy

import numpy as np

from . import _core
from . import priors as _priors
from ._validation import as_matrix, as_vector, check_same_dim

__all__ = [
    "PARAM_BOUNDS",
    "Constant",
    "Kernel",
    "Linear",
    "Matern12",
    "Matern32",
    "Matern52",
    "Product",
    "RBF",
    "Sum",
    "White",
]

#: Lower and upper bound of every hyperparameter, used by :attr:`Kernel.bounds`.
PARAM_BOUNDS = (1e-5, 1e5)


def hyper_bounds(theta0):
    """Box constraints (lower [n], upper [n]) for a search over log hyperparameters that start
    at ``theta0`` [n]: log PARAM_BOUNDS, widened to log PARAM_BOUNDS + theta0 where that reaches
    further, so a starting value outside PARAM_BOUNDS (the median-distance lengthscale of
    features on a scale of 1e6, a user's White(1e-8)) is kept, with the same range of 1e5
    either way. Used by every estimator's hyperparameter search."""
    theta0 = np.asarray(theta0, dtype=np.float64)
    lo, hi = np.log(PARAM_BOUNDS)
    return np.minimum(lo, theta0 + lo), np.maximum(hi, theta0 + hi)


def _leaves(kernel):
    """The leaf kernels in the tree of `kernel`, in order."""
    if isinstance(kernel, _Combination):
        return [leaf for k in kernel.kernels for leaf in _leaves(k)]
    return [kernel]


# Node type codes of the core (csrc/include/pygpfast/kernels.hpp, enum KernelType).
_RBF, _MATERN12, _MATERN32, _MATERN52, _LINEAR, _CONSTANT, _WHITE, _SUM, _PRODUCT = range(9)


def _check_positive(values, name):
    """Raise ValueError unless every entry of `values` (an ndarray) is finite and > 0."""
    if not np.all(np.isfinite(values) & (values > 0)):
        raise ValueError(f"{name} must be finite and > 0, got {values}")


def _as_hyperparameter(value, name, per_dimension):
    """A positive float, or (when `per_dimension`) a non-empty 1-D float64 array copy."""
    try:
        if np.asarray(value).dtype.kind in "bUSO":  # (True would be taken for 1.0, "1" for 1.0)
            raise TypeError("a bool or a string is not a number here")
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name} must be a positive number, got {value!r}") from e
    if arr.ndim == 0:
        _check_positive(arr, name)
        return float(arr)
    if not per_dimension:
        raise ValueError(f"{name} must be a positive scalar, got shape {arr.shape}")
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a scalar or a non-empty 1-D array, got shape {arr.shape}")
    _check_positive(arr, name)
    return arr.copy()


class _Hyperparameter:
    """A validated positive hyperparameter attribute, stored on the instance as ``_<name>``.

    With ``per_dimension`` it may also be a 1-D array with one value per input dimension.
    """

    def __init__(self, per_dimension=False):
        self.per_dimension = per_dimension

    def __set_name__(self, owner, name):
        self.name = name
        self.storage = "_" + name

    def __get__(self, obj, objtype=None):
        return self if obj is None else getattr(obj, self.storage)

    def __set__(self, obj, value):
        label = f"{type(obj).__name__}.{self.name}"
        setattr(obj, self.storage, _as_hyperparameter(value, label, self.per_dimension))


class Kernel:
    """Base class of the covariance functions.

    Subclasses describe themselves to the core; this class provides evaluation, gradients,
    the flat parameter vector and the ``+`` / ``*`` algebra.
    """

    # ---- evaluation ----

    def __call__(self, X, X2=None):
        """Covariance matrix K(X, X2).

        Parameters
        ----------
        X : array_like [N, D]
        X2 : array_like [M, D] or None
            None means X2 is X (and then :class:`White` contributes its diagonal).

        Returns
        -------
        K : ndarray [N, M] (M = N when X2 is None)
        """
        X, X2 = self._inputs(X, X2)
        codes, params = self._spec(X.shape[1])
        return _core.kernels.K(codes, params, X, X2)

    def diag(self, X):
        """Diagonal of K(X, X) [N], without forming the matrix."""
        X = as_matrix(X, "X")
        codes, params = self._spec(X.shape[1])
        return _core.kernels.Kdiag(codes, params, X)

    # ---- gradients (vector-Jacobian products of sum(G * K)) ----

    def vjp(self, X, X2, G, *, wrt_X=False, wrt_X2=False):
        """All gradients of ``sum(G * K(X, X2))`` in one pass.

        Parameters
        ----------
        X : array_like [N, D]
        X2 : array_like [M, D] or None
            None means X2 is X.
        G : array_like [N, M]
            The adjoint (the gradient of a scalar objective with respect to K).
        wrt_X, wrt_X2 : bool
            Whether to compute the gradients with respect to X and X2.

        Returns
        -------
        dparams : ndarray [n_params]
            Gradient with respect to :attr:`params`.
        dX : ndarray [N, D] or None
        dX2 : ndarray [M, D] or None
            With X2=None, dX and dX2 are the partial gradients through the first and the
            second argument of K(X, X); the gradient with respect to X is ``dX + dX2``.
        """
        X, X2 = self._inputs(X, X2)
        G = as_matrix(G, "G")
        shape = (X.shape[0], X.shape[0] if X2 is None else X2.shape[0])
        if G.shape != shape:
            raise ValueError(f"G has shape {G.shape} but K(X, X2) has shape {shape}")
        codes, params = self._spec(X.shape[1])
        return _core.kernels.K_vjp(codes, params, X, X2, G, bool(wrt_X), bool(wrt_X2))

    def grad_params(self, X, X2, G):
        """Gradient of ``sum(G * K(X, X2))`` with respect to :attr:`params` [n_params]."""
        return self.vjp(X, X2, G)[0]

    def grad_theta(self, X, X2, G):
        """Gradient of ``sum(G * K(X, X2))`` with respect to :attr:`theta` [n_params]."""
        return self.grad_params(X, X2, G) * self.params

    def grad_X(self, X, X2, G):
        """Gradient of ``sum(G * K(X, X2))`` with respect to X [N, D].

        With X2=None this is the partial gradient through the first argument only; the
        gradient of ``sum(G * K(X, X))`` is ``grad_X(X, None, G) + grad_X2(X, None, G)``.
        """
        return self.vjp(X, X2, G, wrt_X=True)[1]

    def grad_X2(self, X, X2, G):
        """Gradient of ``sum(G * K(X, X2))`` with respect to X2 [M, D] (see :meth:`grad_X`)."""
        return self.vjp(X, X2, G, wrt_X2=True)[2]

    def grad_diag_params(self, X, g):
        """Gradient of ``sum(g * k.diag(X))`` with respect to :attr:`params`; g is [N]."""
        X = as_matrix(X, "X")
        g = as_vector(g, "g", size=X.shape[0])
        codes, params = self._spec(X.shape[1])
        return _core.kernels.Kdiag_vjp(codes, params, X, g)

    def grad_diag_theta(self, X, g):
        """Gradient of ``sum(g * k.diag(X))`` with respect to :attr:`theta`; g is [N]."""
        return self.grad_diag_params(X, g) * self.params

    # ---- parameters ----

    @property
    def params(self):
        """The positive hyperparameters, flat [n_params] (order: :attr:`param_names`)."""
        return np.concatenate(self._param_arrays())

    @params.setter
    def params(self, values):
        values = as_vector(values, "params", size=self.n_params)
        _check_positive(values, "params")
        self._assign(values)

    @property
    def n_params(self):
        """Number of hyperparameters."""
        return sum(a.size for a in self._param_arrays())

    @property
    def param_names(self):
        """Names of the hyperparameters, e.g. ``"rbf.lengthscale[0]"`` (list of str)."""
        return self._names()

    @property
    def theta(self):
        """log(:attr:`params`) [n_params], the unconstrained parameterisation.

        Setting it sets the parameters to ``exp(theta)``; values that overflow or underflow
        (outside about [-745, 709]) raise ValueError.
        """
        return np.log(self.params)

    @theta.setter
    def theta(self, values):
        values = as_vector(values, "theta", size=self.n_params)
        with np.errstate(over="ignore"):
            params = np.exp(values)
        _check_positive(params, "exp(theta)")
        self._assign(params)

    @property
    def bounds(self):
        """Box constraints on :attr:`theta`, [n_params, 2]: log of :data:`PARAM_BOUNDS`."""
        return np.tile(np.log(PARAM_BOUNDS), (self.n_params, 1))

    # ---- priors ----

    @property
    def has_priors(self):
        """Whether any hyperparameter of the tree has a prior (bool)."""
        return not _priors.is_flat(self._prior_blocks())

    def log_prior(self, theta=None):
        """Sum of the log prior densities of the hyperparameters, as densities on theta (see
        :mod:`pygpfast.priors`), at `theta` [n_params] (default: :attr:`theta`); 0.0 when no
        hyperparameter has a prior."""
        return _priors.log_prior(self._prior_blocks(), self.theta if theta is None else theta)[0]

    def grad_log_prior(self, theta=None):
        """Gradient of :meth:`log_prior` with respect to theta [n_params]."""
        return _priors.log_prior(self._prior_blocks(), self.theta if theta is None else theta)[1]

    # ---- scikit-learn's parameter protocol ----

    def get_params(self, deep=True):
        """The kernel's parameters by name, in scikit-learn's protocol (dict).

        A leaf kernel gives its hyperparameters (``variance``, ``lengthscale``); a sum or
        product gives ``kernels`` and, with ``deep``, each term as ``kernels__<i>`` and that
        term's own as ``kernels__<i>__<name>``. Through them an estimator's ``set_params`` and
        ``GridSearchCV`` reach the kernel: ``set_params(kernel__lengthscale=2.0)``.
        """
        return self._get_params(deep)

    def set_params(self, **params):
        """Set parameters named as by :meth:`get_params` (nested ones with ``__``); returns
        self. ValueError names the valid parameters when one is not."""
        nested = {}
        for key, value in params.items():
            head, _, rest = key.partition("__")
            nested.setdefault(head, {})[rest] = value
        valid = self._get_params(deep=False)
        for head, items in nested.items():
            if head not in valid:
                raise ValueError(f"invalid parameter {head!r} for kernel {self!r}; valid "
                                 f"parameters are {sorted(valid)}")
            self._set_param(head, items)
        return self

    def __sklearn_clone__(self):
        # (scikit-learn's clone rebuilds an object from get_params and checks that the
        # constructor stored each value as given; kernels store validated copies)
        return copy.deepcopy(self)

    # ---- algebra ----

    def __add__(self, other):
        if not isinstance(other, Kernel):
            return NotImplemented
        return Sum([*_operands(self, Sum), *_operands(other, Sum)])

    def __mul__(self, other):
        if not isinstance(other, Kernel):
            return NotImplemented
        return Product([*_operands(self, Product), *_operands(other, Product)])

    # ---- the description for the core ----

    def _spec(self, input_dim):
        """Flat description for the core: (codes int32 [*], params float64 [n_params]).

        Raises ValueError when a per-dimension hyperparameter does not have `input_dim`
        entries.
        """
        codes, params = [], []
        self._describe(int(input_dim), codes, params)
        return np.asarray(codes, dtype=np.int32), np.concatenate(params)

    def _inputs(self, X, X2):
        X = as_matrix(X, "X")
        if X2 is not None:
            X2 = as_matrix(X2, "X2")
            check_same_dim(X, X2)
        return X, X2

    # Subclasses implement:
    #   _prior_blocks() -> list of (size, Prior or None, name), in the layout of theta
    #   _param_arrays() -> list of 1-D float64 arrays, the parameters in core order
    #   _assign(values) -> set the parameters from a validated flat array of that layout
    #   _names()        -> list of parameter names
    #   _describe(input_dim, codes, params) -> append the core description


def _combinations(kernel):
    """The sums and products in the tree of `kernel`, itself included when it is one."""
    found, stack = [], [kernel]
    while stack:
        k = stack.pop()
        if isinstance(k, _Combination):
            found.append(k)
            stack.extend(k.kernels)
    return found


def _operands(kernel, cls):
    """The terms of `kernel` when it is a `cls` (so that sums and products stay flat)."""
    return kernel.kernels if type(kernel) is cls else [kernel]


class _Leaf(Kernel):
    """A kernel with its own hyperparameters, listed in `_fields` in the core's order."""

    _code = None  # core type code
    _label = None  # prefix of parameter names
    _fields = ()

    @property
    def priors(self):
        """Priors on the hyperparameters (dict of name -> :class:`pygpfast.priors.Prior`, or
        None for flat); a hyperparameter not named has none. Setting it validates a copy."""
        return self.__dict__.get("_priors", {})

    @priors.setter
    def priors(self, value):
        self._priors = _priors.check_priors(value, self._fields, type(self).__name__)

    def _prior_blocks(self):
        priors = self.priors
        return [(a.size, priors.get(f), f"{type(self).__name__}.{f}")
                for f, a in zip(self._fields, self._param_arrays())]

    def _param_arrays(self):
        return [np.atleast_1d(np.asarray(getattr(self, f), dtype=np.float64)) for f in self._fields]

    def _assign(self, values):
        start = 0
        for field, current in zip(self._fields, self._param_arrays()):
            stop = start + current.size
            chunk = values[start:stop]
            setattr(self, field, chunk if np.ndim(getattr(self, field)) else chunk[0])
            start = stop

    def _names(self):
        names = []
        for field in self._fields:
            value = getattr(self, field)
            if np.ndim(value):
                names += [f"{self._label}.{field}[{d}]" for d in range(len(value))]
            else:
                names.append(f"{self._label}.{field}")
        return names

    def _describe(self, input_dim, codes, params):
        arrays = self._param_arrays()
        for field in self._fields:
            value = getattr(self, field)
            if np.ndim(value) and len(value) != input_dim:
                raise ValueError(
                    f"{type(self).__name__}.{field} has {len(value)} entries but X has "
                    f"{input_dim} features; give one value per feature or a scalar"
                )
        codes += [self._code, sum(a.size for a in arrays)]
        params += arrays

    def _get_params(self, deep):
        params = {f: _copy_value(getattr(self, f)) for f in self._fields}
        params["priors"] = dict(self.priors)
        return params

    def _set_param(self, name, items):
        if name == "priors":  # (priors={...} replaces them; priors__<name>=p sets one)
            priors = dict(self.priors) if "" not in items else (items.pop("") or {})
            if not isinstance(priors, dict):
                raise ValueError(f"{type(self).__name__}.priors must be a dict of "
                                 f"hyperparameter name -> Prior (or None), got {priors!r}")
            priors = dict(priors)
            for key, value in items.items():
                priors[key] = value
            self.priors = priors
            return
        if set(items) != {""}:
            inner = sorted(f"{name}__{k}" for k in items if k)
            raise ValueError(f"invalid parameter {inner[0]!r} for kernel {self!r}: {name} has no "
                             "parameters of its own")
        setattr(self, name, items[""])

    def __repr__(self):
        args = ", ".join(f"{f}={_format(getattr(self, f))}" for f in self._fields)
        if self.priors:
            args += f", priors={self.priors!r}"
        return f"{type(self).__name__}({args})"


def _copy_value(value):
    return value.copy() if isinstance(value, np.ndarray) else value


def _format(value):
    return repr(value.tolist()) if isinstance(value, np.ndarray) else repr(value)


class _Stationary(_Leaf):
    _fields = ("variance", "lengthscale")
    variance = _Hyperparameter()
    lengthscale = _Hyperparameter(per_dimension=True)

    def __init__(self, variance=1.0, lengthscale=1.0, priors=None):
        self.variance = variance
        self.lengthscale = lengthscale
        self.priors = priors


_STATIONARY_DOC = """{summary}

    ``k(x, x2) = variance * {formula}`` with ``r^2 = sum_d (x_d - x2_d)^2 / lengthscale_d^2``.

    Parameters
    ----------
    variance : float
        Signal variance, > 0.
    lengthscale : float or array_like [D]
        One lengthscale (isotropic) or one per input dimension (ARD), > 0.
    priors : dict or None
        Priors by hyperparameter name (``"variance"``, ``"lengthscale"``), see
        :mod:`pygpfast.priors`; None or a name left out: flat.
    """


class RBF(_Stationary):
    __doc__ = _STATIONARY_DOC.format(
        summary="Squared-exponential (radial basis function) kernel.", formula="exp(-r^2 / 2)"
    )
    _code, _label = _RBF, "rbf"


class Matern12(_Stationary):
    __doc__ = _STATIONARY_DOC.format(summary="Matern kernel with nu = 1/2.", formula="exp(-r)")
    _code, _label = _MATERN12, "matern12"


class Matern32(_Stationary):
    __doc__ = _STATIONARY_DOC.format(
        summary="Matern kernel with nu = 3/2.", formula="(1 + sqrt(3) r) exp(-sqrt(3) r)"
    )
    _code, _label = _MATERN32, "matern32"


class Matern52(_Stationary):
    __doc__ = _STATIONARY_DOC.format(
        summary="Matern kernel with nu = 5/2.",
        formula="(1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)",
    )
    _code, _label = _MATERN52, "matern52"


class Linear(_Leaf):
    """Linear (dot-product) kernel ``k(x, x2) = sum_d variance_d x_d x2_d``.

    Parameters
    ----------
    variance : float or array_like [D]
        One variance shared by all dimensions or one per dimension (ARD), > 0.
    priors : dict or None
        Priors by hyperparameter name (``"variance"``), see :mod:`pygpfast.priors`.
    """

    _code, _label, _fields = _LINEAR, "linear", ("variance",)
    variance = _Hyperparameter(per_dimension=True)

    def __init__(self, variance=1.0, priors=None):
        self.variance = variance
        self.priors = priors


class Constant(_Leaf):
    """Constant kernel ``k(x, x2) = variance``.

    Parameters
    ----------
    variance : float
        > 0.
    priors : dict or None
        Priors by hyperparameter name (``"variance"``), see :mod:`pygpfast.priors`.
    """

    _code, _label, _fields = _CONSTANT, "constant", ("variance",)
    variance = _Hyperparameter()

    def __init__(self, variance=1.0, priors=None):
        self.variance = variance
        self.priors = priors


class White(_Leaf):
    """White-noise kernel: ``variance * I`` for K(X) and 0 between different inputs.

    ``White()(X)`` (X2 omitted) is ``variance * I``; ``White()(X, X2)`` is zero even when
    X2 holds the same points, because X2 is taken to be a different set of inputs.
    :meth:`diag` is ``variance`` everywhere.

    Parameters
    ----------
    variance : float
        Noise variance, > 0.
    priors : dict or None
        Priors by hyperparameter name (``"variance"``), see :mod:`pygpfast.priors`.
    """

    _code, _label, _fields = _WHITE, "white", ("variance",)
    variance = _Hyperparameter()

    def __init__(self, variance=1.0, priors=None):
        self.variance = variance
        self.priors = priors


class _Combination(Kernel):
    """A kernel combining others; the children are held (shared), not copied. A kernel object
    occurs at most once in a combination's tree (ValueError otherwise)."""

    _code = None
    _label = None
    _symbol = None

    def __init__(self, kernels):
        self.kernels = self._checked_terms(kernels)
        self._check_distinct()

    def _check_distinct(self, kernels=None):
        """ValueError when one kernel object occurs twice in the tree (of `kernels`, default
        the terms): its hyperparameters would be listed twice in params and theta, and setting
        them keeps the last copy only."""
        seen = set()
        stack = list(self.kernels if kernels is None else kernels)
        while stack:
            k = stack.pop()
            if id(k) in seen:
                raise ValueError(
                    f"the kernel object {k!r} occurs more than once in this "
                    f"{type(self).__name__.lower()}: its hyperparameters would be listed once per "
                    "occurrence in params and theta, and setting them would keep the last "
                    "occurrence's values only (a hyperparameter search would follow gradients of "
                    "entries that change nothing). Use copy.deepcopy(k) for an independent copy.")
            seen.add(id(k))
            if isinstance(k, _Combination):
                stack.extend(k.kernels)

    def _checked_terms(self, kernels):
        try:
            if isinstance(kernels, Kernel):  # Sum(k): not a sequence
                raise TypeError
            kernels = list(kernels)
        except TypeError as e:
            raise ValueError(
                f"{type(self).__name__} takes a sequence of Kernel objects, got {kernels!r}"
            ) from e
        if not kernels:
            raise ValueError(f"{type(self).__name__} needs at least one kernel")
        for k in kernels:
            if not isinstance(k, Kernel):
                raise ValueError(f"{type(self).__name__} takes Kernel objects, got {k!r}")
        return kernels

    def _get_params(self, deep):
        params = {"kernels": list(self.kernels)}
        if deep:
            for i, k in enumerate(self.kernels):
                params[f"kernels__{i}"] = k
                params.update((f"kernels__{i}__{n}", v) for n, v in k.get_params(True).items())
        return params

    def _set_param(self, name, items):
        whole = items.pop("", None)
        kernels = list(self.kernels) if whole is None else self._checked_terms(whole)
        terms = {}
        for key, value in items.items():
            index, _, rest = key.partition("__")
            if not (index.isdigit() and int(index) < len(kernels)):
                raise ValueError(f"invalid parameter 'kernels__{key}' for kernel {self!r}: "
                                 f"the terms are kernels__0 to kernels__{len(kernels) - 1}")
            terms.setdefault(int(index), {})[rest] = value
        for i, sub in terms.items():
            replacement = sub.pop("", None)
            if replacement is not None:
                kernels[i] = self._checked_terms([replacement])[0]
        self._check_distinct(kernels)
        # (a term's own set_params checks its subtree only; a replacement deeper down that
        # occurs elsewhere in this tree is undone)
        terms_before = [(c, list(c.kernels)) for c in _combinations(self)]
        self.kernels = kernels
        try:
            for i, sub in terms.items():
                if sub:
                    kernels[i].set_params(**sub)
            self._check_distinct()
        except ValueError:
            for c, before in terms_before:
                c.kernels = before
            raise

    def _param_arrays(self):
        return [a for k in self.kernels for a in k._param_arrays()]

    def _prior_blocks(self):
        return [b for k in self.kernels for b in k._prior_blocks()]

    def _assign(self, values):
        start = 0
        for k in self.kernels:
            stop = start + k.n_params
            k._assign(values[start:stop])
            start = stop

    def _names(self):
        return [f"{self._label}[{i}].{n}" for i, k in enumerate(self.kernels) for n in k._names()]

    def _describe(self, input_dim, codes, params):
        codes += [self._code, len(self.kernels)]
        for k in self.kernels:
            k._describe(input_dim, codes, params)

    def __repr__(self):
        parts = []
        for k in self.kernels:
            text = repr(k)
            parts.append(f"({text})" if isinstance(k, _Combination) else text)
        return f" {self._symbol} ".join(parts)


class Sum(_Combination):
    """Sum of kernels, ``k(x, x2) = sum_c k_c(x, x2)``; also made by ``k1 + k2``.

    Parameters
    ----------
    kernels : sequence of Kernel
    """

    _code, _label, _symbol = _SUM, "sum", "+"


class Product(_Combination):
    """Product of kernels, ``k(x, x2) = prod_c k_c(x, x2)``; also made by ``k1 * k2``.

    Parameters
    ----------
    kernels : sequence of Kernel
    """

    _code, _label, _symbol = _PRODUCT, "product", "*"
