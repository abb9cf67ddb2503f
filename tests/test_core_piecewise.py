"""The raw piecewise-bound binding (pygpfast._core.piecewise.expected_bound).

E[B(x)] for x ~ N(m, v) against brute-force quadrature, its derivatives against finite
differences, the heat-equation identity, limits (v = 0, large |m|), thread invariance and
argument checks. B is the stored 20-piece quadratic bound (discontinuous at its breakpoints) and
a small hand-made table with large jumps.
"""

import numpy as np
import pytest
from scipy import integrate

import pygpfast
from pygpfast import _core
from pygpfast.piecewise import llp_bound

BOUND = llp_bound(20, "quadratic")
TABLE = (BOUND.knots, BOUND.a, BOUND.b, BOUND.c)

# Jumps of +0.5 and -1 and kinks, a positive curvature everywhere except the first piece.
TOY = (
    np.array([-np.inf, -1.0, 0.5, 2.0, np.inf]),
    np.array([0.0, 0.3, 1.0, 0.05]),
    np.array([0.2, -0.4, 0.0, 1.0]),
    np.array([1.0, 0.5, -0.25, 2.0]),
)


def expected(table, m, v):
    m = np.atleast_1d(np.asarray(m, dtype=np.float64))
    v = np.broadcast_to(np.asarray(v, dtype=np.float64), m.shape).copy()
    return _core.piecewise.expected_bound(*table, m, v)


def quad_reference(table, m, v):
    """E[B(x)] by adaptive quadrature per piece, in the standardised variable z = (x - m)/s."""
    knots, a, b, c = table
    s = np.sqrt(v)
    total = 0.0
    for r in range(len(a)):
        lo = max((knots[r] - m) / s, -40.0)
        hi = min((knots[r + 1] - m) / s, 40.0)
        if lo >= hi:
            continue

        def integrand(z, r=r):
            x = m + s * z
            return (a[r] * x * x + b[r] * x + c[r]) * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)

        total += integrate.quad(integrand, lo, hi, epsabs=1e-300, epsrel=1e-13, limit=200)[0]
    return total


M_GRID = [-40.0, -12.3, -8.858606, -3.0, -0.7, 0.0, 0.3, 1.7507667, 2.3, 6.1, 15.0, 40.0]
V_GRID = [1e-12, 1e-6, 1e-3, 0.1, 1.0, 10.0, 100.0, 1e3]


@pytest.mark.parametrize("table", [TABLE, TOY], ids=["llp20", "toy"])
@pytest.mark.parametrize("v", V_GRID)
def test_value_matches_quadrature(table, v):
    value, _, _ = expected(table, M_GRID, v)
    ref = np.array([quad_reference(table, m, v) for m in M_GRID])
    # Per-point relative agreement (the quadrature reference is good to ~1e-13).
    np.testing.assert_allclose(value, ref, rtol=1e-12, atol=0)


@pytest.mark.parametrize("table", [TABLE, TOY], ids=["llp20", "toy"])
def test_value_is_the_bound_at_zero_variance(table):
    knots, a, b, c = table
    m = np.concatenate([np.linspace(-12, 12, 97), knots[1:-1]])  # breakpoints: right piece
    value, dm, dv = expected(table, m, 0.0)
    r = np.searchsorted(knots[1:-1], m, side="right")
    np.testing.assert_array_equal(value, (a[r] * m + b[r]) * m + c[r])
    np.testing.assert_array_equal(dm, 2 * a[r] * m + b[r])
    np.testing.assert_array_equal(dv, a[r])


