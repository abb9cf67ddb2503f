"""Piecewise upper bounds on llp(x) = log(1 + e^x): stored tables, builder, public API."""

import csv
import pickle
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate

import pygpfast
from pygpfast import piecewise
from pygpfast.piecewise import LLPBound, build_llp_bound, expected_llp_bound, llp_bound

ALL_TABLES = [(kind, R) for kind in ("linear", "quadratic") for R in range(3, 21)]

# Maximum errors of the minimax bounds, R -> (linear, quadratic), from
# shared/reference/llp_bound_errors.csv (an independent numpy/scipy/mpmath prototype; 11 digits).
REFERENCE_MAX_ERROR = {
    3: (2.2314355131e-01, 5.1001455664e-02),
    4: (1.0936059517e-01, 3.2953796850e-02),
    5: (6.4813307963e-02, 9.4763673153e-03),
    6: (4.2853229869e-02, 7.4218613358e-03),
    7: (3.0428960303e-02, 3.2673279123e-03),
    8: (2.2720707324e-02, 2.7552989466e-03),
    9: (1.7610825320e-02, 1.4937351929e-03),
    10: (1.4049873492e-02, 1.3102417670e-03),
    11: (1.1469471148e-02, 8.0386467747e-04),
    12: (9.5399710508e-03, 7.2262286347e-04),
    13: (8.0594830908e-03, 4.8125399967e-04),
    14: (6.8987442516e-03, 4.3992925390e-04),
    15: (5.9718763919e-03, 3.1061032536e-04),
    16: (5.2200143922e-03, 2.8742085746e-04),
    17: (4.6017146511e-03, 2.1200171568e-04),
    18: (4.0871143714e-03, 1.9800057143e-04),
    19: (3.6542542131e-03, 1.5108951332e-04),
    20: (3.2866946533e-03, 1.4214291132e-04),
}

# The published R = 20 quadratic table (Marlin, Khan & Murphy 2011), as distributed in
# emtiyaz/VariationalApproxExample (llp.mat, MIT licence) and shared/reference/llp_bound_R20.csv:
# rows (c, b, a, lower, upper).
PUBLISHED_R20 = [
    (0.000188712193, 0, 0, -np.inf, -8.57519494),
    (0.0280903103, 0.0066486146, 0.000397791059, -8.57519494, -5.93368918),
    (0.110211757, 0.0344326846, 0.00275310085, -5.93368918, -4.5259336),
    (0.23273644, 0.0887019699, 0.00877018698, -4.5259336, -3.52810779),
    (0.372524706, 0.168024214, 0.0200347593, -3.52810779, -2.75154854),
    (0.504567936, 0.264032863, 0.037511596, -2.75154854, -2.09789879),
    (0.606280283, 0.360755794, 0.0605430329, -2.09789879, -1.51969083),
    (0.666125432, 0.439094482, 0.0862567806, -1.51969083, -0.989533382),
    (0.689334264, 0.485091758, 0.109213531, -0.989533382, -0.491473077),
    (0.693147181, 0.499419205, 0.123026104, -0.491473077, 0),
    (0.693147181, 0.500580795, 0.123026104, 0, 0.491473077),
    (0.689334264, 0.514908242, 0.109213531, 0.491473077, 0.989533382),
    (0.666125432, 0.560905518, 0.0862567806, 0.989533382, 1.51969083),
    (0.606280283, 0.639244206, 0.0605430329, 1.51969083, 2.09789879),
    (0.504567936, 0.735967137, 0.037511596, 2.09789879, 2.75154854),
    (0.372524706, 0.831975786, 0.0200347593, 2.75154854, 3.52810779),
    (0.23273644, 0.91129803, 0.00877018698, 3.52810779, 4.5259336),
    (0.110211757, 0.965567315, 0.00275310085, 4.5259336, 5.93368918),
    (0.0280903104, 0.993351385, 0.000397791059, 5.93368918, 8.57519494),
    (0.000188712, 1, 0, 8.57519494, np.inf),
]

GRID = np.linspace(-50.0, 50.0, 2_000_001)
LLP_GRID = np.logaddexp(0.0, GRID)


def llp(x):
    return np.logaddexp(0.0, x)


# Copies of shared/reference's two files (tests/data/make_data.py).
REFERENCE = Path(__file__).resolve().parent / "data"


