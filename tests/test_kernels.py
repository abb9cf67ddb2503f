"""Public kernel API: values, every gradient against finite differences, algebra, bad input."""

import copy
import pickle

import numpy as np
import pytest
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import kernels as skk

import pygpfast
from pygpfast.kernels import (
    PARAM_BOUNDS,
    RBF,
    Constant,
    Linear,
    Matern12,
    Matern32,
    Matern52,
    Product,
    Sum,
    White,
)

D = 3

KERNELS = {
    "rbf": lambda: RBF(1.3, 0.7),
    "rbf_ard": lambda: RBF(0.8, [0.5, 1.5, 2.5]),
    "matern12": lambda: Matern12(1.1, 0.9),
    "matern12_ard": lambda: Matern12(1.1, [0.9, 0.4, 1.7]),
    "matern32": lambda: Matern32(0.6, 1.2),
    "matern32_ard": lambda: Matern32(0.6, [1.2, 0.3, 0.8]),
    "matern52": lambda: Matern52(2.0, 0.8),
    "matern52_ard": lambda: Matern52(2.0, [0.8, 1.9, 0.6]),
    "linear": lambda: Linear(0.7),
    "linear_ard": lambda: Linear([0.7, 1.4, 0.2]),
    "constant": lambda: Constant(0.9),
    "white": lambda: White(0.3),
    "rbf*linear+white": lambda: RBF(1.3, 0.7) * Linear(0.7) + White(0.3),
    "matern52_ard+constant": lambda: Matern52(2.0, [0.8, 1.9, 0.6]) + Constant(0.9),
    "nested": lambda: (Matern12(1.1, [0.9, 0.4, 1.7]) + Linear([0.7, 1.4, 0.2]) * Matern32())
    * RBF(0.8, [0.5, 1.5, 2.5])
    * (Constant(0.9) + White(0.3) + Matern52(2.0, 0.8)),
}
STATIONARY = [n for n in KERNELS if n.startswith(("rbf", "matern")) and "+" not in n]


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    X, X2 = rng.normal(size=(8, D)), rng.normal(size=(6, D))
    return X, X2, rng.normal(size=(8, 6)), rng.normal(size=(8, 8))


def central_difference(f, x, eps=1e-6):
    x = np.array(x, dtype=np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[idx] = eps
        grad[idx] = (f(x + step) - f(x - step)) / (2 * eps)
    return grad


def assert_gradient(analytic, numeric):
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7)


def objective_of_theta(kernel, X, X2, G):
    def f(theta):
        k = copy.deepcopy(kernel)
        k.theta = theta
        return np.sum(G * k(X, X2))

    return f


@pytest.mark.parametrize("name", KERNELS)
def test_parameter_gradients_match_finite_differences(name, data):
    X, X2, G, Gs = data
    k = KERNELS[name]()
    for X2_, G_ in ((X2, G), (None, Gs)):
        numeric_theta = central_difference(objective_of_theta(k, X, X2_, G_), k.theta)
        assert_gradient(k.grad_theta(X, X2_, G_), numeric_theta)
        # d/dparams = d/dtheta / params (theta = log params)
        assert_gradient(k.grad_params(X, X2_, G_), numeric_theta / k.params)


