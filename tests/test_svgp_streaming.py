"""SVGP estimators on streamed data: the minibatch source, np.memmap input (same result as the
array, bounded memory), partial_fit, early stopping, progress reporting, pickling of a run in
progress, and clear errors for bad input."""

import pickle
import tracemalloc

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_moons
from sklearn.exceptions import ConvergenceWarning

from pygpfast._base import _streaming
from pygpfast.kernels import RBF
from pygpfast.svgp import SVGPClassifier, SVGPRegressor


def moons(n, seed):
    return make_moons(n, noise=0.2, random_state=seed)


# ---------------------------------------------------------------- the minibatch source
def test_minibatches_visit_every_row_once_per_pass(monkeypatch):
    monkeypatch.setattr(_streaming, "CHUNK_ROWS", 10)
    monkeypatch.setattr(_streaming, "BUFFER_BYTES", 8 * 3 * 40)  # 40 rows of 2 features + target
    N, B = 200, 8
    X = np.column_stack([np.arange(N), -np.arange(N)]).astype(np.float32)  # converted per buffer
    t = np.arange(N, dtype=float)
    gen = _streaming.minibatches(X, t, B, np.random.RandomState(0))
    first = [next(gen) for _ in range(N // B)]
    for Xb, tb in first:
        assert Xb.dtype == np.float64 and Xb.flags.c_contiguous and Xb.shape == (B, 2)
        np.testing.assert_array_equal(Xb[:, 0], tb)
    rows = np.concatenate([tb for _, tb in first])
    # Buffers of 4 chunks: rows left over at a buffer's end move to the next buffer, so one
    # pass is N rows with at most B - 1 of them carried across the pass boundary.
    assert len(np.unique(rows)) >= N - B
    # Over two passes every row comes at least once and none more than twice.
    second = np.concatenate([next(gen)[1] for _ in range(N // B)])
    counts = np.bincount(np.concatenate([rows, second]).astype(int), minlength=N)
    assert counts.min() >= 1 and counts.max() <= 2
    # Rows of one minibatch come from several chunks, in random order.
    assert len(np.unique(first[0][1] // 10)) > 1
    again = _streaming.minibatches(X, t, B, np.random.RandomState(0))
    np.testing.assert_array_equal(next(again)[1], first[0][1])


def test_check_rows_scans_blocks_without_converting(monkeypatch, tmp_path):
    monkeypatch.setattr(_streaming, "BUFFER_BYTES", 8 * 5 * 7)  # blocks of 7 rows
    X = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=(50, 4))
    X[:] = 1.0
    assert _streaming.check_rows(X) is X
    X[33, 2] = np.inf
    with pytest.raises(ValueError, match="row 33"):
        _streaming.check_rows(X)
    with pytest.raises(ValueError, match="2D"):
        _streaming.check_rows(np.ones(5))
    with pytest.raises(ValueError, match="0 sample"):
        _streaming.check_rows(np.ones((0, 3)))


# ---------------------------------------------------------------- memmap input
def test_memmap_gives_the_same_fit_as_the_array(tmp_path):
    X, y = moons(1500, 0)
    path = tmp_path / "X.npy"
    np.save(path, X)
    Xm = np.load(path, mmap_mode="r")
    kw = dict(n_inducing=10, optimizer="natgrad", batch_size=100, max_iter=3, random_state=4)
    with pytest.warns(ConvergenceWarning):
        a = SVGPClassifier(**kw).fit(X, y)
    with pytest.warns(ConvergenceWarning):
        b = SVGPClassifier(**kw).fit(Xm, y)
    np.testing.assert_array_equal(a.inducing_points_, b.inducing_points_)
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(Xm))
    np.testing.assert_array_equal(a.history_, b.history_)


def test_fit_from_memmap_uses_bounded_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(_streaming, "BUFFER_BYTES", 1 << 18)
    N, D = 100_000, 20
    rng = np.random.default_rng(0)
    X = np.lib.format.open_memmap(tmp_path / "X.npy", mode="w+", dtype=np.float32, shape=(N, D))
    X[:] = rng.standard_normal((N, D))
    X.flush()
    y = (X[:, 0] + X[:, 1] > 0).astype(np.int8)
    Xm = np.load(tmp_path / "X.npy", mmap_mode="r")
    clf = SVGPClassifier(n_inducing=10, optimizer="natgrad", max_iter=1, random_state=0)
    tracemalloc.start()
    with pytest.warns(ConvergenceWarning):
        clf.fit(Xm, y)
    p = clf.predict_proba(Xm[:1000])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    data_float64 = N * D * 8
    # Targets (N floats) and one buffer, not a float64 copy of X.
    assert peak < 0.4 * data_float64, peak
    assert clf.score(Xm[:2000], y[:2000]) > 0.8 and p.shape == (1000, 2)


# ---------------------------------------------------------------- partial_fit
def test_partial_fit_over_chunks():
    X, y = moons(3000, 1)
    labels = np.array(["a", "b"])[y]
    clf = SVGPClassifier(n_inducing=12, batch_size=50, random_state=0)
    with pytest.raises(ValueError, match="classes must be passed"):
        clf.partial_fit(X[:100], labels[:100])
    for epoch in range(3):
        for start in range(0, 3000, 500):
            clf.partial_fit(X[start : start + 500], labels[start : start + 500], classes=["a", "b"],
                            n_total=3000)
    assert clf.optimizer_ == "natgrad" and clf.n_iter_ == 18 and clf.n_steps_ == 18 * 10
    assert clf.n_rows_seen_ == 9000 and clf.n_total_ == 3000 and len(clf.history_) == 18
    Xt, yt = moons(500, 2)
    assert clf.score(Xt, np.array(["a", "b"])[yt]) > 0.93
    with pytest.raises(ValueError, match="features"):
        clf.partial_fit(np.ones((5, 3)), labels[:5])
    with pytest.raises(ValueError, match="not in classes_"):
        clf.partial_fit(X[:3], np.array(["a", "b", "c"]))
    with pytest.raises(ValueError, match="differs"):
        clf.partial_fit(X[:3], labels[:3], classes=["a", "c"])


def _titsias_optimum(kernel, Z, X, y, noise, jitter):
    """The optimal q(u) = N(m, S) for a Gaussian likelihood with Z and the hyperparameters
    fixed (Titsias 2009; Hensman, Fusi & Lawrence 2013, eq. 7), densely: with
    P = Kzz + Kzx Kxz / noise, m = Kzz P^-1 Kzx y / noise and S = Kzz P^-1 Kzz; Kzz with the
    model's jitter (relative to its mean diagonal). Returns (Kzz, m, S)."""
    Kzz = kernel(Z)
    Kzz.flat[:: len(Z) + 1] += jitter * np.mean(np.diag(Kzz))
    Kzx = kernel(Z, X)
    P = Kzz + Kzx @ Kzx.T / noise
    S = Kzz @ np.linalg.solve(P, Kzz)
    return Kzz, Kzz @ np.linalg.solve(P, Kzx @ y) / noise, 0.5 * (S + S.T)


@pytest.mark.parametrize("whiten", [True, False])
def test_one_pass_of_partial_fit_reaches_the_exact_optimum_of_a_gaussian_problem(whiten):
    # (partial_fit was checked by its score only.) With Z and the hyperparameters fixed, the
    # natural-gradient steps at rho_t = 1 / (t + 1) average the minibatches' targets: one pass
    # over the data in minibatches weighted against n_total is the closed-form optimum, here
    # three chunks of 200 rows in minibatches of 100 (six steps). Measured 2e-13 (q's mean),
    # 2e-12 (its covariance) and 1e-12 (the predictions) of the largest entry.
    rng = np.random.default_rng(0)
    N, M, noise = 600, 12, 0.02
    X = rng.uniform(-3.0, 3.0, (N, 1))
    y = np.sin(2.0 * X[:, 0]) + 0.1 * rng.standard_normal(N)
    Z = np.linspace(-3.0, 3.0, M)[:, None]
    kernel = RBF(variance=1.3, lengthscale=0.7)
    reg = SVGPRegressor(kernel=kernel, noise_variance=noise, normalize_y=False, inducing_points=Z,
                        whiten=whiten, train_inducing=False, optimize_hyperparameters=False,
                        batch_size=100, random_state=0)
    for chunk in np.array_split(np.arange(N), 3):
        reg.partial_fit(X[chunk], y[chunk], n_total=N)
    assert reg.n_steps_ == 6 and reg.likelihood_.params[0] == noise
    np.testing.assert_array_equal(reg.model_.Z, Z)
    Kzz, m, S = _titsias_optimum(kernel, Z, X, y, noise, reg.model_.jitter)
    q_mu, q_sqrt = reg.model_.q_mu.reshape(M), reg.model_.q_sqrt.reshape(M, M)
    q_S = q_sqrt @ q_sqrt.T
    if whiten:  # (u = Lz v)
        Lz = np.linalg.cholesky(Kzz)
        q_mu, q_S = Lz @ q_mu, Lz @ q_S @ Lz.T
    np.testing.assert_allclose(q_mu, m, rtol=0, atol=1e-10 * np.abs(m).max())
    np.testing.assert_allclose(q_S, S, rtol=0, atol=1e-10 * np.abs(S).max())
    # The predictive marginals of q(f) at new inputs, inside the data and beyond it.
    Xs = np.linspace(-3.5, 3.5, 30)[:, None]
    Kzs = kernel(Z, Xs)
    A = np.linalg.solve(Kzz, Kzs)
    var = kernel.diag(Xs) - np.sum(Kzs * A, axis=0) + np.sum(A * (S @ A), axis=0)
    mean_fit, var_fit = reg.predict_latent(Xs)
    np.testing.assert_allclose(mean_fit, A.T @ m, rtol=0, atol=1e-10)
    np.testing.assert_allclose(var_fit, var, rtol=0, atol=1e-10 * var.max())


def test_partial_fit_default_n_total_is_rows_seen_and_continues_a_fit():
    X, y = moons(400, 3)
    reg = SVGPRegressor(n_inducing=6, batch_size=40, random_state=0)
    reg.partial_fit(X[:200], y[:200])
    assert reg.n_total_ == 200
    reg.partial_fit(X[200:], y[200:])
    assert reg.n_total_ == 400 and reg.n_steps_ == 10
    fitted = SVGPRegressor(n_inducing=6, random_state=0).fit(X, y)
    assert fitted.optimizer_ == "lbfgs"
    fitted.partial_fit(X[:80], y[:80])
    assert fitted.optimizer_ == "natgrad" and fitted.n_rows_seen_ == 480
    with pytest.raises(ValueError, match="full-batch"):
        SVGPRegressor(optimizer="lbfgs").partial_fit(X, y)


def test_pickled_run_continues_identically():
    X, y = moons(600, 4)
    clf = SVGPClassifier(n_inducing=8, batch_size=60, random_state=0)
    clf.partial_fit(X[:300], y[:300], classes=[0, 1])
    twin = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(twin.predict_proba(X), clf.predict_proba(X))
    clf.partial_fit(X[300:], y[300:])
    twin.partial_fit(X[300:], y[300:])
    np.testing.assert_array_equal(twin.predict_proba(X), clf.predict_proba(X))
    np.testing.assert_array_equal(twin.history_, clf.history_)


# ---------------------------------------------------------------- stopping and reporting
def test_early_stopping_and_max_iter_warning():
    X, y = moons(800, 5)
    kw = dict(n_inducing=8, optimizer="natgrad", batch_size=100, random_state=0)
    clf = SVGPClassifier(tol=10.0, n_iter_no_change=3, **kw).fit(X, y)  # no epoch improves by 10
    assert clf.n_iter_ == 4 and len(clf.history_) == 4
    with pytest.warns(ConvergenceWarning, match="max_iter=2 epochs"):
        SVGPClassifier(tol=0.0, max_iter=2, **kw).fit(X, y)
    with pytest.warns(ConvergenceWarning, match="max_iter=3 iterations"):
        SVGPClassifier(tol=0.0, max_iter=3, n_inducing=8, random_state=0).fit(X, y)


@pytest.mark.parametrize("optimizer", ["lbfgs", "natgrad"])
def test_verbose_and_callback(capsys, optimizer):
    X, y = moons(500, 6)
    calls = []

    def callback(est, it, elbo):
        calls.append((it, elbo, est.predict_proba(X[:5])))  # the current model predicts
        return it == 3

    clf = SVGPClassifier(n_inducing=8, optimizer=optimizer, batch_size=50, verbose=1, callback=callback,
                         random_state=0).fit(X, y)
    assert [c[0] for c in calls] == [1, 2, 3] and clf.n_iter_ == 3
    np.testing.assert_array_equal(clf.history_, [c[1] for c in calls])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and all("ELBO" in line and "rows/s" in line for line in lines)
    if optimizer == "natgrad":
        assert clf.objective_ == clf.history_[-1]


# ---------------------------------------------------------------- estimator behaviour
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")  # slow creep at small noise
def test_regressor_normalizes_targets_and_supports_poisson(rng):
    X = rng.uniform(-2, 2, (300, 1))
    y = 1000.0 + 50.0 * np.sin(2 * X[:, 0]) + rng.standard_normal(300)
    reg = SVGPRegressor(n_inducing=12, max_iter=300, random_state=0).fit(X, y)
    np.testing.assert_allclose([reg.y_mean_, reg.y_scale_], [y.mean(), y.std()])
    Xs = np.linspace(-1.5, 1.5, 20)[:, None]
    mean, std = reg.predict(Xs, return_std=True)
    assert np.abs(mean - (1000 + 50 * np.sin(2 * Xs[:, 0]))).max() < 2.5
    np.testing.assert_allclose(reg.predict_latent(Xs)[0], mean, rtol=1e-12)
    assert np.all((std > 0.5) & (std < 3))
    counts = rng.poisson(np.exp(np.sin(2 * X[:, 0])))
    pois = SVGPRegressor(likelihood="poisson", n_inducing=12, random_state=0).fit(X, counts)
    assert pois.y_scale_ == 1.0
    rate = pois.predict(Xs)
    assert np.abs(np.log(rate) - np.sin(2 * Xs[:, 0])).max() < 0.4


@pytest.mark.parametrize(
    "make, X, y, match",
    [
        (SVGPClassifier, np.array([[0.0, np.inf], [1.0, 2.0]]), [0, 1], "infinity"),
        (SVGPClassifier, np.ones((3, 2)), [0, 1, 1, 0], "inconsistent"),
        (SVGPClassifier, np.ones((3, 2)), [1, 1, 1], "only one class"),
        (SVGPClassifier, np.ones((3, 2)), [0.5, 1.5, 2.5], "Unknown label type"),
        (SVGPClassifier, np.ones((2, 2)), [0.0, np.nan], "NaN"),
        (SVGPRegressor, np.ones(4), [1.0, 2.0, 3.0, 4.0], "2D"),
        (SVGPRegressor, np.ones((0, 2)), [], "0 sample"),
        (SVGPRegressor, np.ones((4, 2)), [1.0, 2.0, np.inf, 4.0], "infinity"),
        (lambda: SVGPClassifier(natgrad_step=1.5), np.ones((4, 2)), [0, 1, 0, 1], "natgrad_step"),
        (lambda: SVGPClassifier(learning_rate=-1), np.ones((4, 2)), [0, 1, 0, 1], "learning_rate"),
        (lambda: SVGPClassifier(n_iter_no_change=0), np.ones((4, 2)), [0, 1, 0, 1], "n_iter_no_change"),
        (lambda: SVGPClassifier(likelihood="cauchit"), np.ones((4, 2)), [0, 1, 0, 1], "likelihood"),
        (lambda: SVGPClassifier(likelihood="poisson"), np.ones((4, 2)), [0, 1, 0, 1], "likelihood"),
        (lambda: SVGPRegressor(callback=3), np.ones((4, 2)), [0, 1, 0, 1], "callback"),
        (lambda: SVGPRegressor(inducing_points=np.ones((3, 5))), np.ones((4, 2)), [0, 1, 0, 1], "features"),
    ],
)
def test_bad_input_gives_clear_errors(make, X, y, match):
    with pytest.raises(ValueError, match=match):
        make().fit(X, np.asarray(y))


def test_partial_fit_classes_that_miss_a_label_of_y():
    # classes=[0] for y in {0, 1} was "the data contain only one class: 0", blaming y for what
    # classes left out; the labels outside classes are now named first.
    X = np.random.RandomState(0).randn(20, 2)
    y = (X[:, 0] > 0).astype(int)
    with pytest.raises(ValueError, match=r"y contains labels not in classes_ array\(\[0\]\): array\(\[1\]\)"):
        SVGPClassifier().partial_fit(X, y, classes=[0])
    with pytest.raises(ValueError, match="classes holds only one class"):
        SVGPClassifier().partial_fit(X[y == 0], y[y == 0], classes=[0])


@pytest.mark.parametrize("likelihood", ["gaussian", "poisson"])
def test_partial_fit_warns_about_a_constant_first_chunk(likelihood):
    # The first chunk sets y_mean_ / y_scale_ (and a Poisson prior mean's start): a constant one
    # left the model far from later chunks without a word (R^2 -55; Poisson rates 20% off).
    X = np.random.RandomState(0).randn(50, 2)
    with pytest.warns(UserWarning, match="every target of this one is 0"):
        SVGPRegressor(likelihood=likelihood, n_inducing=5, random_state=0).partial_fit(X, np.zeros(50))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        SVGPRegressor(likelihood=likelihood, n_inducing=5, random_state=0).partial_fit(X, np.arange(50.0))


def test_partial_fit_says_which_changed_parameters_it_ignores():
    # set_params between partial_fit calls: parameters that only the start of the model or of
    # the optimiser reads (n_inducing, kernel, learning_rate, ...) were ignored silently.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 2))
    y = (X[:, 0] > 0).astype(int)
    model = SVGPClassifier(n_inducing=10, random_state=0)
    model.partial_fit(X[:100], y[:100], classes=[0, 1])
    model.set_params(n_inducing=20, learning_rate=0.1, batch_size=50)
    with pytest.warns(UserWarning, match="ignores the change to n_inducing, learning_rate \\("):
        model.partial_fit(X[100:200], y[100:200])
    assert model.inducing_points_.shape == (10, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.partial_fit(X[200:], y[200:])  # (said once per change)
        model.fit(X, y)
        model.set_params(learning_rate=0.05)
        model.partial_fit(X[:100], y[:100])  # (after a fit it starts a new optimiser)


def test_partial_fit_after_a_failed_fit_does_not_compare_with_it():
    # The failed fit's parameters are not a start that partial_fit continues.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100, 2))
    y = (X[:, 0] > 0).astype(int)
    model = SVGPClassifier(n_inducing=10, random_state=0, callback=lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        model.fit(X, y)
    model.set_params(callback=None, n_inducing=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.partial_fit(X, y, classes=[0, 1])
    assert model.inducing_points_.shape == (5, 2)


def test_partial_fit_snapshot_shares_the_arrays_steps_replace():
    # partial_fit's snapshot for a call that raises deep-copied q(u) and the natural
    # gradients' cache too (O(L M^2): 22.8 against 16.6 MiB at C = 10, M = 200), although the
    # steps replace those arrays rather than change them; restoring puts the same arrays back.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 2))
    y = rng.integers(0, 3, 300)
    model = SVGPClassifier(n_inducing=10, random_state=0)
    model.partial_fit(X[:150], y[:150], classes=[0, 1, 2])
    q_sqrt, prec = model.model_.q_sqrt, model._trainer.natgrad._prec

    def stop(*args):
        raise KeyboardInterrupt

    model.set_params(callback=stop)
    with pytest.raises(KeyboardInterrupt):
        model.partial_fit(X[150:], y[150:])
    assert model.model_.q_sqrt is q_sqrt and model._trainer.natgrad._prec is prec
