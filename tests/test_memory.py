"""Memory and scale: requests that cannot fit are refused before they allocate, with a message
that names the size, the memory available and what to do; bounded scratch in prediction.

No test here allocates much: the available memory is mocked small."""

import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

import pygpfast._base._start
import pygpfast
from pygpfast import (SVGPClassifier, SVGPRegressor, VGPClassifier, VGPPoissonRegressor,
                      _core, svgp)
from pygpfast._base import _memory
from pygpfast.kernels import RBF, Matern32


@pytest.fixture
def available(monkeypatch):
    """Set the memory the estimators see as available (bytes)."""
    def set_available(n):
        monkeypatch.setattr(_memory, "available_bytes", lambda: n)
    return set_available


def no_core_call(*args, **kwargs):
    raise AssertionError("the core was called although the request does not fit")


def binary(n, rng, d=2):
    X = rng.normal(size=(n, d))
    return X, (X[:, 0] > 0).astype(int)


@pytest.mark.skipif(not hasattr(os, "sysconf"), reason=(
    "Windows: no /proc/meminfo and no os.sysconf, so the memory available is unknown "
    "(available_bytes() is None, and the estimators do not check)"))
def test_available_bytes_is_a_real_figure():
    # (It accepted None everywhere; None is only for a platform without either source.)
    n = _memory.available_bytes()
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert isinstance(n, int) and 0 < n <= physical
    if sys.platform.startswith("linux"):  # (MemAvailable, not the physical memory)
        assert _memory._meminfo_available() is not None