@pytest.mark.parametrize("table", [TABLE, TOY], ids=["llp20", "toy"])
def test_small_variance_tends_to_the_bound(table):
    knots, a, b, c = table
    m = np.array([-30.0, -4.0, -0.3, 0.9, 1.1, 5.0, 30.0])  # at least 0.1 from every breakpoint
    value, dm, dv = expected(table, m, 1e-12)
    v0, dm0, dv0 = expected(table, m, 0.0)
    np.testing.assert_allclose(value, v0, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(dm, dm0, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(dv, dv0, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("table", [TABLE, TOY], ids=["llp20", "toy"])
@pytest.mark.parametrize("v", [1e-4, 1e-2, 0.3, 1.0, 10.0, 1e3])
def test_derivatives_match_finite_differences(table, v):
    # Includes means on and near breakpoints, where the jump terms dominate.
    m = np.array(M_GRID + [BOUND.knots[5] + 1e-3, -0.99, 0.5, 0.51, 2.0])
    value, dm, dv = expected(table, m, v)
    s = np.sqrt(v)
    hm = 1e-4 * s
    fd_m = (expected(table, m + hm, v)[0] - expected(table, m - hm, v)[0]) / (2 * hm)
    hv = 1e-4 * v
    fd_v = (expected(table, m, v + hv)[0] - expected(table, m, v - hv)[0]) / (2 * hv)
    # Central differences: truncation ~ 1e-8 relative, rounding ~ 1e-16 |value| / h per point.
    noise = 1e-16 * (1.0 + np.abs(value))
    np.testing.assert_array_less(np.abs(dm - fd_m), 1e-7 * np.abs(dm) + 10 * noise / hm)
    np.testing.assert_array_less(np.abs(dv - fd_v), 1e-7 * np.abs(dv) + 10 * noise / hv)


@pytest.mark.parametrize("table", [TABLE, TOY], ids=["llp20", "toy"])
@pytest.mark.parametrize("v", [1e-3, 0.3, 1.0, 10.0, 1e3])
def test_second_derivative_in_m_is_twice_dv(table, v):
    # Heat equation: d/dv N(x; m, v) = (1/2) d^2/dm^2 N(x; m, v), so d2E/dm2 = 2 dE/dv.
    m = np.array(M_GRID)
    _, _, dv = expected(table, m, v)
    h = 1e-4 * np.sqrt(v)
    d2m = (expected(table, m + h, v)[1] - expected(table, m - h, v)[1]) / (2 * h)
    noise = 1e-16 * (1.0 + np.abs(expected(table, m, v)[1]))
    np.testing.assert_array_less(np.abs(d2m - 2 * dv), 1e-7 * np.abs(dv) + 10 * noise / h)


def test_mirror_symmetry_holds_far_in_the_tails():
    # The llp bounds satisfy B(-x) = B(x) - x, hence E(-m, v) = E(m, v) - m; checks accuracy where
    # one side is tiny (the constant piece) and the other is dominated by x + c.
    m = np.array([5.0, 20.0, 40.0, 300.0, 1e6])
    for v in [1e-12, 1.0, 100.0, 1e3]:
        value, dm, dv = expected(TABLE, m, v)
        value_neg, dm_neg, dv_neg = expected(TABLE, -m, v)
        np.testing.assert_array_less(np.abs(value_neg - (value - m)), 1e-15 * (m + v) + 1e-16)
        np.testing.assert_allclose(dm_neg, 1.0 - dm, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dv_neg, dv, rtol=1e-9, atol=1e-15)


def test_large_means_are_stable():
    m = np.array([-1e6, -1e3, 1e3, 1e6])
    for v in [1e-300, 1.0, 1e3]:
        value, dm, dv = expected(TABLE, m, v)
        assert np.all(np.isfinite(value) & np.isfinite(dm) & np.isfinite(dv))
        np.testing.assert_allclose(value, BOUND(m), rtol=1e-14)
        np.testing.assert_allclose(dm, [0.0, 0.0, 1.0, 1.0], rtol=0, atol=1e-200)
        np.testing.assert_allclose(dv, 0.0, rtol=0, atol=1e-200)


def test_results_do_not_depend_on_thread_count(restore_threads, rng):
    n = 100_000
    m = rng.uniform(-15, 15, n)
    v = np.exp(rng.uniform(np.log(1e-8), np.log(1e3), n))
    v[::17] = 0.0
    pygpfast.set_num_threads(1)
    one = _core.piecewise.expected_bound(*TABLE, m, v)
    pygpfast.set_num_threads(2)
    two = _core.piecewise.expected_bound(*TABLE, m, v)
    for x, y in zip(one, two):
        np.testing.assert_array_equal(x, y)


def bad(table, **change):
    knots, a, b, c = (np.array(x, dtype=np.float64) for x in table)
    t = dict(knots=knots, a=a, b=b, c=c)
    t.update({k: np.asarray(val, dtype=np.float64) for k, val in change.items()})
    return t["knots"], t["a"], t["b"], t["c"]


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(knots=[-np.inf, -1.0, 0.5, np.inf]), "one more entry"),
        (dict(a=[0.0, 0.3, 1.0]), "same length"),
        (dict(knots=[-1e9, -1.0, 0.5, 2.0, np.inf]), "-inf"),
        (dict(knots=[-np.inf, -1.0, 0.5, 2.0, 1e9]), "-inf and end at \\+inf"),
        (dict(knots=[-np.inf, 0.5, -1.0, 2.0, np.inf]), "strictly increasing"),
        (dict(knots=[-np.inf, -1.0, -1.0, 2.0, np.inf]), "strictly increasing"),
        (dict(knots=[-np.inf, -1.0, np.nan, 2.0, np.inf]), "finite"),
        (dict(a=[0.0, -0.3, 1.0, 0.05]), "a\\[1\\] = -0.3"),
        (dict(b=[0.0, np.nan, 1.0, 0.05]), "piece 1 must be finite"),
        (dict(c=[0.0, 0.0, np.inf, 0.05]), "piece 2 must be finite"),
        (dict(knots=[-np.inf], a=[], b=[], c=[]), "at least one piece"),
    ],
)
def test_bad_tables_raise(change, message):
    with pytest.raises(ValueError, match=message):
        _core.piecewise.expected_bound(*bad(TOY, **change), np.zeros(2), np.ones(2))


