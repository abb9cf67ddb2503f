"""State and concurrency (issue 27): pickles that record the pygpfast version and state format
that wrote them (loaded where the format is this one, refused with a clear error otherwise);
pickling of unfitted estimators and of the building blocks; threads predicting from one model
at once, and fits in two threads at once, give the one-thread answers; predictions of a fitted
model do not depend on the thread count; a RandomState instance reproduces a fit; a streaming
fit from np.memmap under a memory limit smaller than the file; IS-MOE on Dask with one or
every worker killed mid-fit (the fault-free result), no worker left, and the client's connection
lost mid-fit (a clear error, or the fault-free result).

The bitwise pickle round trip of every fitted estimator, the reproducibility of a fit with an
integer random_state and fits on 1 and 2 threads are in the shared behaviour suite
(tests/test_estimators_common.py).
"""

import concurrent.futures
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest
from sklearn.base import is_classifier
from sklearn.exceptions import ConvergenceWarning, NotFittedError

import pygpfast
from pygpfast import kernels, likelihoods, priors
from pygpfast._base import _estimator
from pygpfast.moe import _dask

from dask_cluster import loopback_cluster, wait_for_workers
from pygpfast.cvi import LocalBound
from pygpfast.piecewise import llp_bound
from pygpfast.svgp import SVGP

from blas_rounding import assert_same

quiet = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

#: One estimator of each family (small settings), with its task.
FAMILIES = {
    "SVGPClassifier-softmax": (lambda: pygpfast.SVGPClassifier(n_inducing=10, max_iter=30,
                                                               random_state=0), "multiclass"),
    "VGPClassifier": (lambda: pygpfast.VGPClassifier(max_iter=10, random_state=0), "binary"),
    "IVMClassifier-joint": (lambda: pygpfast.IVMClassifier(active_size=25, max_iter=5,
                                                           random_state=0), "multiclass"),
    "ISMOERegressor": (lambda: pygpfast.ISMOERegressor(n_experts=3, n_samples=4, max_iter=30,
                                                       random_state=0), "regression"),
}


def _data(task, n=150, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2.0, 2.0, (n, 2))
    f = np.sin(2.0 * X[:, 0]) + 0.5 * X[:, 1]
    if task == "binary":
        return X, np.where(f + 0.3 * rng.standard_normal(n) > 0, "yes", "no")
    if task == "multiclass":
        return X, np.digitize(f + 0.2 * rng.standard_normal(n), [-0.5, 0.5])
    return X, f + 0.1 * rng.standard_normal(n)