@pytest.mark.parametrize("name", KERNELS)
def test_input_gradients_match_finite_differences(name, data):
    X, X2, G, Gs = data
    k = KERNELS[name]()
    assert_gradient(k.grad_X(X, X2, G), central_difference(lambda Z: np.sum(G * k(Z, X2)), X))
    assert_gradient(k.grad_X2(X, X2, G), central_difference(lambda Z: np.sum(G * k(X, Z)), X2))
    # K(Z, Z): Z enters through both arguments.
    total = k.grad_X(X, None, Gs) + k.grad_X2(X, None, Gs)
    assert_gradient(total, central_difference(lambda Z: np.sum(Gs * k(Z)), X))
    dparams, dX, dX2 = k.vjp(X, None, Gs, wrt_X=True, wrt_X2=True)
    np.testing.assert_allclose(dX + dX2, total, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("name", KERNELS)
def test_diag_and_its_gradients(name, data):
    X, _, G, _ = data
    k = KERNELS[name]()
    np.testing.assert_allclose(k.diag(X), np.diag(k(X)), rtol=1e-14)
    g = G[:, 0]

    def f(theta):
        kk = copy.deepcopy(k)
        kk.theta = theta
        return g @ kk.diag(X)

    numeric = central_difference(f, k.theta)
    assert_gradient(k.grad_diag_theta(X, g), numeric)
    assert_gradient(k.grad_diag_params(X, g), numeric / k.params)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (RBF(1.5, [0.5, 2.0, 1.0]), 1.5 * skk.RBF([0.5, 2.0, 1.0])),
        (Matern12(1.5, 0.7), 1.5 * skk.Matern(0.7, nu=0.5)),
        (Matern32(1.5, [0.5, 2.0, 1.0]), 1.5 * skk.Matern([0.5, 2.0, 1.0], nu=1.5)),
        (Matern52(0.5, 1.3), 0.5 * skk.Matern(1.3, nu=2.5)),
        (Linear(2.0), 2.0 * skk.DotProduct(sigma_0=1e-300)),
        (Constant(0.4) + White(0.1), skk.ConstantKernel(0.4) + skk.WhiteKernel(0.1)),
    ],
)
def test_values_agree_with_scikit_learn(ours, theirs, data):
    X, X2, _, _ = data
    np.testing.assert_allclose(ours(X, X2), theirs(X, X2), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ours(X), theirs(X), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", STATIONARY)
def test_stationary_kernels_are_positive_semidefinite(name):
    X = np.random.default_rng(3).uniform(-2, 2, size=(150, D))
    k = KERNELS[name]()
    K = k(X)
    np.testing.assert_array_equal(K, K.T)
    np.testing.assert_array_equal(np.diag(K), k.params[0])
    eig = np.linalg.eigvalsh(K)
    assert eig.min() >= -1e-10 * eig.max()


def test_white_is_noise_on_the_training_inputs_only(data):
    X, X2, _, _ = data
    k = White(0.3)
    np.testing.assert_array_equal(k(X), 0.3 * np.eye(len(X)))
    np.testing.assert_array_equal(k(X, X), np.zeros((len(X), len(X))))
    np.testing.assert_array_equal(k(X, X2), np.zeros((len(X), len(X2))))
    np.testing.assert_array_equal(k.diag(X), np.full(len(X), 0.3))
    G = np.arange(64.0).reshape(8, 8)
    np.testing.assert_allclose(k.grad_params(X, None, G), [np.trace(G)])
    np.testing.assert_array_equal(k.grad_params(X, X, G), [0.0])


def test_parameters_layout_names_and_bounds():
    k = RBF(2.0, [0.5, 3.0]) * Linear(0.5) + White(0.1)
    assert isinstance(k, Sum) and isinstance(k.kernels[0], Product)
    assert k.n_params == 5
    assert k.param_names == [
        "sum[0].product[0].rbf.variance",
        "sum[0].product[0].rbf.lengthscale[0]",
        "sum[0].product[0].rbf.lengthscale[1]",
        "sum[0].product[1].linear.variance",
        "sum[1].white.variance",
    ]
    np.testing.assert_array_equal(k.params, [2.0, 0.5, 3.0, 0.5, 0.1])
    np.testing.assert_allclose(k.theta, np.log(k.params))
    np.testing.assert_allclose(k.bounds, np.tile(np.log(PARAM_BOUNDS), (5, 1)))
    k.theta = np.log([1.0, 2.0, 4.0, 0.25, 0.5])
    rbf = k.kernels[0].kernels[0]
    assert rbf.variance == 1.0 and isinstance(rbf.variance, float)
    np.testing.assert_allclose(rbf.lengthscale, [2.0, 4.0])
    assert k.kernels[1].variance == pytest.approx(0.5)
    k.params = [3.0, 1.0, 1.0, 1.0, 1.0]
    assert rbf.variance == 3.0
    codes, params = k._spec(2)
    assert codes.dtype == np.int32 and params.dtype == np.float64
    np.testing.assert_array_equal(codes, [7, 2, 8, 2, 0, 3, 4, 1, 6, 1])


def test_sums_and_products_stay_flat():
    a, b, c = RBF(), Linear(), White()
    assert len((a + b + c).kernels) == 3
    assert len((a * b * c).kernels) == 3
    assert len(((a + b) * c).kernels) == 2
    assert repr((a + b) * c) == (
        "(RBF(variance=1.0, lengthscale=1.0) + Linear(variance=1.0)) * White(variance=1.0)"
    )
    with pytest.raises(TypeError):
        a + 1.0


def test_pickle_and_deepcopy_round_trip(data):
    X, X2, _, _ = data
    k = KERNELS["nested"]()
    for clone in (pickle.loads(pickle.dumps(k)), copy.deepcopy(k)):
        np.testing.assert_array_equal(clone(X, X2), k(X, X2))
        np.testing.assert_array_equal(clone(X), k(X))
        assert repr(clone) == repr(k)


@pytest.fixture
def restore_threads():
    yield
    pygpfast.set_num_threads(None)


def test_results_do_not_depend_on_the_thread_count(restore_threads):
    rng = np.random.default_rng(7)
    X, X2 = rng.normal(size=(600, 5)), rng.normal(size=(500, 5))
    G, Gs = rng.normal(size=(600, 500)), rng.normal(size=(600, 600))
    k = (RBF(1.0, [0.5, 1.0, 2.0, 1.5, 0.7]) + Matern12(0.5, 2.0)) * Linear(
        [1.0, 0.5, 2.0, 1.0, 0.3]
    ) + Matern32(1.0, [1.0, 2.0, 0.5, 0.7, 1.1]) + Matern52(0.5, 0.8) + Constant() + White()

    def everything():
        return [
            k(X, X2),
            k(X),
            k.diag(X),
            *k.vjp(X, X2, G, wrt_X=True, wrt_X2=True),
            *k.vjp(X, None, Gs, wrt_X=True, wrt_X2=True),
            k.grad_diag_params(X, G[:, 0]),
        ]

    pygpfast.set_num_threads(1)
    one = everything()
    pygpfast.set_num_threads(2)
    two = everything()
    for a, b in zip(one, two):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13 * np.abs(a).max())


