"""Shared benchmark utilities: machine context, timing, background load, JSON output."""

import contextlib
import json
import multiprocessing as mp
import os
import platform
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parents[1] / "results"


def data_dir():
    """The shared data folder, ``../shared/data`` from the repository root, or exit."""
    here = Path(__file__).resolve()
    path = here.parents[3] / "shared" / "data"
    # (a git worktree, /work/wt/<name>, sits one level deeper than the main checkout)
    for parent in here.parents[3:]:
        if (parent / "shared" / "data").is_dir():
            path = parent / "shared" / "data"
            break
    if not path.is_dir():
        raise SystemExit(f"data not found: {path} (the benchmarks need shared/data)")
    return path


def cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def blas_info():
    from threadpoolctl import threadpool_info

    return [
        {k: p.get(k) for k in ("internal_api", "version", "num_threads", "filepath", "architecture")}
        for p in threadpool_info()
        if p["user_api"] == "blas"
    ]


def context(threads):
    """What a result depends on: CPU, cores, threads, BLAS, versions, load."""
    import scipy

    import pygpfast

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": threads,
        "pygpfast_threads": pygpfast.get_num_threads(),
        "openmp": pygpfast._core.threads.openmp_enabled(),
        "blas": blas_info(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "pygpfast": pygpfast.__version__,
        "python": platform.python_version(),
        "loadavg": os.getloadavg(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def time_calls(fn, *, min_time=0.5, min_calls=5, max_calls=200, warmup=2):
    """Median, p10 and p90 wall time (s) of fn() over repeated calls."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_calls and (len(times) < min_calls or time.perf_counter() - start < min_time):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    t = np.array(times)
    return {"median": float(np.median(t)), "p10": float(np.percentile(t, 10)),
            "p90": float(np.percentile(t, 90)), "calls": len(times)}


def gemm_rate(threads, n=2000):
    """float64 GEMM GFLOP/s of the BLAS numpy uses, at the given thread count (reference)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    A = rng.standard_normal((n, n))
    B = rng.standard_normal((n, n))
    with threadpool_limits(threads, user_api="blas"):
        r = time_calls(lambda: A @ B, min_time=1.0, min_calls=3, warmup=1)
    return 2.0 * n**3 / r["median"] / 1e9


def _spin(stop):
    x = 0
    while not stop.is_set():
        x += 1


@contextlib.contextmanager
def background_load(enabled):
    """Keep one core busy with another process while the block runs (shared-machine test)."""
    if not enabled:
        yield
        return
    stop = mp.Event()
    p = mp.Process(target=_spin, args=(stop,), daemon=True)
    p.start()
    time.sleep(0.2)
    try:
        yield
    finally:
        stop.set()
        p.join(timeout=5)


def run_peers_script(peers_dir, peers_python, script, args):
    """Run one of the peers' drivers (shared/peers/<script>, which runs each backend in its own
    process) from a writable copy, in the peers' Python; returns its results JSON."""
    import shutil
    import subprocess
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="pygpfast-peers-"))
    try:
        shutil.copytree(peers_dir, work / "peers", ignore=shutil.ignore_patterns("results", "__pycache__"))
        cmd = [peers_python, str(work / "peers" / script), *args, "--name", "run"]
        subprocess.run(cmd, check=True, env=dict(os.environ, PYTHONPATH=""), stdout=subprocess.DEVNULL)
        return json.loads((work / "peers" / "results" / "run.json").read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def write_json(name, payload):
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1))
    return path


def table(rows, columns):
    """A markdown table from a list of dicts."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}"
        return str(v)

    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    out += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(out)
