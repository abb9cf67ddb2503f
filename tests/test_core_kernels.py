"""Raw kernel bindings (_core.kernels.*) against dense numpy references."""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from pygpfast import _core

RBF, M12, M32, M52, LINEAR, CONSTANT, WHITE, SUM, PRODUCT = range(9)
STATIONARY = (RBF, M12, M32, M52)

# ---- a reference implementation on small trees: ("leaf", code, params) / (SUM|PRODUCT, [children])


def leaf(code, *params):
    return ("leaf", code, np.asarray(params, dtype=np.float64))


def describe(tree):
    """(codes int32, params float64) in the core's prefix layout."""
    codes, params = [], []

    def visit(node):
        if node[0] == "leaf":
            codes.extend([node[1], node[2].size])
            params.append(node[2])
        else:
            codes.extend([node[0], len(node[1])])
            for child in node[1]:
                visit(child)

    visit(tree)
    return np.asarray(codes, dtype=np.int32), np.concatenate(params)


def ref_leaf(code, p, X, X2, same):
    if code in STATIONARY:
        s2, lengthscale = p[0], p[1:]
        r2 = cdist(X / lengthscale, X2 / lengthscale, "sqeuclidean")
        r = np.sqrt(r2)
        f = {
            RBF: lambda: np.exp(-r2 / 2),
            M12: lambda: np.exp(-r),
            M32: lambda: (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r),
            M52: lambda: (1 + np.sqrt(5) * r + 5 * r2 / 3) * np.exp(-np.sqrt(5) * r),
        }[code]()
        return s2 * f
    if code == LINEAR:
        return (X * p) @ X2.T
    if code == CONSTANT:
        return np.full((X.shape[0], X2.shape[0]), p[0])
    assert code == WHITE
    return p[0] * np.eye(X.shape[0]) if same else np.zeros((X.shape[0], X2.shape[0]))


def ref_K(tree, X, X2=None):
    same = X2 is None
    X2 = X if same else X2
    if tree[0] == "leaf":
        return ref_leaf(tree[1], tree[2], X, X2, same)
    parts = [ref_K(child, X, None if same else X2) for child in tree[1]]
    return np.sum(parts, axis=0) if tree[0] == SUM else np.prod(parts, axis=0)


def with_params(tree, flat):
    """The tree with its parameters replaced by `flat` (prefix order)."""
    it = iter(flat)

    def visit(node):
        if node[0] == "leaf":
            return ("leaf", node[1], np.array([next(it) for _ in node[2]]))
        return (node[0], [visit(c) for c in node[1]])

    return visit(tree)


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(9, 3)), rng.normal(size=(7, 3)), rng.normal(size=(9, 7))


LEAVES = {
    "rbf": leaf(RBF, 1.3, 0.7),
    "rbf_ard": leaf(RBF, 0.8, 0.5, 1.5, 2.5),
    "matern12": leaf(M12, 1.1, 0.9),
    "matern12_ard": leaf(M12, 1.1, 0.9, 0.4, 1.7),
    "matern32": leaf(M32, 0.6, 1.2),
    "matern32_ard": leaf(M32, 0.6, 1.2, 0.3, 0.8),
    "matern52": leaf(M52, 2.0, 0.8),
    "matern52_ard": leaf(M52, 2.0, 0.8, 1.9, 0.6),
    "linear": leaf(LINEAR, 0.7),
    "linear_ard": leaf(LINEAR, 0.7, 1.4, 0.2),
    "constant": leaf(CONSTANT, 0.9),
    "white": leaf(WHITE, 0.3),
}
TREES = {
    **LEAVES,
    "rbf*linear+white": (SUM, [(PRODUCT, [LEAVES["rbf"], LEAVES["linear"]]), LEAVES["white"]]),
    "matern52_ard+constant": (SUM, [LEAVES["matern52_ard"], LEAVES["constant"]]),
    "nested": (
        PRODUCT,
        [
            (SUM, [LEAVES["matern12_ard"], (PRODUCT, [LEAVES["linear_ard"], LEAVES["matern32"]])]),
            LEAVES["rbf_ard"],
            (SUM, [LEAVES["constant"], LEAVES["white"], LEAVES["matern52"]]),
        ],
    ),
}