@pytest.mark.parametrize(
    "X, X2, message",
    [
        (np.array([[0.0, np.nan, 1.0]]), None, "NaN"),
        (np.array([[0.0, np.inf, 1.0]]), None, "infinity"),
        (np.ones(3), None, "2D"),
        (np.ones((0, 3)), None, "0 sample"),
        ("abc", None, "string"),
        ([["a", "b", "c"]], None, "string"),
        (np.ones((2, 3)), np.ones((2, 2)), "features"),
        (np.ones((2, 3)), np.array([[np.nan, 0.0, 0.0]]), "NaN"),
        (np.ones((2, 2)), None, "lengthscale has 3 entries"),
    ],
)
def test_bad_inputs_raise_value_error(X, X2, message):
    k = RBF(lengthscale=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=message):
        k(X, X2)
    with pytest.raises(ValueError, match=message):
        k.grad_params(X, X2, np.ones((2, 2)))
    if X2 is None:
        with pytest.raises(ValueError, match=message):
            k.diag(X)


def test_bad_adjoints_raise_value_error(data):
    X, X2, G, _ = data
    k = RBF()
    with pytest.raises(ValueError, match="G has shape"):
        k.grad_params(X, X2, G.T)
    with pytest.raises(ValueError, match="NaN"):
        k.grad_params(X, X2, np.full_like(G, np.nan))
    with pytest.raises(ValueError, match="length 8"):
        k.grad_diag_params(X, np.ones(3))


@pytest.mark.parametrize(
    "make",
    [
        lambda: RBF(variance=0.0),
        lambda: RBF(variance=-1.0),
        lambda: RBF(lengthscale=np.nan),
        lambda: Matern32(lengthscale=[1.0, -2.0]),
        lambda: Matern52(lengthscale=[]),
        lambda: Matern12(lengthscale=np.ones((2, 2))),
        lambda: RBF(variance=[1.0, 2.0]),
        lambda: Linear(np.inf),
        lambda: Constant("big"),
        lambda: White(None),
        lambda: Sum([]),
        lambda: Product([RBF(), 3]),
    ],
)
def test_bad_hyperparameters_raise_value_error(make):
    with pytest.raises(ValueError):
        make()