_LIMITED = """
import os, resource
from pygpfast._base import _memory
size = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
resource.setrlimit(resource.RLIMIT_AS, (size + (512 << 20), resource.RLIM_INFINITY))
print(_memory.available_bytes())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="RLIMIT_AS headroom is read from /proc/self/statm (Linux)")
def test_available_bytes_is_the_headroom_under_an_address_space_limit(tmp_path):
    # ulimit -v 512 MiB above the process's size: that headroom, not the machine's memory.
    package_root = os.path.dirname(os.path.dirname(pygpfast.__file__))
    out = subprocess.run([sys.executable, "-c", _LIMITED], cwd=tmp_path, capture_output=True,
                         text=True, check=True, env=dict(os.environ, PYTHONPATH=package_root))
    n = int(out.stdout)
    assert (512 - 16) << 20 <= n <= 512 << 20  # (less what the process mapped in between)


@pytest.mark.parametrize("likelihood, C, matrices", [("logit", 2, 5), ("softmax", 3, 10),
                                                     ("ordinal", 4, 5)])
def test_vgp_fit_refused_before_allocating(available, monkeypatch, likelihood, C, matrices):
    # Before: an N x N request that could not fit ran until the core's allocation failed with
    # MemoryError('std::bad_alloc') (N = 20000 under an 8 GB limit: after 16 s), or the
    # process was killed.
    rng = np.random.default_rng(0)
    N = 300
    X = rng.normal(size=(N, 2))
    y = np.digitize(X[:, 0], np.linspace(-1, 1, C - 1))
    needed = 8 * matrices * N * N
    available(needed - 1)
    monkeypatch.setattr(_core.cvi, "fit_step", no_core_call)
    with pytest.raises(MemoryError) as e:
        VGPClassifier(likelihood=likelihood).fit(X, y)
    message = str(e.value)
    assert f"N = {N}" in message and f"{matrices} N x N" in message
    assert _memory.format_bytes(needed) in message
    assert "use SVGPClassifier" in message
    # the largest subsample that fits
    assert f"at most {int(np.sqrt((needed - 1) / (8.0 * matrices)))} rows" in message


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_vgp_fit_that_fits_is_not_refused(available):
    rng = np.random.default_rng(1)
    X, y = binary(60, rng)
    available(8 * 5 * 60 * 60)
    est = VGPClassifier(max_iter=2).fit(X, y)
    assert est.predict(X).shape == (60,)


def test_vgp_poisson_and_product_kernel_counts(available, monkeypatch):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(100, 2))
    y = rng.poisson(2.0, size=100)
    monkeypatch.setattr(_core.cvi, "fit_step", no_core_call)
    available(1000)
    with pytest.raises(MemoryError, match=r"SVGPRegressor\(likelihood='poisson'\)"):
        VGPPoissonRegressor().fit(X, y)
    # A product's gradient holds its terms' K, the adjoint and the term's scratch (2 + 1 + 1),
    # beside Sigma, Pi, B and G.
    with pytest.raises(MemoryError, match="8 N x N"):
        VGPPoissonRegressor(kernel=RBF() * Matern32()).fit(X, y)


def test_vgp_core_bad_alloc_gets_context(monkeypatch):
    # Before: MemoryError('std::bad_alloc'), nothing more.
    rng = np.random.default_rng(3)
    X, y = binary(40, rng)

    def bad_alloc(*args, **kwargs):
        raise MemoryError("std::bad_alloc")

    monkeypatch.setattr(_core.cvi, "fit_step", bad_alloc)
    est = VGPClassifier()
    with pytest.raises(MemoryError, match=r"ran out of memory \(std::bad_alloc; it needs about "
                                          r".*use SVGPClassifier") as e:
        est.fit(X, y)
    assert isinstance(e.value.__cause__, MemoryError)
    assert not hasattr(est, "alpha_")


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_vgp_refit_releases_the_previous_predictive_factor(monkeypatch):
    # Before: the previous fit's L N x N factors stayed allocated through the refit's peak
    # (6 N^2 doubles instead of 5 for a logit refit).
    rng = np.random.default_rng(4)
    X, y = binary(50, rng)
    est = VGPClassifier(max_iter=2).fit(X, y)
    assert est.predictive_factor_ is not None
    seen = []
    fit_step = _core.cvi.fit_step

    def recording(*args, **kwargs):
        seen.append(getattr(est, "predictive_factor_", None))
        return fit_step(*args, **kwargs)

    monkeypatch.setattr(_core.cvi, "fit_step", recording)
    est.fit(X, y)
    assert seen and all(f is None for f in seen)
    assert est.predictive_factor_.shape == (1, 50, 50)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_vgp_ordinal_predict_proba_scratch_is_bounded():
    # Before: 2 (K - 1) arrays [T, 40] for all T test rows at once (875 MiB for an output of
    # 8 MiB at T = 2e5, K = 5); now blocks of rows.
    rng = np.random.default_rng(5)
    X = rng.normal(size=(80, 2))
    y = np.digitize(X[:, 0], [-0.5, 0.0, 0.5])
    est = VGPClassifier(likelihood="ordinal", max_iter=3).fit(X, y)
    Xt = rng.normal(size=(20000, 2))
    tracemalloc.start()
    try:
        proba = est.predict_proba(Xt)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 25e6  # (all rows at once: 2 * 3 * 20000 * 40 * 8 = 38 MB and more)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    # blocks change nothing
    np.testing.assert_allclose(proba[:100], est.predict_proba(Xt[:100]), rtol=1e-12)


@pytest.mark.parametrize("optimizer", ["lbfgs", "natgrad"])
def test_svgp_fit_refused_before_kmeans(available, monkeypatch, optimizer):
    # Before: n_inducing=100000 on 120000 rows was still in the k-means of the inducing inputs
    # after 60 s, and then needed 75 GiB for q_sqrt alone; 200 classes with M = 2000 failed
    # in numpy after 12 s and 7 GB.
    rng = np.random.default_rng(6)
    X = rng.normal(size=(300, 2))
    y = rng.integers(0, 3, size=300)
    monkeypatch.setattr(pygpfast._base._start, "init_inducing", no_core_call)
    a, b = svgp._estimators._SVGPEstimator._FIT_MATRICES[optimizer]
    needed = 8 * (3 * a + b) * 200 * 200
    available(needed - 1)
    with pytest.raises(MemoryError) as e:
        SVGPClassifier(n_inducing=200, optimizer=optimizer).fit(X, y)
    message = str(e.value)
    assert "M = 200 inducing points, 3 latent functions" in message
    assert _memory.format_bytes(needed) in message
    assert f"n_inducing at most {int(np.sqrt((needed - 1) / (8.0 * (3 * a + b))))}" in message
    assert ("or optimizer='natgrad'" in message) == (optimizer == "lbfgs")


def test_svgp_partial_fit_and_regressor_refused(available, monkeypatch):
    rng = np.random.default_rng(7)
    X = rng.normal(size=(200, 2))
    monkeypatch.setattr(pygpfast._base._start, "init_inducing", no_core_call)
    available(1000)
    with pytest.raises(MemoryError, match="SVGPClassifier.partial_fit \\(optimizer='natgrad'\\)"):
        SVGPClassifier(n_inducing=50).partial_fit(X, X[:, 0] > 0, classes=[False, True])
    with pytest.raises(MemoryError, match="SVGPRegressor.fit"):
        SVGPRegressor(n_inducing=50).fit(X, X[:, 0])


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_svgp_fit_that_fits_is_not_refused(available):
    rng = np.random.default_rng(8)
    X, y = binary(100, rng)
    a, b = svgp._estimators._SVGPEstimator._FIT_MATRICES["lbfgs"]
    available(8 * (a + b) * 20 * 20)
    est = SVGPClassifier(n_inducing=20, max_iter=5).fit(X, y)
    assert est.inducing_points_.shape == (20, 2)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_svgp_step_memory_error_gets_context(monkeypatch):
    rng = np.random.default_rng(9)
    X, y = binary(100, rng)

    def bad_alloc(*args, **kwargs):
        raise MemoryError("std::bad_alloc")

    monkeypatch.setattr(_core.svgp, "elbo", bad_alloc)
    est = SVGPClassifier(n_inducing=10)
    with pytest.raises(MemoryError, match=r"M = 10 inducing points .*ran out of memory "
                                          r"\(std::bad_alloc"):
        est.fit(X, y)
    assert not hasattr(est, "model_")
    monkeypatch.undo()
    assert pygpfast.SVGPClassifier(n_inducing=10, max_iter=2).fit(X, y).predict(X).shape == (100,)


def test_svgp_multiclass_probabilities_scratch_is_bounded(monkeypatch):
    # predict_proba took the marginals of every row at once, then the softmax's scratch: a
    # peak of 4 times its output (122 MiB for 30.5 MiB at T = 2e5, C = 20). Row blocks sized
    # by the number of classes bound the temporaries to those of one block.
    from pygpfast._base import _streaming

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(300, 3)), rng.integers(0, 10, 300)
    with pytest.warns(Warning, match="max_iter"):  # (not converged)
        model = SVGPClassifier(n_inducing=10, max_iter=1, random_state=0).fit(X, y)
    T = rng.normal(size=(40_000, 3))
    monkeypatch.setattr(_streaming, "BUFFER_BYTES", 1 << 20)  # blocks of 1 MiB
    tracemalloc.start()
    try:
        proba = model.predict_proba(T)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        log_proba = model.predict_log_proba(T)
        log_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < proba.nbytes + (6 << 20)  # (the output, 3.1 MiB, and a few MiB of blocks)
    assert log_peak < 2 * proba.nbytes + (6 << 20)  # (both outputs held)
    np.testing.assert_allclose(np.exp(log_proba), proba, rtol=1e-10, atol=1e-300)


def test_svgp_mf_refusal_names_the_method(available, monkeypatch):
    # (it said optimizer='lbfgs', which the user had not asked for, and suggested 'natgrad',
    # which method='mf' does not take)
    rng = np.random.default_rng(9)
    X, y = binary(100, rng)
    monkeypatch.setattr(pygpfast._base._start, "init_inducing", no_core_call)
    available(1000)
    with pytest.raises(MemoryError) as e:
        SVGPClassifier(n_inducing=50, method="mf").fit(X, y)
    assert "(method='mf')" in str(e.value) and "natgrad" not in str(e.value)