@pytest.mark.parametrize("name", TREES)
def test_K_and_Kdiag_match_numpy(name, data):
    X, X2, _ = data
    codes, params = describe(TREES[name])
    np.testing.assert_allclose(
        _core.kernels.K(codes, params, X, X2), ref_K(TREES[name], X, X2), rtol=1e-12, atol=1e-12
    )
    K = _core.kernels.K(codes, params, X, None)
    np.testing.assert_allclose(K, ref_K(TREES[name], X), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(K, K.T)
    np.testing.assert_allclose(_core.kernels.Kdiag(codes, params, X), np.diag(K), rtol=1e-14)


@pytest.mark.parametrize("name", TREES)
def test_one_point_against_many_matches_numpy(name, restore_threads):
    # K(X, z) and K(z, X) for one point z (a kernel column, as the IVM's inclusions ask) take
    # the stationary leaves' direct path: distances summed in one pass over X. Against numpy, far
    # from the origin too (where the expansion would cancel), equal for 1 and 2 threads, and
    # equal to the many-point path to rounding.
    rng = np.random.default_rng(3)
    codes, params = describe(TREES[name])
    for offset in (0.0, 1e4):
        X = rng.normal(size=(3000, 3)) + offset
        z = rng.normal(size=(1, 3)) + offset
        ref = ref_K(TREES[name], X, z)
        got = []
        for threads in (1, 2):
            _core.threads.set_num_threads(threads)
            got.append((_core.kernels.K(codes, params, X, z), _core.kernels.K(codes, params, z, X)))
        np.testing.assert_array_equal(got[0][0], got[1][0])
        np.testing.assert_array_equal(got[0][0], got[0][1].T)
        tol = 1e-12 if offset == 0 else 1e-9  # (the Linear leaf's products grow with the offset)
        np.testing.assert_allclose(got[0][0], ref, rtol=tol, atol=tol * np.abs(ref).max())
        if offset == 0:
            two = np.vstack([z, z + 0.5])  # (two points: the expansion's GEMM path)
            np.testing.assert_allclose(got[0][0][:, 0], _core.kernels.K(codes, params, X, two)[:, 0],
                                       rtol=1e-12, atol=1e-13)


def has_isotropic_stationary(tree):
    if tree[0] == "leaf":
        return tree[1] in STATIONARY and tree[2].size == 2
    return any(has_isotropic_stationary(c) for c in tree[1])


@pytest.mark.parametrize("name", TREES)
def test_shared_squared_distances_match_each_leafs_own(name, restore_threads):
    # kernels::SquaredDistances: the distances of X and X2 computed once for several kernels
    # (an IVM's class kernels, a kernel's value and its vjp). Isotropic stationary leaves read
    # r^2 / l^2 from them; every other leaf (ARD, Linear, ...) computes as without them, and so
    # do all leaves when input gradients are asked for or the inputs lie so far from their mean
    # (in lengthscales) that the expansion would lose digits. K and the parameters' gradient
    # against numpy and against the leaves' own path, for the matrix case (GEMM expansion) and
    # one point in both orientations (summed directly); equal for 1 and 2 threads.
    tree = TREES[name]
    codes, params = describe(tree)
    rng = np.random.default_rng(11)
    reads = has_isotropic_stationary(tree)
    for scale in (1.0, 1e4):
        X = rng.normal(size=(40, 3)) * scale
        for X2 in (rng.normal(size=(30, 3)) * scale, X[:1] + 0.25, None):
            A, B = (X, X2) if X2 is not None else (X[:1] - 0.5, X)
            one_point = min(A.shape[0], B.shape[0]) == 1
            G = rng.normal(size=(A.shape[0], B.shape[0]))
            own = _core.kernels.K(codes, params, A, B)
            own_grad = _core.kernels.K_vjp(codes, params, A, B, G)[0]
            got = []
            for threads in (1, 2):
                _core.threads.set_num_threads(threads)
                got.append((_core.kernels.K(codes, params, A, B, distances=True),
                            _core.kernels.K_vjp(codes, params, A, B, G, distances=True)[0]))
            np.testing.assert_array_equal(got[0][0], got[1][0])
            np.testing.assert_array_equal(got[0][1], got[1][1])
            K, grad = got[0]
            if not reads or not (one_point or scale == 1.0):
                # (spread over 1e4 lengthscales: the expansion would lose digits, the leaves sum
                # their distances directly instead; one point is always summed directly)
                np.testing.assert_array_equal(K, own)
                np.testing.assert_array_equal(grad, own_grad)
                continue
            ref = ref_K(tree, A, B)
            np.testing.assert_allclose(K, ref, rtol=1e-11, atol=1e-13 * np.abs(ref).max())
            np.testing.assert_allclose(K, own, rtol=1e-11, atol=1e-13 * np.abs(own).max())
            np.testing.assert_allclose(grad, own_grad, rtol=1e-10, atol=1e-11 * np.abs(own_grad).max())
            # with input gradients the leaves take their own vjp path (a product's siblings'
            # values may still come from the distances)
            with_dX = _core.kernels.K_vjp(codes, params, A, B, G, True, True, distances=True)
            without = _core.kernels.K_vjp(codes, params, A, B, G, True, True)
            for a, b in zip(with_dX, without):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-11 * np.abs(b).max())


