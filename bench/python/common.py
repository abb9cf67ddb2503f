"""Shared benchmark utilities: machine context, timing, background load, JSON output.

Every script that produces a table writes it with ``write_json(payload, variant)`` to
``bench/results/<script-name>[-<variant>].json`` (tracked by git), with ``context``: CPU, cores,
threads, BLAS (threadpoolctl), versions, git commit, date and the load average at start and end."""

import contextlib
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# PYGPFAST_BENCH_RESULTS: another folder, for smoke runs that must not replace the committed JSON.
RESULTS = Path(os.environ.get("PYGPFAST_BENCH_RESULTS") or Path(__file__).resolve().parents[1] / "results")
REPO = Path(__file__).resolve().parents[2]

# When the script started (common is imported first thing) and the load then.
_STARTED = time.strftime("%Y-%m-%d %H:%M:%S")
_LOADAVG_START = os.getloadavg()


def data_dir():
    """The shared data folder: ``$PYGPFAST_SHARED_DATA``, else ``shared/data`` beside the
    repository root or beside one of its parents (a git worktree under another folder), or exit."""
    if os.environ.get("PYGPFAST_SHARED_DATA"):
        path = Path(os.environ["PYGPFAST_SHARED_DATA"])
    else:
        candidates = [p / "shared" / "data" for p in REPO.parents]
        path = next((p for p in candidates if p.is_dir()), candidates[0])
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


def git_commit():
    """The repository's HEAD commit and the tracked files with uncommitted changes."""
    def git(*args):
        try:
            return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                                  timeout=10).stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD") or "unknown",
            "modified": [line[3:] for line in status.splitlines()]}


_GIT_START = git_commit()  # the code that runs is the one at the start


def context(threads):
    """What a result depends on: CPU, cores, threads, BLAS, versions, commit, date, load.

    ``loadavg_start`` is the load when the script started, ``loadavg`` the load now;
    ``write_json`` adds ``loadavg_end``."""
    import scipy

    import pygpfast

    return {
        "script": "bench/python/" + Path(sys.argv[0]).name,
        "argv": sys.argv[1:],
        "git": _GIT_START,
        "started": _STARTED,
        "loadavg_start": _LOADAVG_START,
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


def result_path(variant=None):
    """``bench/results/<script-name>[-<variant>].json``: one stable name per script and variant,
    overwritten by a re-run."""
    return RESULTS / (Path(sys.argv[0]).stem + (f"-{variant}" if variant else "") + ".json")


def write_json(payload, variant=None, threads=None):
    """Write ``payload`` to ``result_path(variant)`` with the machine context under ``"context"``
    (``context(threads)`` if the payload has none), completed by the load and time at the end."""
    import pygpfast

    ctx = payload.get("context")
    if ctx is None:
        ctx = context(pygpfast.get_num_threads() if threads is None else threads)
    ctx = dict(ctx, loadavg_end=os.getloadavg(), finished=time.strftime("%Y-%m-%d %H:%M:%S"))
    payload = {"context": ctx, **{k: v for k, v in payload.items() if k != "context"}}
    path = result_path(variant)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=_jsonable))
    return path


def _jsonable(v):
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, Path):
        return str(v)
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


def table(rows, columns):
    """A markdown table from a list of dicts."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}"
        return str(v)

    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    out += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(out)
