"""Thread control."""

import os
import subprocess
import sys

import numpy as np
import pytest

import pygpfast


def test_set_and_get(restore_threads):
    pygpfast.set_num_threads(1)
    assert pygpfast.get_num_threads() == 1
    pygpfast.set_num_threads(3)
    assert pygpfast.get_num_threads() == 3
    pygpfast.set_num_threads(np.int64(2))  # (numpy integers were refused)
    assert pygpfast.get_num_threads() == 2
    pygpfast.set_num_threads(None)
    assert pygpfast.get_num_threads() >= 1


def test_set_num_threads_limits_blas(restore_threads):
    from threadpoolctl import threadpool_info

    pygpfast.set_num_threads(1)
    blas = [p for p in threadpool_info() if p["user_api"] == "blas"]
    assert blas and all(p["num_threads"] == 1 for p in blas)


@pytest.mark.parametrize("bad", [1.5, "2", True, np.True_])
def test_bad_thread_count(bad):
    with pytest.raises(ValueError):
        pygpfast.set_num_threads(bad)


def test_default_honours_omp_num_threads(tmp_path):
    if not pygpfast._core.threads.openmp_enabled():
        pytest.skip("core built without OpenMP")
    # Import the same pygpfast as this test session (installed or built in place).
    package_root = os.path.dirname(os.path.dirname(pygpfast.__file__))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=package_root)
    out = subprocess.run(
        [sys.executable, "-c", "import pygpfast; print(pygpfast.get_num_threads())"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1"


@pytest.mark.parametrize("limit", [1, 3])
def test_default_follows_a_threadpoolctl_limit(restore_threads, limit):
    # (The count was read once, at the first call: a fit inside threadpool_limits(1), as
    # scikit-learn's n_threads=None honours it, ran on every core.)
    if not pygpfast._core.threads.openmp_enabled():
        pytest.skip("core built without OpenMP")
    from threadpoolctl import threadpool_limits

    pygpfast.set_num_threads(None)
    before = pygpfast.get_num_threads()
    with threadpool_limits(limits=limit, user_api="openmp"):
        assert pygpfast.get_num_threads() == limit
        pygpfast.set_num_threads(2)  # (an explicit count wins)
        assert pygpfast.get_num_threads() == 2
        pygpfast.set_num_threads(None)
        assert pygpfast.get_num_threads() == limit
    assert pygpfast.get_num_threads() == before


def test_minimize_runs_scipy_on_one_blas_thread_and_the_objective_on_all(monkeypatch,
                                                                          restore_threads):
    # scipy's L-BFGS-B calls LAPACK's dtrtrs on tiny systems, which OpenBLAS spreads over all
    # its threads; with those threads spinning (scipy imported before pygpfast) a 0.8 s SVGP
    # fit took 6.2 s. The optimiser's own calls now run on one BLAS thread, the objective's
    # and the callback's (the core's) on pygpfast's count. Where the BLAS's count cannot be set
    # (the dependency floors' OpenBLAS) it is plain minimize: the core reads no count (0) and
    # every part runs on the count set_num_threads set through threadpoolctl.
    import scipy.optimize

    from pygpfast import _threads

    pygpfast.set_num_threads(2)
    before = _blas_counts()
    seen = {}

    def counts():
        return pygpfast._core.threads.blas_threads(), _blas_counts()

    def fake_minimize(fun, x0, callback=None, **kwargs):
        seen["scipy"] = counts()
        value = fun(x0)
        callback(x0)
        seen["scipy after"] = counts()
        return value

    def objective(x):
        seen["objective"] = counts()
        return float(np.sum(x**2))

    monkeypatch.setattr(scipy.optimize, "minimize", fake_minimize)
    value = _threads.minimize(objective, np.ones(3), callback=lambda x: seen.setdefault(
        "callback", counts()))
    assert value == 3.0
    core = {name: c[0] for name, c in seen.items()}
    if pygpfast._core.blas.thread_control:
        assert core == {"scipy": 1, "objective": 2, "callback": 2, "scipy after": 1}
        assert pygpfast._core.threads.blas_threads() == 2
    else:
        assert seen == dict.fromkeys(("scipy", "objective", "callback", "scipy after"),
                                     (0, before))
        assert _blas_counts() == before


_FORK_SCRIPT = """
import multiprocessing as mp
import numpy as np
import pygpfast

pygpfast.set_num_threads(2)
rng = np.random.default_rng(0)
X = rng.standard_normal((600, 4))
y = (X[:, 0] > 0).astype(int)

def fit(seed):
    model = pygpfast.VGPClassifier(max_iter=2, random_state=seed).fit(X, y)
    return pygpfast.get_num_threads(), model.score(X, y)

parent = fit(0)
with mp.get_context("fork").Pool(2) as pool:
    children = pool.map(fit, [1, 2])
print(parent[0], [c[0] for c in children], parent[1] == children[0][1] == children[1][1])
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_after_parallel_work_runs_on_one_thread(tmp_path):
    # GNU OpenMP is not fork-safe: after a fit on 2 threads in the parent, the same fit in a
    # multiprocessing 'fork' worker waited forever for the parent's pool threads.
    if not pygpfast._core.threads.openmp_enabled():
        pytest.skip("core built without OpenMP")
    package_root = os.path.dirname(os.path.dirname(pygpfast.__file__))
    env = dict(os.environ, PYTHONPATH=package_root, PYTHONWARNINGS="ignore")
    out = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[0] == "2 [1, 1] True"


def _blas_counts():
    from threadpoolctl import threadpool_info

    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


class _Interleaved:
    """Two threads, A and B, whose scopes overlap in the order A opens, B opens, A closes, B
    closes: each calls hold() while its scope is open and released() after closing it."""

    def __init__(self):
        import threading

        self._name = lambda: threading.current_thread().name
        self._thread = threading.Thread
        self.a_in, self.b_in, self.a_out = (threading.Event() for _ in range(3))

    def hold(self):
        if self._name() == "A":
            self.a_in.set()
            self.b_in.wait(10)
        else:
            self.a_in.wait(10)
            self.b_in.set()
            self.a_out.wait(10)

    def released(self):
        if self._name() == "A":
            self.a_out.set()

    def run(self, target):
        threads = [self._thread(target=target, name=name) for name in "AB"]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def test_one_blas_thread_scopes_in_threads_restore_the_count(monkeypatch, restore_threads):
    # OpenBLAS's openblas_set_num_threads_local is process-wide (pthreads builds call the
    # global setter). _threads.minimize in two threads, each setting one BLAS thread for scipy's
    # part and putting back the count it found, restored in the wrong order (A found 2, B found
    # A's 1, A put back 2, B put back 1), and the BLAS stayed on one thread for the process.
    # (Where the BLAS's count cannot be set, the scopes set nothing and must change nothing.)
    import scipy.optimize

    from pygpfast import _threads

    pygpfast.set_num_threads(2)
    before = _blas_counts()
    order = _Interleaved()

    def fake_minimize(fun, x0, callback=None, **kwargs):  # (scipy's part: A's, then B's, open)
        order.hold()
        return fun(x0)

    def run():
        _threads.minimize(lambda x: 0.0, np.zeros(1))
        order.released()

    monkeypatch.setattr(scipy.optimize, "minimize", fake_minimize)
    order.run(run)
    assert _blas_counts() == before


def test_a_fit_with_parallel_blas_loops_leaves_the_blas_count(restore_threads):
    # The same within one fit: each OpenMP thread of the core's parallel regions whose items
    # call BLAS (VGP's rank-b updates of V, threaded from b N^2 = 3e7 flops: N >= ~700 with
    # b = 64) set one BLAS thread and put back what it found; one VGPClassifier fit at
    # N = 1500 left scipy's BLAS, which scipy.linalg and the core use, on one thread for the
    # rest of the process.
    # (Where the BLAS's count cannot be set, or without OpenMP, nothing sets it: the same check.)
    pygpfast.set_num_threads(2)
    before = _blas_counts()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1000, 2))
    pygpfast.VGPClassifier(optimize_hyperparameters=False, inner_max_iter=3, block_size=64).fit(
        X, X[:, 0] > 0)
    assert _blas_counts() == before


def test_process_wide_one_blas_thread_scopes_are_counted(monkeypatch):
    # one_blas_thread(process_wide=True) where the core cannot set the BLAS's count (forced here,
    # as at the dependency floors): one threadpoolctl limit to one BLAS thread while any such
    # scope is open in any thread, restored once, after the last, whatever the order they close
    # in (A opens, B opens, A closes, B closes). (threadpoolctl is replaced by a recorder: with
    # OpenBLAS >= 0.3.27 a count set in one thread does not show in another's reading.)
    import threading

    from pygpfast import _threads

    class NoThreadControl:
        @staticmethod
        def enter_one_blas_thread():
            return False

        @staticmethod
        def leave_one_blas_thread():
            raise AssertionError("left a scope that was not entered")

    events = []

    class Limiter:
        def __init__(self, limits, user_api):
            assert (limits, user_api) == (1, "blas")
            events.append("set 1")

        def restore_original_limits(self):
            events.append("restored")

    monkeypatch.setattr(_threads._core, "threads", NoThreadControl)
    monkeypatch.setattr(_threads, "threadpool_limits", Limiter)
    order = _Interleaved()

    def run():
        name = threading.current_thread().name
        with _threads.one_blas_thread(process_wide=True):
            order.hold()
            events.append(f"{name} in")
        events.append(f"{name} out")
        order.released()

    order.run(run)
    assert events == ["set 1", "A in", "A out", "B in", "restored", "B out"]
    with _threads.one_blas_thread():  # (without process_wide: nothing set)
        pass
    with _threads.one_blas_thread(process_wide=True):  # (and a new scope sets it again)
        pass
    assert events[6:] == ["set 1", "restored"]