def test_shared_squared_distances_refuse_K_of_X_with_itself():
    codes, params = describe(TREES["rbf"])
    X = np.random.default_rng(0).normal(size=(5, 3))
    with pytest.raises(ValueError, match="two different inputs"):
        _core.kernels.K(codes, params, X, None, distances=True)


def central_difference(f, x, eps=1e-6):
    x = np.array(x, dtype=np.float64)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[idx] = eps
        grad[idx] = (f(x + step) - f(x - step)) / (2 * eps)
    return grad


@pytest.mark.parametrize("name", TREES)
@pytest.mark.parametrize("same", [False, True])
def test_vjp_matches_finite_differences_of_numpy(name, same, data):
    X, X2, G = data
    tree = TREES[name]
    codes, params = describe(tree)
    if same:
        X2, G = None, np.random.default_rng(5).normal(size=(9, 9))
    dparams, dX, dX2 = _core.kernels.K_vjp(codes, params, X, X2, G, True, True)

    np.testing.assert_allclose(
        dparams,
        central_difference(lambda p: np.sum(G * ref_K(with_params(tree, p), X, X2)), params),
        rtol=1e-6,
        atol=1e-7,
    )
    if same:  # the gradient through both arguments of K(X, X)
        fd = central_difference(lambda Z: np.sum(G * ref_K(tree, Z)), X)
        np.testing.assert_allclose(dX + dX2, fd, rtol=1e-6, atol=1e-7)
    else:
        fd = central_difference(lambda Z: np.sum(G * ref_K(tree, Z, X2)), X)
        np.testing.assert_allclose(dX, fd, rtol=1e-6, atol=1e-7)
        fd2 = central_difference(lambda Z: np.sum(G * ref_K(tree, X, Z)), X2)
        np.testing.assert_allclose(dX2, fd2, rtol=1e-6, atol=1e-7)

    g = np.ascontiguousarray(G[:, 0])
    np.testing.assert_allclose(
        _core.kernels.Kdiag_vjp(codes, params, X, g),
        central_difference(lambda p: g @ np.diag(ref_K(with_params(tree, p), X)), params),
        rtol=1e-6,
        atol=1e-7,
    )


@pytest.mark.parametrize("name", TREES)
@pytest.mark.parametrize("same", [False, True])
def test_vjp_from_forward_values_matches(name, same, data):
    """Given K(X, X2) from a forward pass, a single RBF takes its gradients from the values
    (no distances or exps); every kernel must give the same vjp as without them."""
    X, X2, G = data
    codes, params = describe(TREES[name])
    if same:
        X2, G = None, np.random.default_rng(5).normal(size=(9, 9))
    values = _core.kernels.K(codes, params, X, X2)
    plain = _core.kernels.K_vjp(codes, params, X, X2, G, True, True)
    reused = _core.kernels.K_vjp(codes, params, X, X2, G, True, True, values=values)
    for a, b in zip(reused, plain):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)


def test_vjp_skips_unrequested_input_gradients(data):
    X, X2, G = data
    codes, params = describe(LEAVES["rbf_ard"])
    dparams, dX, dX2 = _core.kernels.K_vjp(codes, params, X, X2, G, False, False)
    assert dparams.shape == (4,) and dX is None and dX2 is None


