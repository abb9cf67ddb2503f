"""The OpenMP runtimes in one process with scikit-learn, numpy and scipy, as threadpoolctl sees them.

pygpfast's core links an OpenMP runtime: the system's libgomp when built from source, its own copy
(pygpfast.libs/libgomp-<hash>.so) in a repaired manylinux wheel, libomp in a macOS wheel.
scikit-learn's wheels carry their own. The probe runs in a fresh interpreter, so that the runtime
that pygpfast's core brings is the one that loading the core adds, and checks that threadpoolctl
lists every OpenMP runtime the process has mapped (so threadpool_limits reaches pygpfast's too),
that pygpfast.set_num_threads still sets the core's count, and that a KMeans and a pygpfast fit
both run in that process.
"""

import json
import os
import subprocess
import sys

import pygpfast

PROBE = r"""
import ctypes, glob, importlib.util, json, os, sys

import numpy as np
import scipy.linalg, scipy.optimize
from threadpoolctl import threadpool_info, threadpool_limits


def openmp():
    return {os.path.realpath(p["filepath"]): p for p in threadpool_info() if p["user_api"] == "openmp"}


def mapped_openmp():
    # The OpenMP runtimes mapped into this process, read from the kernel (Linux only).
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    paths = set()
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/"):
            name = os.path.basename(fields[5])
            if name.startswith(("libgomp", "libomp", "libiomp")):
                paths.add(os.path.realpath(fields[5]))
    return sorted(paths)


out = {}
before = openmp()
# Load pygpfast's extension without running the package (dlopen only, no import): the runtimes
# it adds are the core's.
package_dir = importlib.util.find_spec("pygpfast").submodule_search_locations[0]
(core_path,) = [p for p in glob.glob(os.path.join(package_dir, "_core.*"))
                if p.endswith((".so", ".pyd", ".dylib"))]
ctypes.CDLL(core_path)
out["core_runtimes"] = sorted(set(openmp()) - set(before))

import pygpfast
import sklearn
from sklearn.cluster import KMeans

out["pygpfast_file"] = pygpfast.__file__
out["sklearn_version"] = sklearn.__version__
out["openmp_enabled"] = bool(pygpfast._core.threads.openmp_enabled())

rng = np.random.default_rng(0)
X = np.concatenate([rng.normal(-1.5, 1.0, (100, 2)), rng.normal(1.5, 1.0, (100, 2))])
y = np.repeat([0, 1], 100)
out["kmeans_sizes"] = sorted(np.bincount(KMeans(2, n_init=1, random_state=0).fit(X).labels_).tolist())
clf = pygpfast.SVGPClassifier(n_inducing=8, random_state=0).fit(X, y)
out["svgp_accuracy"] = float(clf.score(X, y))
out["kmeans_sizes_after"] = sorted(np.bincount(KMeans(2, n_init=1, random_state=0).fit(X).labels_).tolist())

info = openmp()
out["openmp"] = [{k: p.get(k) for k in ("filepath", "prefix", "version", "num_threads")} | {"path": path}
                 for path, p in sorted(info.items())]
out["mapped"] = mapped_openmp()
out["blas"] = [{k: p.get(k) for k in ("filepath", "internal_api", "num_threads", "threading_layer")}
               for p in threadpool_info() if p["user_api"] == "blas"]

out["default_threads"] = pygpfast.get_num_threads()
pygpfast.set_num_threads(1)
out["after_set_1"] = {"pygpfast": pygpfast.get_num_threads(),
                      "openmp": {path: p["num_threads"] for path, p in openmp().items()}}
pygpfast.set_num_threads(None)
with threadpool_limits(limits=1, user_api="openmp"):
    out["in_openmp_limit_1"] = {"pygpfast": pygpfast.get_num_threads(),
                                "openmp": {path: p["num_threads"] for path, p in openmp().items()}}
    clf.fit(X, y)
out["after_limit"] = pygpfast.get_num_threads()
print(json.dumps(out))
"""