def dense_gap(bound_fn, knots):
    """B - llp on the 2,000,001-point grid on [-50, 50] plus the breakpoints."""
    inner = np.asarray(knots)[1:-1]
    return np.concatenate([bound_fn(GRID) - LLP_GRID, bound_fn(inner) - llp(inner)])


@pytest.mark.parametrize("kind, R", ALL_TABLES)
def test_stored_table_is_an_upper_bound_with_the_optimal_error(kind, R):
    bound = llp_bound(R, kind)
    assert bound.kind == kind and bound.n_pieces == R
    assert bound.knots.shape == (R + 1,) and bound.a.shape == bound.b.shape == bound.c.shape == (R,)
    gap = dense_gap(bound, bound.knots)
    assert gap.min() >= -1e-12
    # The grid max is the exact max up to rounding in B(x) at |x| <= 50 (~1e-14) and, for the
    # chords' interior maxima, the grid spacing (~1e-10).
    assert bound.max_error - 1e-9 * bound.max_error <= gap.max() <= bound.max_error + 2e-14
    # The optimum of the independent prototype, to its 11 printed digits.
    reference = REFERENCE_MAX_ERROR[R][kind == "quadratic"]
    np.testing.assert_allclose(bound.max_error, reference, rtol=1e-9)


@pytest.mark.parametrize("kind, R", ALL_TABLES)
def test_tails_are_bounded_analytically(kind, R):
    # For x < t_1 the gap is c_1 - llp(x) in (c_1 - llp(t_1), c_1]; for x >= t_{R-1} it is
    # x + c_R - llp(x) = c_R - llp(-x) in [c_R - llp(-t_{R-1}), c_R): both within [0, max_error]
    # however far out, which is what the finite grid cannot show.
    bound = llp_bound(R, kind)
    t_first, t_last = bound.knots[1], bound.knots[-2]
    assert (bound.a[0], bound.b[0]) == (0.0, 0.0)
    assert (bound.a[-1], bound.b[-1]) == (0.0, 1.0)
    assert llp(t_first) <= bound.c[0] <= bound.max_error
    assert llp(-t_last) <= bound.c[-1] <= bound.max_error
    # Mirror symmetry B(-x) = B(x) - x.
    np.testing.assert_array_equal(bound.knots, -bound.knots[::-1])
    np.testing.assert_array_equal(bound.a, bound.a[::-1])
    np.testing.assert_array_equal(bound.c, bound.c[::-1])
    np.testing.assert_allclose(bound.b + bound.b[::-1], 1.0, rtol=0, atol=2e-16)
    assert np.all(bound.a >= 0.0)


@pytest.mark.parametrize("R", range(3, 21))
def test_quadratic_pieces_equioscillate(R):
    # Optimality certificate: every finite piece left of 0 lies max_error above llp at its left
    # end and touches llp at its right end (mirrored on the right), so all piece errors are equal
    # and B jumps by -max_error / +max_error at the breakpoints left / right of 0.
    bound = llp_bound(R, "quadratic")
    eps = bound.max_error
    for r in range(1, R - 1):
        lo, hi = bound.knots[r], bound.knots[r + 1]
        q = np.polynomial.Polynomial([bound.c[r], bound.b[r], bound.a[r]])
        gap_lo, gap_hi = q(lo) - llp(lo), q(hi) - llp(hi)
        if hi <= 0.0:
            np.testing.assert_allclose([gap_lo, gap_hi], [eps, 0.0], rtol=1e-9, atol=1e-14)
        elif lo >= 0.0:
            np.testing.assert_allclose([gap_lo, gap_hi], [0.0, eps], rtol=1e-9, atol=1e-14)
        else:  # the middle piece [-u, u] for odd R: touches llp inside, eps at both ends
            np.testing.assert_allclose([gap_lo, gap_hi], [eps, eps], rtol=1e-9)


@pytest.mark.parametrize("R", range(3, 21))
def test_linear_bounds_are_continuous_chords(R):
    bound = llp_bound(R, "linear")
    inner = bound.knots[1:-1]
    left = bound.b[:-1] * inner + bound.c[:-1]
    right = bound.b[1:] * inner + bound.c[1:]
    np.testing.assert_allclose(left, right, rtol=0, atol=1e-14)
    np.testing.assert_allclose(right - llp(inner), 0.0, atol=2e-15)  # touches llp there
    np.testing.assert_array_equal(bound.a, 0.0)