def test_inputs_far_from_origin_keep_accuracy():
    # Inputs far from 0 relative to the lengthscales: r^2 and the GEMM-shaped gradients,
    # built from squared norms, would cancel badly without the core's centring.
    rng = np.random.default_rng(1)
    X, X2 = 1e4 + rng.normal(size=(30, 2)), 1e4 + rng.normal(size=(20, 2))
    G = rng.normal(size=(30, 20))
    tree = leaf(RBF, 1.5, 0.6, 1.3)
    codes, params = describe(tree)
    K = ref_K(tree, X, X2)
    np.testing.assert_allclose(_core.kernels.K(codes, params, X, X2), K, rtol=1e-9, atol=1e-12)

    lengthscale = params[1:]
    diff = X[:, None, :] - X2[None, :, :]  # [N, M, D]
    GK = (G * K)[:, :, None]
    expected_dl = np.sum(GK * diff**2, axis=(0, 1)) / lengthscale**3
    expected_dX = -np.sum(GK * diff, axis=1) / lengthscale**2
    expected_dX2 = np.sum(GK * diff, axis=0) / lengthscale**2
    dparams, dX, dX2 = _core.kernels.K_vjp(codes, params, X, X2, G, True, True)
    np.testing.assert_allclose(dparams[1:], expected_dl, rtol=1e-9)
    np.testing.assert_allclose(dX, expected_dX, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dX2, expected_dX2, rtol=1e-9, atol=1e-12)


def ref_slope(code, r2):
    """df/d(r^2) of each stationary profile f(r^2)."""
    r = np.sqrt(r2)
    with np.errstate(divide="ignore", invalid="ignore"):
        return {
            RBF: lambda: -0.5 * np.exp(-r2 / 2),
            M12: lambda: np.where(r > 0, -0.5 * np.exp(-r) / r, 0.0),
            M32: lambda: -1.5 * np.exp(-np.sqrt(3) * r),
            M52: lambda: -(5 / 6) * (1 + np.sqrt(5) * r) * np.exp(-np.sqrt(5) * r),
        }[code]()


@pytest.mark.parametrize("code", STATIONARY)
@pytest.mark.parametrize("same", [False, True])
@pytest.mark.parametrize("with_values", [False, True])
def test_inputs_spread_over_a_million_lengthscales_keep_accuracy(code, same, with_values):
    # Close pairs of points spread over +-1e6 lengthscales (raw time stamps with a short
    # lengthscale, say): |a|^2 + |b|^2 - 2 a.b cancelled to errors of 1e-4 in K and 3e-5 in the
    # gradients; the core now sums (a_d - b_d)^2 directly beyond norms of 1e6. Reference:
    # direct differences (exact here: each pair lies within a factor 2 of each other).
    rng = np.random.default_rng(3)
    base = rng.uniform(-1e6, 1e6, size=(30, 2))
    X = base + 0.5 * rng.normal(size=base.shape)
    X2 = None if same else base[:20] + rng.normal(size=(20, 2))
    Xr = X if same else X2
    s2, lengthscale = 1.7, np.array([0.7, 1.3])
    tree = leaf(code, s2, *lengthscale)
    codes, params = describe(tree)
    G = rng.normal(size=(X.shape[0], Xr.shape[0]))
    K = ref_K(tree, X, X2)
    np.testing.assert_allclose(_core.kernels.K(codes, params, X, X2), K, rtol=1e-8, atol=1e-10)

    diff = (X[:, None, :] - Xr[None, :, :]) / lengthscale  # [N, M, D], scaled
    W = G * s2 * ref_slope(code, (diff**2).sum(-1))
    expected = np.concatenate([[np.sum(G * K) / s2],
                               -2 * np.einsum("ij,ijd->d", W, diff**2) / lengthscale])
    expected_dX = 2 * np.einsum("ij,ijd->id", W, diff) / lengthscale
    expected_dX2 = -2 * np.einsum("ij,ijd->jd", W, diff) / lengthscale
    values = _core.kernels.K(codes, params, X, X2) if with_values else None
    dparams, dX, dX2 = _core.kernels.K_vjp(codes, params, X, X2, G, True, not same, values)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(dparams, expected, rtol=1e-8, atol=1e-10 * scale)
    if same:  # one input: both roles' gradients land in dX
        expected_dX = expected_dX + expected_dX2
    np.testing.assert_allclose(dX, expected_dX, rtol=1e-8, atol=1e-10 * np.abs(expected_dX).max())
    if not same:
        np.testing.assert_allclose(dX2, expected_dX2, rtol=1e-8,
                                   atol=1e-10 * np.abs(expected_dX2).max())


# ---- bad input becomes ValueError, never a crash ----

GOOD_CODES, GOOD_PARAMS = describe(LEAVES["rbf_ard"])


