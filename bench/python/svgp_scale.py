"""SVGPClassifier on a 1 000 000-row synthetic binary problem streamed from a np.memmap.

Data: N rows (default 10^6) + 10 000 test rows, D = 8, x ~ N(0, I); the first four inputs
carry the peers' latent function (shared/peers/svgp_fit.py), p(y = 1 | x) = Phi(2.5 g(x)),
g(x) = sin(2 x0) + cos(1.5 x1) x2 - 0.5 x3^2 + 0.4; the other four are noise. X is written
to a float64 .npy file in a temporary directory and opened with mmap_mode="r", so the fit
reads it a buffer at a time. The estimator runs with its defaults (optimizer 'auto' =
natural gradients + Adam, M = 100, B = 256) and verbose=1, which prints rows/s per epoch.

Reports: wall time of fit (initialisation included), epochs, steps/s, rows/s, hold-out
accuracy and NLPD, the peak of numpy's traced allocations during the fit (tracemalloc) and the
process's peak RSS, against the size of X.

Usage:
  python bench/python/svgp_scale.py [--n 1000000] [--threads 1] [--max-iter 20]
"""

import argparse
import os
import resource
import sys
import tempfile
import time
import tracemalloc

import numpy as np
from scipy.stats import norm

import common

import pygpfast
from pygpfast.svgp import SVGPClassifier

D = 8


def write_data(path, n, seed=0):
    rng = np.random.default_rng(seed)
    X = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, D))
    y = np.empty(n, dtype=np.int8)
    for start in range(0, n, 100_000):
        Xb = rng.standard_normal((min(100_000, n - start), D))
        g = np.sin(2 * Xb[:, 0]) + np.cos(1.5 * Xb[:, 1]) * Xb[:, 2] - 0.5 * Xb[:, 3] ** 2 + 0.4
        X[start : start + len(Xb)] = Xb
        y[start : start + len(Xb)] = rng.random(len(Xb)) < norm.cdf(2.5 * g)
    X.flush()
    del X
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-iter", type=int, default=1000)
    args = ap.parse_args()
    pygpfast.set_num_threads(args.threads)
    ctx = common.context(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "X.npy")
        y = write_data(path, args.n + 10_000)
        X = np.load(path, mmap_mode="r")
        Xtr, ytr, Xte, yte = X[: args.n], y[: args.n], np.asarray(X[args.n :]), y[args.n :].astype(float)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        load0 = os.getloadavg()[0]
        clf = SVGPClassifier(verbose=1, random_state=0, max_iter=args.max_iter)
        tracemalloc.start()
        t0 = time.perf_counter()
        clf.fit(Xtr, ytr)
        fit_s = time.perf_counter() - t0
        traced_peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        p = np.clip(clf.predict_proba(Xte)[:, 1], 1e-12, 1 - 1e-12)
    row = {
        "N": args.n, "D": D, "X_MiB": args.n * D * 8 / 2**20, "fit_s": fit_s, "epochs": clf.n_iter_,
        "steps": clf.n_steps_, "steps_per_s": clf.n_steps_ / fit_s, "rows_per_s": clf.n_steps_ * 256 / fit_s,
        "acc": float(np.mean((p > 0.5) == (yte > 0.5))),
        "nlpd": float(-np.mean(yte * np.log(p) + (1 - yte) * np.log(1 - p))),
        "traced_peak_MiB": traced_peak, "rss_before_MiB": rss0, "peak_rss_MiB": rss,
        "load": f"{load0:.1f}->{os.getloadavg()[0]:.1f}", "lengthscales": clf.kernel_.lengthscale.round(2).tolist(),
    }
    print(common.table([row], [k for k in row if k != "lengthscales"]))
    print("lengthscales", row["lengthscales"], file=sys.stderr)
    common.write_json({"context": ctx, "result": row}, f"n{args.n}-maxiter{args.max_iter}")


if __name__ == "__main__":
    main()
