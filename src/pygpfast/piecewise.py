"""Piecewise upper bounds on llp(x) = log(1 + e^x) and their expectations under a Gaussian.

The logistic-log-partition llp(x) = log(1 + e^x) has no closed-form expectation under a
Gaussian. Marlin, Khan & Murphy (ICML 2011) replace it by a piecewise bound B with R pieces::

    B(x) = a_r x^2 + b_r x + c_r   for x in [t_{r-1}, t_r),   t_0 = -inf, t_R = +inf,

with B(x) >= llp(x) for every x, so that E[B(x)] under x ~ N(m, v) is an upper bound on
E[llp(x)] in closed form (truncated-Gaussian moments), and the variational bounds of Khan,
Mohamed & Murphy (2012) built on it are lower bounds on the log-likelihood.

The bounds shipped here are the *minimax* ones: for each R and each kind (piecewise linear,
a = 0, or piecewise quadratic, a >= 0) they minimise the maximum error max_x B(x) - llp(x) under
the constraint B >= llp. They are computed by :func:`build_llp_bound` (offline; about a
few seconds for R = 20) with the method of ``shared/notes/piecewise-bounds.md``:

* The first piece is the constant llp(t_1) and the last is x + llp(-t_{R-1}): on an infinite
  interval no other quadratic stays above llp with bounded error. Their error is reached as
  x -> -inf and x -> +inf, which gives t_1 = log(e^eps - 1) for a target error eps.
* Linear: on a finite interval the chord of the convex llp is the best linear upper bound, with
  a closed-form error; the result is continuous (it equals the Hsiung-Kim-Boyd approximation
  shifted up by eps).
* Quadratic: on a finite interval the best upper bound is the Chebyshev (minimax) quadratic
  approximation p* of llp shifted up by its error E, with error 2E; p* comes from the Remez
  exchange algorithm (four alternation points, the two interior ones are the roots of
  sigma(x) - p*'(x)). These pieces touch llp at one end and lie 2E above it at the other, so B
  jumps by about eps at every breakpoint: it is *not* continuous.
* The one-piece error grows with the interval, so the minimax partition equalises all piece
  errors. For a trial eps the left half is filled greedily with pieces of error exactly eps,
  and eps is found by root-finding on the mismatch at the centre (a breakpoint at 0 for even R,
  a middle piece [-u, u] of error eps for odd R). The right half is the mirror image:
  llp(-x) = llp(x) - x gives a_{R+1-r} = a_r, b_{R+1-r} = 1 - b_r, c_{R+1-r} = c_r.
* Every c is raised by 1e-15 so that rounding the coefficients to double keeps B >= llp.

The tables for R = 3..20 are stored in ``pygpfast/data/llp_bounds.csv``, written by
:func:`write_tables` (``python -c "from pygpfast.piecewise import write_tables; write_tables()"``,
about 30 s) and read by :func:`llp_bound`; nothing is recomputed at import. For R = 20 the
quadratic bound's maximum error is 1.4214e-4, against 1.951e-4 for the table published with the
2011 paper.
"""

import csv
import functools
import math
from importlib import resources
from pathlib import Path

import numpy as np
from scipy import optimize

from . import _core
from ._validation import as_vector

__all__ = ["LLPBound", "llp_bound", "build_llp_bound", "expected_llp_bound", "write_tables"]

KINDS = ("linear", "quadratic")
MIN_PIECES, MAX_PIECES = 3, 20

# Added to every c so that the rounded coefficients stay above llp (the optimal pieces touch it).
_SAFETY_MARGIN = 1e-15
# max |llp'''| = max sigma (1 - sigma) |1 - 2 sigma| = 1 / (6 sqrt 3).
_MAX_THIRD_DERIVATIVE = 1.0 / (6.0 * math.sqrt(3.0))
_TABLE_FILE = "llp_bounds.csv"
_XTOL = 1e-14


def _llp(x):
    """log(1 + e^x) for a float, without overflow."""
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _sigmoid(x):
    if x >= 0.0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _logit(p):
    return math.log(p) - math.log1p(-p)


# ---------------------------------------------------------------------------------------------
# One piece


def _chord_error(lo, hi):
    """Error of the chord of llp on [lo, hi], the best linear upper bound there."""
    slope = (_llp(hi) - _llp(lo)) / (hi - lo)
    x_star = _logit(slope)  # where llp' = slope: the largest gap
    return _llp(lo) + slope * (x_star - lo) - _llp(x_star)