def _quiet_fit(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # (the settings are small on purpose)
        return est.fit(X, y)


def _outputs(est, X):
    """Everything an estimator predicts at X."""
    out = list(est.predict_latent(X))
    if is_classifier(est):
        out += [est.predict_proba(X), est.predict(X)]
    else:
        out += list(est.predict(X, return_std=True))
    return out


def _assert_outputs_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        assert_same(u, v)


@pytest.fixture(scope="module")
def fitted():
    """{name: (fitted estimator, test inputs [300, 2])} for FAMILIES."""
    out = {}
    for name, (make, task) in FAMILIES.items():
        X, y = _data(task)
        Xt = np.random.default_rng(1).uniform(-2.5, 2.5, (300, 2))
        out[name] = (_quiet_fit(make(), X, y), Xt)
    return out


# ---------------------------------------------------------------- pickles and versions
@pytest.mark.parametrize("name", FAMILIES)
def test_a_pickle_records_the_version_and_the_state_format(fitted, name):
    est, _ = fitted[name]
    state = est.__getstate__()
    assert state["_pygpfast_version"] == pygpfast.__version__
    assert state["_pygpfast_state_format"] == _estimator.STATE_FORMAT
    loaded = pickle.loads(pickle.dumps(est))
    # (the fields describe the pickle, not the model: loading drops them)
    assert "_pygpfast_version" not in vars(loaded) and "_pygpfast_state_format" not in vars(loaded)
    assert set(vars(loaded)) == set(vars(est))


def _pickled_by(monkeypatch, est, *, version=None, state_format=None, unversioned=False):
    """The bytes another pygpfast would write for `est`: another version string, another state
    format, or (`unversioned`) a pygpfast from before versioned pickles."""
    with monkeypatch.context() as m:
        if version is not None:
            m.setattr(_estimator, "__version__", version)
        if state_format is not None:
            m.setattr(_estimator, "STATE_FORMAT", state_format)
        if unversioned:
            m.setattr(_estimator.GPEstimator, "__getstate__",
                      lambda self: dict(vars(self)))
        return pickle.dumps(est)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_pickle_of_another_version_with_this_format_loads_silently(fitted, monkeypatch, name):
    est, Xt = fitted[name]
    data = _pickled_by(monkeypatch, est, version="0.0.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (loads silently: no InconsistentVersionWarning)
        loaded = pickle.loads(data)
    for u, v in zip(_outputs(loaded, Xt), _outputs(est, Xt)):
        np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_pickle_of_another_state_format_is_refused_naming_both_versions(fitted, monkeypatch,
                                                                          name):
    est, _ = fitted[name]
    here, fmt = pygpfast.__version__, _estimator.STATE_FORMAT
    cls = type(est).__name__
    data = _pickled_by(monkeypatch, est, version="9.0.0", state_format=fmt + 1)
    with pytest.raises(ValueError) as e:
        pickle.loads(data)
    assert str(e.value) == (
        f"Cannot load this {cls}: it was pickled by pygpfast 9.0.0 (state format {fmt + 1}), "
        f"and pygpfast {here} reads state format {fmt} only. Fit it again with pygpfast "
        f"{here}, or load it with pygpfast 9.0.0.")
    data = _pickled_by(monkeypatch, est, unversioned=True)
    with pytest.raises(ValueError, match=(
            f"pickled by a pygpfast that did not record its version \\(no state format\\), and "
            f"pygpfast {here} reads state format {fmt} only.*load it with the pygpfast that "
            "wrote it")):
        pickle.loads(data)


def test_unfitted_estimators_pickle_unfitted_with_their_parameters():
    kernel = kernels.RBF(lengthscale=[0.5, 2.0], priors={"variance": priors.LogNormal(0.0, 1.0)})
    classes = [getattr(pygpfast, n) for n in pygpfast.__all__
               if isinstance(getattr(pygpfast, n), type)
               and issubclass(getattr(pygpfast, n), _estimator.GPEstimator)]
    assert len(classes) == 7
    for cls in classes:
        est = cls(kernel, random_state=np.random.RandomState(3))
        loaded = pickle.loads(pickle.dumps(est))
        assert type(loaded) is cls
        params, loaded_params = est.get_params(deep=False), loaded.get_params(deep=False)
        rs, loaded_rs = params.pop("random_state"), loaded_params.pop("random_state")
        assert repr(loaded_params) == repr(params)
        assert loaded.kernel is not kernel and repr(loaded.kernel) == repr(kernel)
        np.testing.assert_array_equal(loaded_rs.randint(1 << 30, size=4),
                                      rs.randint(1 << 30, size=4))
        with pytest.raises(NotFittedError):
            loaded.predict(np.zeros((2, 2)))


def test_building_blocks_pickle_and_compute_the_same():
    rng = np.random.default_rng(2)
    X, X2 = rng.normal(size=(7, 2)), rng.normal(size=(5, 2))
    prior = priors.LogNormal(0.3, 0.7)
    ks = [kernels.RBF(2.0, [0.5, 1.5], priors={"lengthscale": prior}), kernels.Matern12(),
          kernels.Matern32(lengthscale=0.7), kernels.Matern52(1.3, [1.0, 2.0]),
          kernels.Linear(0.5), kernels.Constant(2.0), kernels.White(0.1),
          kernels.RBF() + kernels.White(0.01), kernels.Matern32() * kernels.Linear()]
    for k in ks:
        loaded = pickle.loads(pickle.dumps(k))
        assert repr(loaded) == repr(k)
        np.testing.assert_array_equal(loaded(X), k(X))
        np.testing.assert_array_equal(loaded(X, X2), k(X, X2))
        assert loaded.log_prior() == k.log_prior()
    assert pickle.loads(pickle.dumps(prior)) == prior
    mu, var = rng.normal(size=6), rng.uniform(0.1, 2.0, 6)
    liks = [(likelihoods.Gaussian(0.3, priors={"variance": prior}), rng.normal(size=6)),
            (likelihoods.Bernoulli("logit"), rng.integers(0, 2, 6).astype(float)),
            (likelihoods.Bernoulli("probit"), rng.integers(0, 2, 6).astype(float)),
            (likelihoods.Poisson(), rng.poisson(2.0, 6).astype(float))]
    for lik, y in liks:
        loaded = pickle.loads(pickle.dumps(lik))
        assert repr(loaded) == repr(lik) and loaded.log_prior() == lik.log_prior()
        for u, v in zip(loaded.predict_mean_and_var(mu, var), lik.predict_mean_and_var(mu, var)):
            np.testing.assert_array_equal(u, v)
        for u, v in zip(loaded.variational_expectations(y, mu, var),
                        lik.variational_expectations(y, mu, var)):
            np.testing.assert_array_equal(u, v)
    softmax = likelihoods.Softmax(3)
    M3, V3 = rng.normal(size=(6, 3)), rng.uniform(0.1, 1.0, (6, 3))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(softmax)).predict_proba(M3, V3),
                                  softmax.predict_proba(M3, V3))
    # the SVGP model object: its ELBO with gradients and its predictions
    M = 4
    model = SVGP(ks[0], likelihoods.Bernoulli("logit"), rng.normal(size=(M, 2)),
                 q_mu=rng.normal(size=M), q_sqrt=np.tril(rng.normal(size=(M, M))) + 2 * np.eye(M),
                 prior_mean=[0.2])
    loaded = pickle.loads(pickle.dumps(model))
    yb = liks[1][1]
    (e1, g1), (e2, g2) = (m.elbo(X[:6], yb, with_grad=True) for m in (loaded, model))
    assert e1 == e2 and g1.keys() == g2.keys()
    for key in g1:
        np.testing.assert_array_equal(g1[key], g2[key])
    for u, v in zip(loaded.predict_f(X2), model.predict_f(X2)):
        np.testing.assert_array_equal(u, v)
    # concave-VI local bounds and the piecewise bound under them
    for bound in (LocalBound("logit"), LocalBound("poisson"), LocalBound("softmax", n_classes=3)):
        loaded = pickle.loads(pickle.dumps(bound))
        assert repr(loaded) == repr(bound)
        y = np.zeros(6) if bound.n_latent == 1 else np.arange(6) % 3.0
        m = rng.normal(size=(bound.n_latent, 6))
        v = rng.uniform(0.1, 1.0, (bound.n_latent, 6))
        for u, w in zip(loaded(y, m, v), bound(y, m, v)):
            np.testing.assert_array_equal(u, w)
    piece = llp_bound(10, "linear")
    x = np.linspace(-30, 30, 101)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(piece))(x), piece(x))


