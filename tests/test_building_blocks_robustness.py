"""The public building blocks (kernels, likelihoods, linalg, piecewise) on adversarial but
plausible inputs: extreme scales, singular factors, bad parameter types."""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import pygpfast
from pygpfast import LinAlgError, kernels, likelihoods, linalg, piecewise

STATIONARY = [kernels.RBF, kernels.Matern12, kernels.Matern32, kernels.Matern52]


def _stationary_reference(cls, A, B):
    with np.errstate(invalid="ignore", over="ignore"):
        r2 = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)
        r = np.sqrt(r2)
        f = {
            kernels.RBF: lambda: np.exp(-r2 / 2),
            kernels.Matern12: lambda: np.exp(-r),
            kernels.Matern32: lambda: (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r),
            kernels.Matern52: lambda: (1 + np.sqrt(5) * r + 5 * r2 / 3) * np.exp(-np.sqrt(5) * r),
        }[cls]()
    return np.where(np.isinf(r2), 0.0, f)


# ---- kernels ----


@pytest.mark.parametrize("cls", STATIONARY)
def test_stationary_kernels_far_apart_inputs_are_not_nan(cls):
    # Inputs ~1e155 lengthscales apart: r^2 = |a|^2 + |b|^2 - 2 a.b overflowed to inf - inf
    # (NaN, also for a point against a copy of itself), and the Matern kernels gave
    # (1 + sqrt(3) r) e^(-sqrt(3) r) = inf * 0 = NaN at r = inf. The limit is 0 (1 at r = 0).
    X = np.array([[1e155], [-1e155], [0.0]])
    X2 = np.array([[1e155], [-1e155], [3e160], [1.0]])
    k = cls(variance=2.0)
    # (Exact where the limit is 0 or the variance; the one finite pair at distance 1 to the
    # rounding: FMA contraction in the core, -ffp-contract=fast, follows inlining decisions and
    # moved the Matern 3/2 value by an ulp when unrelated code changed.)
    for got, ref in ((k(X, X2), 2.0 * _stationary_reference(cls, X, X2)),
                     (k(X), 2.0 * _stationary_reference(cls, X, X))):
        assert np.all(np.isfinite(got))
        np.testing.assert_array_equal(got[(ref == 0.0) | (ref == 2.0)], ref[(ref == 0.0) | (ref == 2.0)])
        np.testing.assert_allclose(got, ref, rtol=1e-15, atol=0)
    np.testing.assert_array_equal(k(np.array([[0.0]]), np.array([[1e160]])), [[0.0]])
    # The same points on an ordinary scale (the lengthscale scaled with them) are unchanged.
    np.testing.assert_allclose(
        cls(2.0, 1e155)(X, X2), 2.0 * _stationary_reference(cls, X / 1e155, X2 / 1e155),
        rtol=1e-12, atol=1e-300,
    )
    # The gradients: pairs infinitely far apart add nothing (their 0 * inf gave NaN in the
    # lengthscale's gradient and in dX2), pairs at distance 0 add nothing to the lengthscale and
    # the inputs, so only the pair (0, 1) is left beside the variance's sum of G o K.
    G = np.ones((3, 4))
    near = cls(variance=2.0)
    g_pair = near.grad_params(np.array([[0.0]]), np.array([[1.0]]), np.ones((1, 1)))
    np.testing.assert_allclose(k.grad_params(X, X2, G),
                               [k(X, X2).sum() / 2.0, g_pair[1]], rtol=1e-14)
    dX, dX2 = k.grad_X(X, X2, G), k.grad_X2(X, X2, G)
    np.testing.assert_array_equal(dX[:2], 0.0)
    np.testing.assert_allclose(dX[2], near.grad_X(np.array([[0.0]]), np.array([[1.0]]), np.ones((1, 1)))[0],
                               rtol=1e-14)
    np.testing.assert_array_equal(dX2[:3], 0.0)
    np.testing.assert_allclose(dX2[3], near.grad_X2(np.array([[0.0]]), np.array([[1.0]]), np.ones((1, 1)))[0],
                               rtol=1e-14)