def _chord_piece(lo, hi):
    slope = (_llp(hi) - _llp(lo)) / (hi - lo)
    return 0.0, slope, _llp(lo) - slope * lo


def _remez_quadratic(lo, hi, max_iter=40):
    """Chebyshev (minimax) quadratic approximation of llp on [lo, hi] with lo < hi <= 0.

    Returns (a, b, c, E): p*(x) = a x^2 + b x + c and E = max |llp - p*| on [lo, hi], taken
    at the alternation points. Works in tau = (x - mid) / half in [-1, 1] for conditioning.
    On x <= 0, llp''' > 0, so llp' - p' is convex: the error has at most two interior extrema,
    and the four alternation points are lo, the two roots of sigma(x) = p'(x), and hi.
    """
    mid, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
    tau = np.array([-1.0, -0.5, 0.5, 1.0])  # Chebyshev extrema of degree 3
    signs = np.array([1.0, -1.0, 1.0, -1.0])
    points = mid + half * tau
    for _ in range(max_iter):
        A = np.column_stack([tau**2, tau, np.ones(4), signs])
        rhs = np.array([_llp(x) for x in points])
        alpha, beta, gamma, levelled = np.linalg.solve(A, rhs)
        coef = (alpha, beta, gamma)

        def error(x):
            t = (x - mid) / half
            return _llp(x) - ((alpha * t + beta) * t + gamma)

        def error_slope(x):
            return _sigmoid(x) - (2.0 * alpha * (x - mid) / half + beta) / half

        # The minimum of the convex error_slope: sigma (1 - sigma) = 2 a (x <= 0 branch).
        a = alpha / half**2
        if 8.0 * a < 1.0:
            s0 = 0.5 * (1.0 - math.sqrt(1.0 - 8.0 * a))
            x_min = min(max(_logit(s0), lo), hi) if s0 > 0.0 else lo
        else:
            x_min = hi  # error_slope decreasing on [lo, hi]
        roots = [
            optimize.brentq(error_slope, x0, x1, xtol=1e-15 * max(1.0, abs(x0)), rtol=8.9e-16)
            for x0, x1 in ((lo, x_min), (x_min, hi))
            if x1 > x0 and error_slope(x0) * error_slope(x1) < 0.0
        ]
        new_points = np.array([lo, *roots, hi])
        errors = np.array([error(x) for x in new_points])
        largest = float(np.max(np.abs(errors)))
        if len(roots) != 2 or largest - abs(levelled) <= 1e-14 * largest:
            break
        points = new_points
        tau = (points - mid) / half
    alpha, beta, gamma = coef
    a = alpha / half**2
    b = beta / half - 2.0 * a * mid
    c = gamma - beta * mid / half + alpha * (mid / half) ** 2
    return a, b, c, max(largest, abs(levelled))


def _quadratic_error(lo, hi):
    """Error of the best quadratic upper bound of llp on [lo, hi] (hi <= 0): twice Chebyshev's."""
    return 2.0 * _remez_quadratic(lo, hi)[3]


def _quadratic_piece(lo, hi):
    a, b, c, E = _remez_quadratic(lo, hi)
    return a, b, c + E


def _middle_quadratic(u):
    """Best quadratic upper bound of llp on [-u, u]: (a, 1/2, c) and its error.

    The optimum is symmetric, b = 1/2, and llp(x) - x/2 = g(x^2) with g(y) = log(2 cosh(sqrt(y)/2))
    concave in y; the best upper line of g on [0, u^2] is the tangent parallel to the chord.
    """
    U = u * u

    def g(y):  # log(e^(r/2) + e^(-r/2)), r = sqrt(y)
        r = math.sqrt(y)
        return 0.5 * r + math.log1p(math.exp(-r))

    A = (g(U) - math.log(2.0)) / U

    def slope_gap(y):  # g'(y) - A, g'(y) = tanh(sqrt(y)/2) / (4 sqrt(y))
        r = math.sqrt(y)
        return math.tanh(0.5 * r) / (4.0 * r) - A

    if slope_gap(U) >= 0.0:  # u so small that g is linear to rounding: no gap left
        return (A, 0.5, math.log(2.0)), 0.0
    y_star = optimize.brentq(slope_gap, U * 1e-12, U, xtol=1e-16 * U, rtol=8.9e-16)
    E = g(y_star) - math.log(2.0) - A * y_star
    return (A, 0.5, math.log(2.0) + E), E