# ---------------------------------------------------------------- threads
def _at_once(calls, fns):
    """`calls` calls of each of `fns` (no arguments), each on a thread of its own, the threads
    started together: the results, per function, in order."""
    start = threading.Barrier(len(fns))

    def run(fn):
        start.wait()
        return [fn() for _ in range(calls)]

    with concurrent.futures.ThreadPoolExecutor(len(fns)) as pool:
        futures = [pool.submit(run, fn) for fn in fns]
        return [f.result(timeout=120) for f in futures]


@pytest.mark.parametrize("name", FAMILIES)
def test_threads_predicting_at_once_get_the_one_thread_answers(fitted, name):
    est, Xt = fitted[name]
    # 4 threads x 20 calls, each thread at inputs of its own (threads that computed the same
    # answers would hide state shared between calls); the core releases the GIL in every
    # prediction, so the calls run at the same time, in the core and its OpenMP loops
    inputs = [Xt[: 300 - 50 * i] + 0.1 * i for i in range(4)]
    references = [_outputs(est, X) for X in inputs]
    results = _at_once(20, [lambda X=X: _outputs(est, X) for X in inputs])
    for reference, per_thread in zip(references, results):
        for got in per_thread:
            _assert_outputs_same(got, reference)


def test_threads_predicting_at_once_from_a_loaded_vgp_compute_its_factor_once(fitted,
                                                                            monkeypatch):
    # predictive_factor_ is left out of a VGP's pickle and computed by the first prediction:
    # the one state a prediction writes
    est, Xt = fitted["VGPClassifier"]
    loaded = pickle.loads(pickle.dumps(est))
    assert loaded.predictive_factor_ is None
    core = pygpfast._core.cvi.predictive_factor
    calls = []

    def slow_factor(*args, **kwargs):
        calls.append(threading.get_ident())
        time.sleep(0.2)  # (long enough for every thread to reach the factor meanwhile)
        return core(*args, **kwargs)

    monkeypatch.setattr(pygpfast._core.cvi, "predictive_factor", slow_factor)
    inputs = [Xt[: 300 - 50 * i] for i in range(4)]
    results = _at_once(1, [lambda X=X: loaded.predict_proba(X) for X in inputs])
    assert len(calls) == 1
    for X, (proba,) in zip(inputs, results):
        assert_same(proba, est.predict_proba(X))
    # (bitwise where the core holds the BLAS's count; at the dependency floors the factor's BLAS
    # calls split by how busy the pool is, which four predicting threads change: 4e-15 seen)
    assert_same(loaded.predictive_factor_, est.predictive_factor_, rtol=1e-12)