def test_bad_points_raise():
    with pytest.raises(ValueError, match="v\\[1\\] = -1"):
        _core.piecewise.expected_bound(*TOY, np.zeros(2), np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="v\\[0\\] = inf"):
        _core.piecewise.expected_bound(*TOY, np.zeros(2), np.array([np.inf, 1.0]))
    with pytest.raises(ValueError, match="m\\[1\\] = nan"):
        _core.piecewise.expected_bound(*TOY, np.array([0.0, np.nan]), np.ones(2))
    with pytest.raises(ValueError, match="v must have length 2, got 3"):
        _core.piecewise.expected_bound(*TOY, np.zeros(2), np.ones(3))
    with pytest.raises(ValueError, match="float64"):
        _core.piecewise.expected_bound(*TOY, np.zeros(2, dtype=np.float32), np.ones(2))


def test_single_piece_is_a_gaussian_moment():
    # One quadratic on the whole line: E[a x^2 + b x + c] = a (m^2 + v) + b m + c.
    table = (np.array([-np.inf, np.inf]), np.array([0.7]), np.array([-0.2]), np.array([0.1]))
    m, v = np.array([-3.0, 0.0, 2.5]), np.array([0.0, 1.0, 4.0])
    value, dm, dv = _core.piecewise.expected_bound(*table, m, v)
    np.testing.assert_allclose(value, 0.7 * (m**2 + v) - 0.2 * m + 0.1, rtol=1e-15)
    np.testing.assert_allclose(dm, 1.4 * m - 0.2, rtol=1e-15)
    np.testing.assert_allclose(dv, 0.7, rtol=1e-15)


def test_empty_input():
    value, dm, dv = _core.piecewise.expected_bound(*TOY, np.zeros(0), np.zeros(0))
    assert value.shape == dm.shape == dv.shape == (0,)