def test_bad_theta_and_params_raise_value_error_and_change_nothing():
    k = RBF(1.0, [1.0, 2.0]) + White(0.1)
    before = k.params
    for bad in ([0.0, 0.0, np.nan, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1e4], [0.0] * 3 + [-1e4]):
        with pytest.raises(ValueError):
            k.theta = bad
    for bad in ([1.0, 1.0, 1.0, 0.0], [1.0, 1.0, -1.0, 1.0], [1.0, 1.0]):
        with pytest.raises(ValueError):
            k.params = bad
    np.testing.assert_array_equal(k.params, before)
    with pytest.raises(ValueError):
        k.kernels[0].lengthscale = [1.0, 0.0]



def test_nested_parameters_reach_the_kernel_from_an_estimator():
    # scikit-learn's set_params and GridSearchCV address a kernel's hyperparameters as
    # kernel__<name>; without get_params / set_params on the kernel they raised AttributeError
    from sklearn.base import clone
    from sklearn.model_selection import GridSearchCV

    k = RBF() * Linear([1.0, 2.0]) + White(0.1)
    params = k.get_params()
    assert params["kernels__0__kernels__1__variance"].tolist() == [1.0, 2.0]
    assert params["kernels__1"] is k.kernels[1]
    assert set(k.get_params(deep=False)) == {"kernels"}
    k.set_params(kernels__0__kernels__0__lengthscale=[0.5, 3.0], kernels__1=Constant(2.0))
    assert repr(k) == ("(RBF(variance=1.0, lengthscale=[0.5, 3.0]) * Linear(variance=[1.0, 2.0]))"
                       " + Constant(variance=2.0)")
    for bad in ({"foo": 1.0}, {"kernels__2__variance": 1.0}, {"kernels__1__variance__x": 1.0}):
        with pytest.raises(ValueError, match="invalid parameter"):
            k.set_params(**bad)
    with pytest.raises(ValueError, match="finite and > 0"):
        k.set_params(kernels__1__variance=-1.0)
    copy_ = clone(k)
    assert copy_ is not k and repr(copy_) == repr(k)

    rng = np.random.default_rng(0)
    X = rng.normal(size=(45, 2))
    y = (X[:, 0] + 0.3 * rng.normal(size=45) > 0).astype(int)
    est = pygpfast.VGPClassifier(kernel=RBF(), optimize_hyperparameters=False)
    assert est.set_params(kernel__lengthscale=3.0).kernel.lengthscale == 3.0
    # (lengthscale 0.01 is far below the distances between these inputs: K(X, X) is diagonal,
    # a memoriser, which the fit warns about)
    with pytest.warns(ConvergenceWarning, match="numerically diagonal"):
        search = GridSearchCV(est, {"kernel__lengthscale": [0.01, 1.0]}, cv=3).fit(X, y)
    assert search.best_params_ == {"kernel__lengthscale": 1.0}
    assert search.best_estimator_.kernel_.lengthscale == pytest.approx(1.0)
    assert est.kernel.lengthscale == 3.0  # the search's clones leave the estimator's kernel


def test_a_kernel_object_occurs_once_in_a_combination():
    # k + k * Matern12() listed k's hyperparameters twice, and setting theta kept the second
    # copy only: theta[0] += 1 changed nothing while grad_theta[0] was 1263 (fuzz k02)
    k = RBF()
    for make in (lambda: k + k, lambda: k * k, lambda: k + k * Matern12(),
                 lambda: Sum([k, Product([Linear(), k])]), lambda: (k + White()) * (k + White())):
        with pytest.raises(ValueError, match="occurs more than once.*deepcopy"):
            make()
    s = k + copy.deepcopy(k) * Matern12()
    theta = s.theta
    theta[0] += 1.0
    s.theta = theta
    # (to the rounding of exp and log: numpy 1.23's AVX-512 versions leave theta = 1 an ulp off)
    np.testing.assert_allclose(s.theta, theta, rtol=1e-15, atol=1e-15)
    with pytest.raises(ValueError, match="occurs more than once"):
        s.set_params(kernels__1__kernels__1=k)
    assert repr(s.kernels[1].kernels[1]) == "Matern12(variance=1.0, lengthscale=1.0)"