#: Pairs of different estimators fitted on the same data at once.
PAIRS = {
    "SVGP+VGP": (lambda: pygpfast.SVGPClassifier(n_inducing=10, max_iter=30, random_state=0),
                 lambda: pygpfast.VGPClassifier(max_iter=10, random_state=0)),
    "IVM+ISMOE": (lambda: pygpfast.IVMClassifier(active_size=25, max_iter=5, random_state=0),
                  lambda: pygpfast.ISMOEClassifier(n_experts=2, n_samples=4, max_iter=30,
                                                   random_state=0)),
}


@quiet
@pytest.mark.parametrize("pair", PAIRS)
def test_two_fits_in_two_threads_at_once_equal_the_fits_one_after_the_other(pair):
    X, y = _data("binary", n=200, seed=3)
    Xt = np.random.default_rng(4).uniform(-2.5, 2.5, (100, 2))
    makes = PAIRS[pair]
    one_by_one = [make().fit(X, y) for make in makes]
    start = threading.Barrier(2)

    def fit(make):
        est = make()
        start.wait()
        return est.fit(X, y)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        at_once = list(pool.map(fit, makes, timeout=120))
    for a, b in zip(at_once, one_by_one):
        assert_same(a.objective_, b.objective_)
        assert_same(a.history_, b.history_)
        _assert_outputs_same(_outputs(a, Xt), _outputs(b, Xt))


@pytest.mark.parametrize("name", FAMILIES)
def test_predictions_of_a_fitted_model_do_not_depend_on_the_thread_count(fitted, name,
                                                                         restore_threads):
    est, Xt = fitted[name]
    pygpfast.set_num_threads(1)
    one = _outputs(est, Xt)
    pygpfast.set_num_threads(2)
    _assert_outputs_same(_outputs(est, Xt), one)


@quiet
@pytest.mark.parametrize("name", FAMILIES)
def test_a_random_state_instance_reproduces_the_fit_of_its_seed(name):
    make, task = FAMILIES[name]
    X, y = _data(task, n=100, seed=5)
    fits = [make().set_params(random_state=rs).fit(X, y)
            for rs in (np.random.RandomState(7), np.random.RandomState(7), 7)]
    for other in fits[1:]:
        assert other.objective_ == fits[0].objective_
        np.testing.assert_array_equal(other.history_, fits[0].history_)
        for u, v in zip(_outputs(other, X), _outputs(fits[0], X)):
            np.testing.assert_array_equal(u, v)


# ---------------------------------------------------------------- streaming under a memory limit
#: Run in a child process: warm up (thread pools, the BLAS's buffers, the code of the fit), then
#: cap the process's private memory (RLIMIT_DATA) at what it holds plus BUDGET, check that a
#: copy of the file is refused, and fit from the file mapped read-only (shared file pages are
#: not private memory). Prints the memory figures as JSON.
_STREAMING_CHILD = textwrap.dedent("""
    import json, resource, sys, threading, time, warnings
    import numpy as np
    from sklearn.exceptions import ConvergenceWarning
    from pygpfast import SVGPClassifier

    def status(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024

    x_path, y_path, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
    settings = dict(n_inducing=10, optimizer="natgrad", batch_size=1024, max_iter=1,
                    random_state=0)
    rng = np.random.default_rng(1)
    Xw = rng.standard_normal((3000, 50))
    warnings.simplefilter("ignore", ConvergenceWarning)  # (one epoch)
    SVGPClassifier(**settings).fit(Xw, Xw[:, 0] > 0).predict_proba(Xw)
    del Xw
    peak, done = [0], threading.Event()

    def sample():  # (RssAnon every 2 ms: the private memory actually touched)
        while not done.is_set():
            peak[0] = max(peak[0], status("RssAnon"))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    X, y = np.load(x_path, mmap_mode="r"), np.load(y_path)
    base_data, base_anon = status("VmData"), status("RssAnon")
    resource.setrlimit(resource.RLIMIT_DATA, (base_data + budget, base_data + budget))
    try:
        np.array(X)
        copy_refused = False
    except MemoryError:
        copy_refused = True
    clf = SVGPClassifier(**settings).fit(X, y)
    accuracy = clf.score(X[:5000], y[:5000])
    done.set()
    sampler.join()
    print(json.dumps(dict(copy_refused=copy_refused, base_anon=base_anon, peak_anon=peak[0],
                          data_growth=status("VmData") - base_data, accuracy=accuracy,
                          n_iter=clf.n_iter_)))
""")