def test_openmp_runtimes_with_sklearn_in_one_process(tmp_path):
    # Import the same pygpfast as this test session (installed or built in place); OpenMP's
    # default count set to 2, so that a limit of 1 shows.
    package_root = os.path.dirname(os.path.dirname(pygpfast.__file__))
    env = dict(os.environ, OMP_NUM_THREADS="2",
               PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.splitlines()[-1])

    openmp = {p["path"]: p for p in out["openmp"]}
    core = out["core_runtimes"]
    others = sorted(set(openmp) - set(core))
    print(f"\npygpfast imported from {out['pygpfast_file']} (scikit-learn {out['sklearn_version']})")
    print(f"{len(openmp)} OpenMP runtime(s) listed by threadpoolctl, {len(core)} of them pygpfast's core's:")
    for path, p in openmp.items():
        who = "pygpfast" if path in core else "other"
        print(f"  [{who}] {p['prefix']} {p['version']} num_threads={p['num_threads']} {p['filepath']}")
    print(f"mapped OpenMP runtimes (/proc/self/maps): {out['mapped']}")
    for p in out["blas"]:
        print(f"  [blas] {p['internal_api']} ({p['threading_layer']}) num_threads={p['num_threads']} "
              f"{p['filepath']}")
    print(f"pygpfast.get_num_threads(): default {out['default_threads']}, after set_num_threads(1) "
          f"{out['after_set_1']['pygpfast']} (OpenMP runtimes then: {out['after_set_1']['openmp']}); "
          f"inside threadpool_limits(1, 'openmp') {out['in_openmp_limit_1']['pygpfast']} "
          f"(OpenMP runtimes: {out['in_openmp_limit_1']['openmp']}), after it {out['after_limit']}")

    assert out["pygpfast_file"] == pygpfast.__file__
    # A KMeans before and after a pygpfast fit, and the fit, work in one process.
    assert out["kmeans_sizes"] == out["kmeans_sizes_after"] and min(out["kmeans_sizes"]) > 80
    assert out["svgp_accuracy"] > 0.85
    # pygpfast's own setting rules the core, whatever runtime it has.
    assert out["after_set_1"]["pygpfast"] == 1
    if not out["openmp_enabled"]:
        return
    assert out["default_threads"] == 2 and out["after_limit"] == 2  # (OMP_NUM_THREADS=2)
    # Every OpenMP runtime in the process is one that threadpoolctl lists (and so limits)...
    if out["mapped"] is not None:
        assert set(out["mapped"]) <= set(openmp), (out["mapped"], sorted(openmp))
    # ... pygpfast's among them (one, unless the core shares a runtime loaded before it) ...
    assert len(core) <= 1 and set(core) <= set(openmp)
    # ... and a threadpoolctl OpenMP limit reaches each of them, pygpfast's default with it.
    assert set(out["in_openmp_limit_1"]["openmp"].values()) == {1}
    assert out["in_openmp_limit_1"]["pygpfast"] == 1
    # set_num_threads does not touch any runtime's own count (scikit-learn's stays its default).
    assert set(out["after_set_1"]["openmp"].values()) == {2}
    assert others or core, "no OpenMP runtime found although the core was built with OpenMP"


def _mapped_openmp():
    """The OpenMP runtimes mapped into this process (Linux; None elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    paths = (fields[5] for fields in map(lambda line: line.split(None, 5), lines)
             if len(fields) == 6 and fields[5].startswith("/"))
    return {os.path.realpath(p) for p in paths
            if os.path.basename(p).startswith(("libgomp", "libomp", "libiomp"))}


def test_openmp_runtimes_in_this_process(restore_threads):
    # The same in the test session's process (whatever was imported before).
    import numpy as np
    from sklearn.cluster import KMeans
    from threadpoolctl import threadpool_info, threadpool_limits

    rng = np.random.default_rng(1)
    X = np.concatenate([rng.normal(-1.5, 1.0, (60, 2)), rng.normal(1.5, 1.0, (60, 2))])
    y = np.repeat([0, 1], 60)
    KMeans(2, n_init=1, random_state=0).fit(X)
    pygpfast.set_num_threads(1)
    assert pygpfast.get_num_threads() == 1
    assert pygpfast.SVGPClassifier(n_inducing=6, random_state=0).fit(X, y).score(X, y) > 0.85
    pygpfast.set_num_threads(None)
    listed = {os.path.realpath(p["filepath"]) for p in threadpool_info() if p["user_api"] == "openmp"}
    mapped = _mapped_openmp()
    if mapped is not None:
        assert mapped <= listed, (mapped, listed)
    if pygpfast._core.threads.openmp_enabled():
        assert listed
        with threadpool_limits(limits=1, user_api="openmp"):
            assert pygpfast.get_num_threads() == 1