@pytest.mark.parametrize("cls", STATIONARY)
def test_stationary_kernels_match_formula_on_strided_views(cls, rng):
    # (No defect: a reference for the fix above, on Fortran-ordered and reversed views.)
    X = np.asfortranarray(rng.standard_normal((6, 3)))
    X2 = rng.standard_normal((10, 3))[::-2]
    ls = np.array([0.5, 1.2, 2.0])
    k = cls(1.7, ls)
    np.testing.assert_allclose(k(X, X2), 1.7 * _stationary_reference(cls, X / ls, X2 / ls),
                               rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("value", [True, np.bool_(True), [True, True]])
def test_kernel_hyperparameters_refuse_bools(value):
    # RBF(variance=True) was silently taken for variance 1.0 (the likelihoods refuse bools).
    with pytest.raises(ValueError, match="lengthscale must be a positive number"):
        kernels.RBF(lengthscale=value)
    k = kernels.Linear()
    with pytest.raises(ValueError, match="variance must be a positive number"):
        k.variance = value
    assert k.variance == 1.0


@pytest.mark.parametrize("cls", [kernels.Sum, kernels.Product])
def test_combination_of_a_single_kernel_is_a_clear_error(cls):
    # Sum(RBF()) raised "TypeError: 'RBF' object is not iterable"; Sum(3) a TypeError too.
    with pytest.raises(ValueError, match="sequence of Kernel objects"):
        cls(kernels.RBF())
    with pytest.raises(ValueError, match="sequence of Kernel objects"):
        cls(3)
    assert isinstance(cls([kernels.RBF()]), cls)


# ---- likelihoods ----


def test_bernoulli_link_of_wrong_type_is_a_value_error():
    # Bernoulli(link=[...]) raised "TypeError: unhashable type: 'list'".
    with pytest.raises(ValueError, match="link must be"):
        likelihoods.Bernoulli(link=["logit"])


@pytest.mark.parametrize("theta", [1000.0, -1000.0])
def test_likelihood_theta_overflow_is_a_clear_error(theta):
    # theta = 1000 leaked numpy's "overflow encountered in exp" RuntimeWarning and was refused
    # as "params contains NaN or infinity" (a name the caller did not pass); -1000 as
    # "variance ... got np.float64(0.0)". Now both name theta, as Kernel.theta does.
    lik = likelihoods.Gaussian(0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=r"exp\(theta\)"):
            lik.theta = [theta]
    assert lik.variance == 0.5
    lik.theta = [np.log(2.0)]
    assert lik.variance == pytest.approx(2.0)


def test_poisson_predictive_log_density_of_an_overflowing_rate_is_minus_inf():
    # Every quadrature node's rate exp(f) overflowed at mu = 1000: log 0 came out as
    # -inf - -inf = NaN from the log-sum-exp. A density that underflows at some nodes only
    # stays the finite log-sum-exp of the others.
    lik = likelihoods.Poisson()
    out = lik.predict_log_density(np.array([2.0, 3.0, 0.0]), np.array([1000.0, 1.0, 700.0]),
                                  np.array([0.1, 0.1, 40.0]))
    assert out[0] == -np.inf
    assert np.isfinite(out[1:]).all() and out[2] < -1e280


# ---- linalg ----


def _run_isolated(code, timeout=60):
    """Run `code` in a fresh interpreter (with this session's pygpfast): a hang fails the test.
    It runs in the directory that holds that pygpfast, since `-c` puts the working directory
    first on sys.path (in a checkout with an installed package, the sources have no _core)."""
    package_root = os.path.dirname(os.path.dirname(pygpfast.__file__))
    env = dict(os.environ, PYTHONPATH=package_root)
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=package_root,
                          capture_output=True, text=True, timeout=timeout)


def test_cholesky_of_a_tiny_singular_matrix_ends():
    # Mean diagonal 1e-320: the first jitter (1e-10 times it) underflowed to 0, and growing it
    # x10 kept it 0 below a maximum that was 0 too: cholesky looped forever.
    out = _run_isolated(
        "import numpy as np\n"
        "from pygpfast import LinAlgError, linalg\n"
        "try:\n"
        "    linalg.cholesky(np.full((3, 3), 1e-320))\n"
        "except LinAlgError as e:\n"
        "    print('LinAlgError', e)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("LinAlgError") and "not positive definite" in out.stdout


def test_cholesky_of_a_huge_singular_matrix_is_finite():
    # Diagonal 1e308: the sum behind the mean diagonal overflowed, so the jitter was inf and
    # the "factor" was inf on its diagonal (with only a warning).
    A = np.ones((3, 3)) * 1e308
    with pytest.warns(pygpfast.NumericalWarning, match="jitter 1e\\+298"):
        L = linalg.cholesky(A)
    assert np.all(np.isfinite(L))
    np.testing.assert_allclose((L / 1e154) @ (L / 1e154).T, np.ones((3, 3)) * 1e308 / 1e308,
                               rtol=1e-9)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -1.0, None, "1e-4", True])