def _middle_linear(u):
    # The chord of llp on [-u, u] has slope 1/2 exactly (llp(x) - x/2 is even).
    return (0.0, 0.5, _llp(-u) + 0.5 * u), _chord_error(-u, u)


# ---------------------------------------------------------------------------------------------
# Equalised partition


class _Overshoot(Exception):
    """The pieces of error eps reach the centre early: eps is too large."""


def _next_knot(piece_error, lo, eps, min_width):
    """The h in (lo, 0) with piece_error(lo, h) = eps; _Overshoot if [lo, 0] has error <= eps."""
    if lo + min_width >= 0.0 or piece_error(lo, 0.0) <= eps:
        raise _Overshoot
    return optimize.brentq(
        lambda h: piece_error(lo, h) - eps, lo + min_width, 0.0, xtol=_XTOL, rtol=8.9e-16
    )


class _Method:
    def __init__(self, kind):
        self.kind = kind
        if kind == "linear":
            self.piece_error, self.piece, self.middle = _chord_error, _chord_piece, _middle_linear
        else:
            self.piece_error = _quadratic_error
            self.piece, self.middle = _quadratic_piece, _middle_quadratic

    def min_width(self, eps):
        """A width whose pieces have error <= eps / 2 anywhere (from the interpolation bound)."""
        if self.kind == "linear":  # chord error <= max llp'' w^2 / 8 = w^2 / 32
            return math.sqrt(16.0 * eps)
        return (48.0 * eps / _MAX_THIRD_DERIVATIVE) ** (1.0 / 3.0)  # <= max|llp'''| w^3 / 96

    def left_knots(self, eps, n_pieces):
        """t_1 and the breakpoints of the left-half pieces of error eps (all < 0)."""
        knots = [math.log(math.expm1(eps))]
        n_march = (n_pieces - 3) // 2 if n_pieces % 2 else (n_pieces - 2) // 2 - 1
        for _ in range(n_march):
            knots.append(_next_knot(self.piece_error, knots[-1], eps, self.min_width(eps)))
        if knots[-1] >= 0.0:
            raise _Overshoot
        return knots

    def excess(self, log_eps, n_pieces):
        """Positive when eps = exp(log_eps) is larger than the minimax error, negative below."""
        eps = math.exp(log_eps)
        try:
            knots = self.left_knots(eps, n_pieces)
        except _Overshoot:
            return eps
        if n_pieces % 2:
            return eps - self.middle(-knots[-1])[1]
        return eps - self.piece_error(knots[-1], 0.0)

    def build(self, n_pieces):
        log_eps = optimize.brentq(
            self.excess, math.log(1e-7), math.log(math.log(2.0)) - 1e-12,
            args=(n_pieces,), xtol=1e-15, rtol=8.9e-16,
        )
        left = self.left_knots(math.exp(log_eps), n_pieces)
        pieces = [(0.0, 0.0, _llp(left[0]))]
        pieces += [self.piece(lo, hi) for lo, hi in zip(left[:-1], left[1:])]
        if n_pieces % 2:
            middle = [self.middle(-left[-1])[0]]
        else:
            pieces.append(self.piece(left[-1], 0.0))
            left = left + [0.0]
            middle = []
        # Mirror: f_{R+1-r}(x) = f_r(-x) + x.
        right = [(a, 1.0 - b, c) for a, b, c in reversed(pieces)]
        right_knots = [-t + 0.0 for t in reversed(left)]
        if not n_pieces % 2:
            right_knots = right_knots[1:]  # the breakpoint at 0 is shared
        knots = np.array([-np.inf, *left, *right_knots, np.inf])
        a, b, c = (np.array(col) for col in zip(*(pieces + middle + right)))
        return knots, a, b, c + _SAFETY_MARGIN


# ---------------------------------------------------------------------------------------------
# Exact extremes of B - llp