def test_quadratic_r20_beats_the_published_table():
    published = np.array(PUBLISHED_R20)
    c, b, a, lower, upper = published.T
    knots = np.append(lower, upper[-1])

    def published_bound(x):
        r = np.searchsorted(knots[1:-1], x, side="right")
        return (a[r] * x + b[r]) * x + c[r]

    gap = dense_gap(published_bound, knots)
    published_error = gap.max()
    np.testing.assert_allclose(published_error, 1.9511e-4, rtol=1e-4)
    assert gap.min() > -3e-9  # its 9-digit coefficients violate the bound by up to ~2.3e-9
    ours = llp_bound(20, "quadratic")
    assert ours.max_error < published_error
    np.testing.assert_allclose(ours.max_error / published_error, 0.7285, atol=1e-3)
    # Ours with R = 19 pieces already beats the published R = 20 table.
    assert llp_bound(19, "quadratic").max_error < published_error


@pytest.mark.parametrize("kind", ["linear", "quadratic"])
@pytest.mark.parametrize("R", [3, 4, 5, 6])
def test_fresh_build_reproduces_the_stored_table(kind, R):
    # Bitwise equal on the machine that wrote the tables; elsewhere a different LAPACK may move
    # the root-finders' last iterates within their tolerances (~1e-14).
    fresh, stored = build_llp_bound(R, kind), llp_bound(R, kind)
    np.testing.assert_allclose(fresh.knots, stored.knots, rtol=1e-10, atol=1e-12)
    for name in ("a", "b", "c"):
        np.testing.assert_allclose(getattr(fresh, name), getattr(stored, name), rtol=1e-10,
                                   atol=1e-12)
    np.testing.assert_allclose(fresh.max_error, stored.max_error, rtol=1e-10)


def test_shared_reference_files_match_the_literals_here():
    with open(REFERENCE / "llp_bound_errors.csv") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    for row in rows:
        expected = REFERENCE_MAX_ERROR[int(row["R"])]
        np.testing.assert_allclose([float(row["lin_max_gap"]), float(row["quad_max_gap"])],
                                   expected, rtol=1e-10)
    with open(REFERENCE / "llp_bound_R20.csv") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    published = [[float(row[k]) for k in ("c", "b", "a", "l", "h")] for row in rows]
    np.testing.assert_array_equal(published, np.array(PUBLISHED_R20))


def test_bound_object_is_immutable_and_picklable():
    bound = llp_bound(20)
    with pytest.raises(AttributeError):
        bound.max_error = 0.0
    with pytest.raises(ValueError):
        bound.c[0] = 0.0
    copy = pickle.loads(pickle.dumps(bound))
    assert isinstance(copy, LLPBound) and copy.n_pieces == 20 and copy.kind == "quadratic"
    np.testing.assert_array_equal(copy.c, bound.c)
    assert not copy.c.flags.writeable
    assert llp_bound(20) is bound  # read once
    assert "n_pieces=20" in repr(bound) and "1.4214e-04" in repr(bound)


def test_call_uses_the_right_piece_at_breakpoints():
    bound = llp_bound(6, "quadratic")
    t = bound.knots[2]
    np.testing.assert_allclose(bound([t]), bound.a[2] * t * t + bound.b[2] * t + bound.c[2],
                               rtol=1e-15)
    left_piece = bound.a[1] * t * t + bound.b[1] * t + bound.c[1]
    assert abs(bound(t) - left_piece) > 0.9 * bound.max_error  # the jump
    x = np.array([[-100.0, 0.0], [3.0, 100.0]])
    assert bound(x).shape == (2, 2)
    np.testing.assert_allclose(bound(x)[1, 1], 100.0 + bound.c[-1])
    assert bound(-100.0) == bound.c[0]


@pytest.mark.parametrize(
    "n_pieces, kind, message",
    [
        (2, "quadratic", "n_pieces"),
        (21, "quadratic", "n_pieces"),
        (20.0, "quadratic", "n_pieces"),
        (True, "linear", "n_pieces"),
        ("20", "linear", "n_pieces"),
        (20, "cubic", "kind must be one of"),
    ],
)
def test_bad_requests(n_pieces, kind, message):
    with pytest.raises(ValueError, match=message):
        llp_bound(n_pieces, kind)
    with pytest.raises(ValueError, match=message):
        build_llp_bound(n_pieces, kind)


def test_numpy_integer_n_pieces_is_accepted():
    assert llp_bound(np.int64(7), "linear").n_pieces == 7