def test_a_streaming_fit_from_a_memmap_runs_under_a_memory_limit_smaller_than_the_file(
        tmp_path, record_property):
    N, D, budget = 1_000_000, 50, 80 << 20  # a 400 MB file, at most 80 MiB of private memory
    X = np.lib.format.open_memmap(tmp_path / "X.npy", mode="w+", dtype=np.float64, shape=(N, D))
    rng = np.random.default_rng(0)
    for start in range(0, N, 100_000):
        X[start:start + 100_000] = rng.standard_normal((100_000, D))
    X.flush()
    np.save(tmp_path / "y.npy", (X[:, 0] + X[:, 1] > 0).astype(np.int8))
    assert X.nbytes > 4 * budget
    del X
    script = tmp_path / "child.py"
    script.write_text(_STREAMING_CHILD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "X.npy"),
                          str(tmp_path / "y.npy"), str(budget)],
                         capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    growth = got["peak_anon"] - got["base_anon"]
    for key, value in [("file_MB", N * D * 8 / 1e6), ("limit_MB", budget / 1e6),
                       ("peak_anon_growth_MB", growth / 1e6),
                       ("vmdata_growth_MB", got["data_growth"] / 1e6)]:
        record_property(key, round(value, 1))
    print(f"streaming fit: file {N * D * 8 / 1e6:.0f} MB, limit {budget / 1e6:.0f} MB, "
          f"peak RssAnon growth {growth / 1e6:.0f} MB, VmData growth "
          f"{got['data_growth'] / 1e6:.0f} MB")
    # The limit holds: a copy of the file into memory is refused; the fit ran within it
    assert got["copy_refused"]
    assert got["data_growth"] <= budget and growth <= budget
    assert got["n_iter"] == 1 and got["accuracy"] > 0.95