def _gap_extremes(knots, a, b, c):
    """(min, max) of B(x) - llp(x) over the real line, from per-piece critical points.

    The end pieces are c_1 and x + c_R: their gaps tend to c_1 and c_R at -inf and +inf.
    On a finite piece the extremes are at the ends or at the roots of 2 a x + b - sigma(x),
    bracketed on a 65-point grid and polished with Brent.
    """
    R = len(a)
    lowest, highest = np.inf, max(c[0], c[-1])

    def gap(r, x):
        return (a[r] * x + b[r]) * x + c[r] - _llp(x)

    for r in range(R):
        lo, hi = knots[r], knots[r + 1]
        candidates = [x for x in (lo, hi) if np.isfinite(x)]
        if np.isfinite(lo) and np.isfinite(hi):
            grid = np.linspace(lo, hi, 65)

            def slope(x, r=r):
                return 2.0 * a[r] * x + b[r] - _sigmoid(x)

            s = [slope(x) for x in grid]
            for k in range(64):
                if s[k] == 0.0:
                    candidates.append(grid[k])
                elif s[k] * s[k + 1] < 0.0:
                    candidates.append(optimize.brentq(slope, grid[k], grid[k + 1], xtol=1e-15))
        values = [gap(r, x) for x in candidates]
        lowest, highest = min(lowest, *values), max(highest, *values)
    return float(lowest), float(highest)


# ---------------------------------------------------------------------------------------------
# Public API


class LLPBound:
    """A piecewise upper bound B(x) >= llp(x) = log(1 + e^x) (immutable).

    Piece r (0-based) is ``a[r] x^2 + b[r] x + c[r]`` on ``[knots[r], knots[r + 1])``; the first
    piece is a constant, the last is ``x + c[-1]``.

    Attributes
    ----------
    kind : {"linear", "quadratic"}
    n_pieces : int
        R, the number of pieces.
    knots : ndarray [R + 1]
        Breakpoints, from -inf to +inf (read-only).
    a, b, c : ndarray [R]
        Coefficients of the pieces (read-only); ``a`` is 0 for linear bounds.
    max_error : float
        ``sup_x B(x) - llp(x)`` (exact per-piece maxima).
    """

    __slots__ = ("kind", "n_pieces", "knots", "a", "b", "c", "max_error")

    def __init__(self, kind, n_pieces, knots, a, b, c, max_error):
        values = dict(kind=str(kind), n_pieces=int(n_pieces), max_error=float(max_error))
        for name, arr in (("knots", knots), ("a", a), ("b", b), ("c", c)):
            arr = np.array(arr, dtype=np.float64)
            arr.setflags(write=False)
            values[name] = arr
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError("LLPBound is immutable")

    def __reduce__(self):
        return (LLPBound, (self.kind, self.n_pieces, self.knots, self.a, self.b, self.c,
                           self.max_error))

    def __repr__(self):
        return (f"LLPBound(kind={self.kind!r}, n_pieces={self.n_pieces}, "
                f"max_error={self.max_error:.4e})")

    def __call__(self, x):
        """Evaluate B at x (array_like, any shape); at a breakpoint the right piece applies."""
        x = np.asarray(x, dtype=np.float64)
        r = np.searchsorted(self.knots[1:-1], x, side="right")
        a, b = self.a[r], self.b[r]
        # Terms with a zero coefficient are left out, not multiplied: at x = -inf or +inf the
        # end pieces (c, and x + c) give c and inf, not 0 * inf = NaN.
        with np.errstate(invalid="ignore"):
            ax = np.where(a == 0.0, 0.0, a * x)
            return np.where((a == 0.0) & (b == 0.0), 0.0, (ax + b) * x) + self.c[r]


def _check_request(n_pieces, kind):
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if (
        isinstance(n_pieces, bool)
        or not isinstance(n_pieces, (int, np.integer))
        or not MIN_PIECES <= n_pieces <= MAX_PIECES
    ):
        raise ValueError(
            f"n_pieces must be an int between {MIN_PIECES} and {MAX_PIECES}, got {n_pieces!r}"
        )
    return int(n_pieces)


def build_llp_bound(n_pieces, kind="quadratic"):
    """Compute the minimax piecewise upper bound on llp from scratch (offline work).

    Parameters
    ----------
    n_pieces : int
        R, between 3 and 20.
    kind : {"quadratic", "linear"}

    Returns
    -------
    LLPBound
        The bound with the smallest maximum error among R-piece bounds of that kind (up to the
        root-finding tolerance, ~1e-14 relative, and the 1e-15 safety margin on c).
    """
    n_pieces = _check_request(n_pieces, kind)
    knots, a, b, c = _Method(kind).build(n_pieces)
    return LLPBound(kind, n_pieces, knots, a, b, c, _gap_extremes(knots, a, b, c)[1])


def _table_path():
    return resources.files("pygpfast").joinpath(f"data/{_TABLE_FILE}")