@pytest.mark.parametrize(
    "codes, params, message",
    [
        (GOOD_CODES.astype(np.int64), GOOD_PARAMS, "int32"),
        (np.repeat(GOOD_CODES, 2)[::2], GOOD_PARAMS, "C-contiguous"),
        (GOOD_CODES.reshape(1, 2), GOOD_PARAMS, "1-D"),
        (GOOD_CODES, GOOD_PARAMS.astype(np.float32), "float64"),
        (GOOD_CODES, np.repeat(GOOD_PARAMS, 2)[::2], "C-contiguous"),
        (GOOD_CODES, GOOD_PARAMS[:3], "params"),
        (np.array([RBF, 3], np.int32), GOOD_PARAMS[:3], "2 or 4"),
        (GOOD_CODES, np.append(GOOD_PARAMS, 1.0), "uses 4"),
        (GOOD_CODES, np.array([1.0, 1.0, -1.0, 1.0]), "finite and > 0"),
        (GOOD_CODES, np.array([1.0, np.nan, 1.0, 1.0]), "finite and > 0"),
        (GOOD_CODES, np.array([1.0, 1.0, 0.0, 1.0]), "finite and > 0"),
        (np.array([42, 1], np.int32), np.ones(1), "unknown kernel type"),
        (np.array([-1, 1], np.int32), np.ones(1), "unknown kernel type"),
        (np.array([], np.int32), np.ones(1), "cut off"),
        (np.array([SUM, 2, RBF, 4, WHITE], np.int32), GOOD_PARAMS, "cut off"),
        (np.array([SUM, 2, RBF, 4, WHITE, 1], np.int32), GOOD_PARAMS, "needs params"),
        (np.array([SUM, 0], np.int32), np.ones(0), "at least one child"),
        (np.array([SUM, 2, WHITE, 1], np.int32), np.ones(1), "cut off"),
        (np.array([WHITE, 1, WHITE, 1], np.int32), np.ones(2), "left after"),
        (np.array([LINEAR, 2], np.int32), np.ones(2), "Linear"),
        (np.array([CONSTANT, 2], np.int32), np.ones(2), "Constant"),
        (np.array([SUM, 1] * 5000 + [WHITE, 1], np.int32), np.ones(1), "nesting"),
    ],
)
def test_bad_description_raises_value_error(codes, params, message):
    X = np.ones((4, 3))
    for call in (
        lambda: _core.kernels.K(codes, params, X, None),
        lambda: _core.kernels.Kdiag(codes, params, X),
        lambda: _core.kernels.K_vjp(codes, params, X, None, np.ones((4, 4)), True, True),
        lambda: _core.kernels.Kdiag_vjp(codes, params, X, np.ones(4)),
    ):
        with pytest.raises(ValueError, match=message):
            call()


def test_bad_arrays_raise_value_error():
    X = np.ones((4, 3))
    codes, params = GOOD_CODES, GOOD_PARAMS
    cases = [
        (lambda: _core.kernels.K(codes, params, X.astype(np.float32), None), "float64"),
        (lambda: _core.kernels.K(codes, params, np.asfortranarray(X), None), "C-contig"),
        (lambda: _core.kernels.K(codes, params, np.ones(3), None), "2-D"),
        (lambda: _core.kernels.K(codes, params, X, np.ones((2, 2))), "X2 has 2 columns"),
        (lambda: _core.kernels.K(codes, params, np.ones((4, 2)), None), "2 or 3"),
        (lambda: _core.kernels.K_vjp(codes, params, X, None, np.ones((4, 3)), False, False), "G"),
        (lambda: _core.kernels.K_vjp(codes, params, X, X, np.ones(4), False, False), "2-D"),
        (lambda: _core.kernels.Kdiag_vjp(codes, params, X, np.ones(3)), "length 4"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


def test_empty_inputs_give_empty_results():
    codes, params = GOOD_CODES, GOOD_PARAMS
    X = np.ones((0, 3))
    assert _core.kernels.K(codes, params, X, np.ones((2, 3))).shape == (0, 2)
    assert _core.kernels.Kdiag(codes, params, X).shape == (0,)
    dparams, dX, _ = _core.kernels.K_vjp(codes, params, X, None, np.ones((0, 0)), True, False)
    np.testing.assert_array_equal(dparams, 0.0)
    assert dX.shape == (0, 3)