def test_cholesky_max_relative_jitter_is_checked(bad):
    # NaN and inf were accepted and ignored (a singular matrix got jitter 10x its diagonal
    # with max_relative_jitter=nan), -1 gave "jitter up to -1.000000", None a TypeError from
    # float() and True was taken for 1.
    with pytest.raises(ValueError, match="max_relative_jitter"):
        linalg.cholesky(np.diag([3.0, -1.0]), max_relative_jitter=bad)


def test_solve_lower_with_a_zero_on_the_diagonal_raises():
    # A singular L gave inf/NaN silently (scipy.linalg.solve_triangular raises LinAlgError).
    L = np.array([[1.0, 0.0], [2.0, 0.0]])
    with pytest.raises(LinAlgError, match=r"L\[1, 1\] = 0"):
        linalg.solve_lower(L, np.ones(2))
    with pytest.raises(LinAlgError, match="singular"):
        linalg.solve_lower(L, np.ones((2, 3)), transpose=True)


@pytest.mark.parametrize("update", [linalg.cholesky_update, linalg.cholesky_downdate])
def test_rank_one_update_with_a_zero_on_the_diagonal_raises(update):
    # cholesky_update returned NaN/inf silently; cholesky_downdate said "||L^-1 x||^2 = -nan".
    with pytest.raises(LinAlgError, match=r"L\[0, 0\] = 0"):
        update(np.zeros((3, 3)), np.full(3, 0.1))


@pytest.mark.parametrize("update,sign", [(linalg.cholesky_update, 1.0),
                                         (linalg.cholesky_downdate, -1.0)])
def test_rank_one_update_reads_only_the_lower_triangle(update, sign, rng):
    # The strict upper triangle of L was copied into the result, so a factor from
    # scipy.linalg.cho_factor(lower=True) (which leaves the upper triangle as it was) gave a
    # "lower factor" that was not lower triangular and whose L @ L.T was wrong.
    B = rng.standard_normal((6, 6))
    A = B @ B.T + 6 * np.eye(6)
    L = np.linalg.cholesky(A)
    x = 0.3 * rng.standard_normal(6)
    garbage = L + np.triu(np.full((6, 6), 7.0), 1)
    out = update(garbage, x)
    np.testing.assert_array_equal(out, update(L, x))
    assert np.all(np.triu(out, 1) == 0)
    np.testing.assert_allclose(out @ out.T, A + sign * np.outer(x, x), rtol=1e-12)


@pytest.mark.parametrize("scale", [1e200, 1e-200])
def test_cholesky_downdate_of_huge_or_tiny_factors(scale):
    # (l - x)(l + x) overflowed for factors beyond ~1e154 (inf, then NaN below the diagonal)
    # and underflowed to 0 below ~1e-154 (a division by 0); cholesky_update had no such limit.
    L = np.array([[1.0, 0.0], [0.5, 2.0]])
    x = np.array([0.3, -0.4])
    expected = linalg.cholesky_downdate(L, x)
    out = linalg.cholesky_downdate(L * scale, x * scale)
    np.testing.assert_allclose(out / scale, expected, rtol=1e-14)


# ---- piecewise ----


def test_expected_llp_bound_at_huge_means_is_finite():
    # With |m| beyond ~1e154 the quadratic bound gave NaN: a piece without probability mass
    # contributed (a m^2 = inf) * 0. The value is m + c_R for large m and c_1 for very negative m.
    bound = piecewise.llp_bound(20)
    m = np.array([1e200, -1e200, 1e155, -1e155])
    value, dm, dv = piecewise.expected_llp_bound(bound, m, np.ones(4))
    np.testing.assert_array_equal(value, [1e200, bound.c[0], 1e155, bound.c[0]])
    np.testing.assert_array_equal(dm, [1.0, 0.0, 1.0, 0.0])
    np.testing.assert_array_equal(dv, 0.0)


@pytest.mark.parametrize("kind", ["quadratic", "linear"])
def test_llp_bound_at_infinity_is_its_limit(kind):
    # The end pieces are c (a = b = 0) and x + c (a = 0): 0 * inf made both NaN, with a
    # RuntimeWarning. The limits of B(x) >= log(1 + e^x) are c[0] and inf.
    bound = piecewise.llp_bound(20, kind)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = bound(np.array([-np.inf, np.inf, 0.0]))
    np.testing.assert_array_equal(out[:2], [bound.c[0], np.inf])
    assert out[2] == pytest.approx(np.log(2.0), abs=bound.max_error)
