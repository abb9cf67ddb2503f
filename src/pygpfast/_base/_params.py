"""Estimator parameters: one declarative check for every estimator.

Each estimator lists its parameters' constraints in ``_parameter_constraints`` (a dict of name
-> a tuple of accepted forms; the shared ones are in :data:`COMMON`); :func:`check_params` raises
one ``ValueError`` that names the parameter, what it accepts and the value it got.
"""

import numbers

import numpy as np

from .. import kernels as _kernels


class Interval:
    """A finite number in an interval: ``Interval(int, 1, None)`` is an int >= 1; ``closed``
    says which ends belong ("both", "left", "right", "neither"). A bool is not a number here."""

    def __init__(self, kind, low, high, closed="both"):
        self.kind, self.low, self.high, self.closed = kind, low, high, closed

    def accepts(self, value):
        number = numbers.Integral if self.kind is int else numbers.Real
        if not isinstance(value, number) or isinstance(value, (bool, np.bool_)):
            return False
        if not np.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (
                value == self.low and self.closed in ("right", "neither"))):
            return False
        if self.high is not None and (value > self.high or (
                value == self.high and self.closed in ("left", "neither"))):
            return False
        return True

    def __str__(self):
        what = "an int" if self.kind is int else "a finite number"
        low = f"{self.low:g}" if self.low is not None else "-inf"
        if self.high is None:
            return f"{what} {'>=' if self.closed in ('both', 'left') else '>'} {low}"
        left = "[" if self.closed in ("both", "left") else "("
        right = "]" if self.closed in ("both", "right") else ")"
        return f"{what} in {left}{low}, {self.high:g}{right}"


class Options:
    """One of a fixed set of values (strings, usually)."""

    def __init__(self, *values):
        self.values = values

    def accepts(self, value):
        return isinstance(value, (str, type(None))) and value in self.values

    def __str__(self):
        return "one of " + ", ".join(repr(v) for v in self.values)


class Kind:
    """Values that pass a test, described by `text`."""

    def __init__(self, test, text):
        self.test, self.text = test, text

    def accepts(self, value):
        return bool(self.test(value))

    def __str__(self):
        return self.text


NONE = Kind(lambda v: v is None, "None")
BOOL = Kind(lambda v: isinstance(v, (bool, np.bool_)), "a bool")
CALLABLE = Kind(callable, "a callable")
KERNEL = Kind(lambda v: isinstance(v, _kernels.Kernel), "a pygpfast.kernels.Kernel (an instance)")
VERBOSE = Kind(lambda v: isinstance(v, (bool, np.bool_)) or Interval(int, 0, None).accepts(v),
               "a bool or an int >= 0")
RANDOM_STATE = Kind(lambda v: v is None or (isinstance(v, (numbers.Integral, np.random.RandomState))
                                            and not isinstance(v, bool)),
                    "None, an int or a numpy RandomState")

#: The parameters every estimator shares, with one meaning and one check each.
COMMON = {
    "kernel": (NONE, KERNEL),
    "optimize_hyperparameters": (BOOL,),
    "jitter": (Interval(float, 0.0, 1.0, closed="left"),),
    "tol": (Interval(float, 0.0, None),),
    "random_state": (RANDOM_STATE,),
    "verbose": (VERBOSE,),
    "callback": (NONE, CALLABLE),
    "priors": (Options("default", None),),
}


def check_params(estimator, constraints):
    """ValueError naming the first parameter of `estimator` whose value none of its accepted
    forms (``constraints``: name -> tuple of forms) accepts."""
    for name, accepted in constraints.items():
        value = getattr(estimator, name)
        if not any(form.accepts(value) for form in accepted):
            forms = " or ".join(str(form) for form in accepted)
            raise ValueError(f"{name} must be {forms}, got {value!r}")


def check_int(value, name, low, *, allow_bool=False):
    """Raise ValueError unless value is an int >= low (a bool only with allow_bool, for
    ``verbose=True``)."""
    if not (isinstance(value, numbers.Integral) and (allow_bool or not isinstance(value, bool))
            and value >= low):
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def callback_says_stop(answer):
    """Whether a user callback's return value asks the fit to stop (None or False: go on). A
    value with no truth value of its own (an array of several entries) is a clear TypeError."""
    try:
        return bool(answer)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"callback must return a bool (True stops the fit) or None, got {answer!r}") from exc


class KernelParams:
    """set_params of an estimator whose `kernel` may be None (a default kernel made from the
    data at fit): a kernel's own parameter (``kernel__lengthscale``) without a kernel is a
    ValueError that says so; scikit-learn's set_params raised AttributeError ('NoneType' object
    has no attribute 'set_params'), e.g. from GridSearchCV over ``kernel__lengthscale``."""

    def set_params(self, **params):
        nested = sorted(key for key in params if key.startswith("kernel__"))
        if nested and params.get("kernel", self.kernel) is None:
            raise ValueError(
                f"{nested[0]!r} is a parameter of the kernel, but {type(self).__name__} has "
                "kernel=None (a default kernel is made from the data at fit); pass a kernel, "
                "e.g. kernel=pygpfast.kernels.RBF(), to set or search its parameters")
        return super().set_params(**params)