# ---------------------------------------------------------------- IS-MOE on Dask
def _within(seconds, fn, *args):
    """fn(*args) on another thread: its result (or its exception), or a test failure when it
    has not returned after `seconds` (a hang)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(fn, *args).result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        pytest.fail(f"{getattr(fn, '__name__', fn)} did not return within {seconds} s")
    finally:
        pool.shutdown(wait=False)


@pytest.fixture
def local_cluster(request):
    """A LocalCluster on 127.0.0.1 (TCP) with 2 workers of 1 thread (processes=request.param)
    and its client; closed after the test."""
    # (protocol tcp: workers in this process would talk inproc, without a connection)
    with loopback_cluster(processes=request.param, protocol="tcp") as pair:
        yield pair


def _ismoe_data():
    rng = np.random.default_rng(6)
    X = rng.uniform(-2, 2, (300, 2))
    return X, np.sin(2 * X[:, 0]) + X[:, 1] + 0.1 * rng.standard_normal(300)


_ISMOE = dict(n_experts=2, n_samples=12, samples_per_iteration=1, max_iter=30, random_state=5)


def _kill_workers_at_2(client, n):
    """A callback that kills (SIGKILL) n of the client's worker processes at iteration 2
    (10 of 12 batches to go: they hold results and work in progress), and the killed pids."""
    pids = sorted(client.run(os.getpid).values())[:n]
    killed = []

    def kill(est, iteration, objective):
        if iteration == 2:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            killed.extend(pids)

    return kill, killed


def _assert_fit_equals(est, reference, X):
    assert_same(est.log_weights_, reference.log_weights_)
    assert_same(est.history_, reference.history_)
    for u, v in zip(est.predict(X, return_std=True), reference.predict(X, return_std=True)):
        assert_same(u, v)


@quiet
@pytest.mark.parametrize("local_cluster", [True], indirect=True)
@pytest.mark.parametrize("n_killed", [1, 2])
def test_ismoe_on_dask_survives_workers_killed_mid_fit(local_cluster, n_killed):
    # One worker killed: Dask runs its tasks again; the data may have gone with it (Dask keeps
    # one copy of broadcast data once the tasks have started). Both killed: the data are lost,
    # the nannies start new workers, and the fit scatters its data again.
    cluster, client = local_cluster
    X, y = _ismoe_data()
    reference = pygpfast.ISMOERegressor(**_ISMOE).fit(X, y)
    kill, killed = _kill_workers_at_2(client, n_killed)
    est = pygpfast.ISMOERegressor(client=client, callback=kill, **_ISMOE)
    _within(60, est.fit, X, y)
    assert len(killed) == n_killed
    _assert_fit_equals(est, reference, X)  # (the tasks draw from their own seeds)
    wait_for_workers(client, 2, timeout=30)
    assert not set(killed) & set(client.run(os.getpid).values())  # (new workers)


@quiet
@pytest.mark.parametrize("local_cluster", [False], indirect=True)
@pytest.mark.parametrize("stale_count", [False, True])
def test_ismoe_on_dask_fails_clearly_when_no_worker_is_left(local_cluster, monkeypatch,
                                                            stale_count):
    # stale_count: a retiring worker still counted as running, so the scatter finds none (the
    # scatter's TimeoutError must not read as a failed connection). The cluster must close
    # cleanly after it (CI met a KeyError from cluster.close() when the fit waited with
    # client.wait_for_workers, which refreshes the cluster's copy of the scheduler's state)
    cluster, client = local_cluster
    monkeypatch.setattr(_dask, "_WORKER_WAIT", 2.0)
    if stale_count:
        monkeypatch.setattr(_dask, "running_workers", lambda client: 1)
    X, y = _ismoe_data()

    def retire_every_worker(est, iteration, objective):
        if iteration == 2:
            cluster.scale(0)

    est = pygpfast.ISMOERegressor(client=client, callback=retire_every_worker, **_ISMOE)
    with pytest.raises(RuntimeError, match=(
            "^ISMOERegressor.fit stopped: the Dask (cluster lost the fit's data with its "
            "workers, and no worker joined it within 2 s|scheduler cancelled the fit's tasks "
            "again after 3 resubmissions)")):
        _within(60, est.fit, X, y)
    with pytest.raises(NotFittedError):
        est.predict(X)


#: What the error says when the client's connection to the scheduler is lost: the client may
#: have noticed it (and be reconnecting or closed), or only its cancelled futures, or its
#: connection may fail under a call.
_CONNECTION_LOST = ("(the Dask client was closed, or lost its connection to the scheduler|the "
                    "Dask scheduler cancelled the fit's tasks again|the connection to the Dask "
                    "cluster failed)")


@quiet
@pytest.mark.parametrize("local_cluster", [False], indirect=True)
@pytest.mark.parametrize("fault", ["close the client", "close the cluster",
                                   "cut the connection"])
def test_ismoe_on_dask_when_the_client_loses_the_cluster_mid_fit(local_cluster, fault):
    # The fit fails with a clear error, or (the connection cut, and the client connected again
    # in time) resubmits its work and completes with the fault-free result
    cluster, client = local_cluster
    X, y = _ismoe_data()
    reference = pygpfast.ISMOERegressor(**_ISMOE).fit(X, y)

    def fault_at_2(est, iteration, objective):
        if iteration == 2:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if fault == "close the client":
                    client.close()
                elif fault == "close the cluster":
                    cluster.close()
                else:  # (the client's connection to the scheduler drops, as on a network fault)
                    client.scheduler_comm.comm.abort()

    est = pygpfast.ISMOERegressor(client=client, callback=fault_at_2, **_ISMOE)
    try:
        _within(60, est.fit, X, y)
    except RuntimeError as e:
        what = "the Dask client was closed" if fault == "close the client" else _CONNECTION_LOST
        assert re.match(f"ISMOERegressor.fit stopped: {what}", str(e)), str(e)
        assert "The estimator is left unfitted" in str(e)
        with pytest.raises(NotFittedError):
            est.predict(X)
    else:
        assert fault == "cut the connection"
        _assert_fit_equals(est, reference, X)