_COLUMNS = ["kind", "n_pieces", "piece", "lower", "upper", "a", "b", "c", "max_error"]


def write_tables(path=None):
    """Build every bound (both kinds, R = 3..20) and store them as CSV.

    Parameters
    ----------
    path : str or Path, optional
        Destination; by default the package's ``data/llp_bounds.csv``.

    Returns
    -------
    Path
        Where the tables were written.
    """
    path = Path(path) if path is not None else Path(__file__).parent / "data" / _TABLE_FILE
    rows = []
    for kind in KINDS:
        for R in range(MIN_PIECES, MAX_PIECES + 1):
            bound = build_llp_bound(R, kind)
            lowest = _gap_extremes(bound.knots, bound.a, bound.b, bound.c)[0]
            if lowest < 0.0:
                raise RuntimeError(f"{kind} R={R}: B - llp reaches {lowest:.3g} < 0")
            for r in range(R):
                rows.append([kind, R, r, bound.knots[r], bound.knots[r + 1], bound.a[r],
                             bound.b[r], bound.c[r], bound.max_error])
    with open(path, "w", newline="") as f:
        f.write(
            "# Minimax piecewise upper bounds on llp(x) = log(1 + exp(x)), written by "
            "pygpfast.piecewise.write_tables().\n"
            "# Piece r of (kind, n_pieces): a x^2 + b x + c on [lower, upper); max_error = "
            "sup_x B(x) - llp(x) of the whole bound.\n"
        )
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(_COLUMNS)
        for row in rows:
            writer.writerow([v if isinstance(v, (str, int)) else repr(float(v)) for v in row])
    return path


@functools.lru_cache(maxsize=None)
def _stored_tables():
    tables = {}
    with _table_path().open("r") as f:
        reader = csv.reader(line for line in f if not line.startswith("#"))
        header = next(reader)
        if header != _COLUMNS:
            raise RuntimeError(f"unexpected header in {_TABLE_FILE}: {header}")
        for kind, R, r, lower, upper, a, b, c, err in reader:
            entry = tables.setdefault((kind, int(R)), {"knots": [float(lower)], "a": [], "b": [],
                                                       "c": [], "max_error": float(err)})
            entry["knots"].append(float(upper))
            entry["a"].append(float(a))
            entry["b"].append(float(b))
            entry["c"].append(float(c))
    return {
        key: LLPBound(key[0], key[1], t["knots"], t["a"], t["b"], t["c"], t["max_error"])
        for key, t in tables.items()
    }


def llp_bound(n_pieces=20, kind="quadratic"):
    """The stored minimax piecewise upper bound on llp(x) = log(1 + e^x).

    Parameters
    ----------
    n_pieces : int, default 20
        R, between 3 and 20.
    kind : {"quadratic", "linear"}, default "quadratic"

    Returns
    -------
    LLPBound
        Immutable; ``bound(x) >= log(1 + exp(x))`` everywhere, with maximum error
        ``bound.max_error`` (1.4214e-4 for R = 20 quadratic, 3.2867e-3 for R = 20 linear).
    """
    n_pieces = _check_request(n_pieces, kind)
    return _stored_tables()[(kind, n_pieces)]


def expected_llp_bound(bound, m, v):
    """E[B(x)] for x ~ N(m_n, v_n), with its derivatives, per point (closed form).

    An upper bound on E[log(1 + e^x)]. Computed in the compiled core from truncated-Gaussian
    moments; the derivatives include the terms from B's jumps at the breakpoints. At v_n = 0 the
    value is B(m_n), dm its slope and dv = a of the piece (the limit v -> 0+ off breakpoints).

    Parameters
    ----------
    bound : LLPBound
        E.g. ``llp_bound(20)``.
    m : array_like [N]
        Means.
    v : array_like [N]
        Variances (>= 0).

    Returns
    -------
    value, dm, dv : ndarray [N]
        ``E[B(x)]``, ``d value / d m`` and ``d value / d v``; ``d^2 value / d m^2 = 2 dv``.
    """
    if not isinstance(bound, LLPBound):
        raise ValueError(f"bound must be an LLPBound (see llp_bound), got {type(bound).__name__}")
    m = as_vector(m, "m")
    v = as_vector(v, "v", size=m.shape[0])
    if np.any(v < 0.0):
        raise ValueError("v (variances) must be >= 0")
    return _core.piecewise.expected_bound(bound.knots, bound.a, bound.b, bound.c, m, v)