def expected_llp(m, v):
    """E[log(1 + e^x)] under N(m, v) by adaptive quadrature in z = (x - m) / sqrt(v)."""
    s = np.sqrt(v)

    def integrand(z):
        return np.logaddexp(0.0, m + s * z) * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)

    kink = -m / s  # where llp turns from ~0 to ~x
    points = sorted({-12.0, min(max(kink, -12.0), 12.0), 12.0})
    return sum(integrate.quad(integrand, lo, hi, epsabs=0, epsrel=1e-13, limit=200)[0]
               for lo, hi in zip(points[:-1], points[1:]))


@pytest.mark.parametrize("kind, R", [("quadratic", 20), ("quadratic", 5), ("linear", 20)])
def test_expected_bound_is_an_upper_bound_on_expected_llp(kind, R):
    bound = llp_bound(R, kind)
    m = np.array([-30.0, -9.0, -3.0, -1.0, 0.0, 0.4, 2.0, 7.0, 25.0])
    for v in [1e-6, 0.01, 1.0, 10.0, 100.0]:
        value, _, _ = expected_llp_bound(bound, m, np.full_like(m, v))
        reference = np.array([expected_llp(mi, v) for mi in m])
        excess = value - reference
        assert np.all(excess >= -1e-12) and np.all(excess <= bound.max_error + 1e-12)


@pytest.mark.parametrize("kind", ["quadratic", "linear"])
def test_expected_bound_at_huge_variances(kind):
    """At v = 1e30 every interior piece lies within 1e-15 of z = 0, and the closed forms'
    differences of Phi and phi values near 0.5 and 0.4 lost everything to a v and s: E[B] was
    3.6% above E[llp] at 1e30 and half of it from 1e60 on (quadratic), d/dv 1000 times off.
    Reference at m = 0: E[llp] = s phi(0) + E[log(1 + e^-|x|)] = s phi(0) + pi^2 phi(0) / (6 s)
    + O(s^-3) (quadrature misses the second term at the kink's width 1 / s); E[B] - E[llp]
    lies in [0, max_error]; d/dv -> phi(0) / (2 s), d/dm -> 1/2."""
    bound = llp_bound(20, kind)
    phi0 = 1 / np.sqrt(2 * np.pi)
    for v in [1e6, 1e10, 1e30, 1e100, 1e300]:
        s = np.sqrt(v)
        value, dm, dv = expected_llp_bound(bound, [0.0], [v])
        reference = s * phi0 + np.pi**2 * phi0 / (6 * s)
        slack = 1e-15 * reference + 1e-9
        assert -slack <= value[0] - reference <= bound.max_error + slack
        np.testing.assert_allclose(dv, phi0 / (2 * s), rtol=10 / s + 1e-14)
        np.testing.assert_allclose(dm, 0.5, rtol=10 / s + 1e-14)


def test_expected_llp_bound_matches_the_core_and_validates(restore_threads):
    bound = llp_bound(20)
    m, v = [0.5, -2.0, 3.0], [1.0, 0.0, 4.0]
    value, dm, dv = expected_llp_bound(bound, m, v)
    core = pygpfast._core.piecewise.expected_bound(bound.knots, bound.a, bound.b, bound.c,
                                                   np.array(m), np.array(v))
    for x, y in zip((value, dm, dv), core):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(value[1], bound(-2.0))
    with pytest.raises(ValueError, match="v \\(variances\\) must be >= 0"):
        expected_llp_bound(bound, m, [1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="NaN"):
        expected_llp_bound(bound, [np.nan, 0.0, 1.0], v)
    with pytest.raises(ValueError, match="v must have length 3"):
        expected_llp_bound(bound, m, [1.0])
    with pytest.raises(ValueError, match="LLPBound"):
        expected_llp_bound((bound.knots, bound.a, bound.b, bound.c), m, v)


def test_write_tables_round_trips(tmp_path, monkeypatch):
    # Writing is slow (all 36 bounds); build two small ones through the same writer instead.
    monkeypatch.setattr(piecewise, "MAX_PIECES", 4)
    path = piecewise.write_tables(tmp_path / "llp.csv")
    text = path.read_text().splitlines()
    assert text[2] == ",".join(piecewise._COLUMNS)
    rows = list(csv.reader(text[3:]))
    assert len(rows) == 2 * (3 + 4)
    stored = llp_bound(4, "quadratic")
    written = [r for r in rows if r[0] == "quadratic" and r[1] == "4"]
    np.testing.assert_allclose([float(r[7]) for r in written], stored.c, rtol=1e-12)
