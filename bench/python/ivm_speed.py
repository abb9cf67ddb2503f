"""IVMClassifier speed targets on even MNIST digits (C = 5, D = 784, pixels / 255): the seed's
train5 shape (n = 800, d = 150) and n = 4000, d = 400, each fitted with fixed hyperparameters
and with hyperparameter learning (--max-iter L-BFGS-B iterations, default 30, re-selection
every 10; the paper's per-class RBF + constant kernel), and where the time goes: selections (count, seconds), bound
evaluations with gradient (count, seconds), the rest (Python, L-BFGS-B, prediction state).

Usage: python bench/python/ivm_speed.py [--threads 2] [--max-iter 30] [--multi-class joint,ovr]
(writes bench/results/ivm_speed-iter<max-iter>[-joint|-ovr].json; fit CPU (s) is the process's CPU time, all
threads, which a shared machine's load does not inflate as it does the wall time)
"""

import argparse
import time

import numpy as np

import common
from ivm_table1 import load_even_mnist, paper_kernel

import pygpfast
from pygpfast import IVMClassifier
from pygpfast.ivm import _estimators

SHAPES = [(800, 150), (4000, 400)]


def instrument():
    """Wrap _Model.select and _Model.bound with counters."""
    stats = {"select_n": 0, "select_s": 0.0, "bound_n": 0, "bound_s": 0.0}
    select, bound = _estimators._Model.select, _estimators._Model.bound

    def timed_select(self, x):
        t0 = time.perf_counter()
        try:
            return select(self, x)
        finally:
            stats["select_n"] += 1
            stats["select_s"] += time.perf_counter() - t0

    def timed_bound(self, x, sites, *, with_grad):
        t0 = time.perf_counter()
        try:
            return bound(self, x, sites, with_grad=with_grad)
        finally:
            stats["bound_n"] += 1
            stats["bound_s"] += time.perf_counter() - t0

    _estimators._Model.select, _estimators._Model.bound = timed_select, timed_bound
    return stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-iter", type=int, default=30)
    ap.add_argument("--multi-class", default="joint,ovr", help="which of joint, ovr to run")
    args = ap.parse_args()
    pygpfast.set_num_threads(args.threads)
    X, y = load_even_mnist()
    stats = instrument()
    rows = []
    for n, d in SHAPES:
        idx = np.random.default_rng(0).permutation(len(X))[:n]
        for multi_class in args.multi_class.split(","):
            for learn in (False, True):
                for k in stats:
                    stats[k] = 0 if k.endswith("_n") else 0.0
                clf = IVMClassifier(paper_kernel(X[idx]), active_size=d, multi_class=multi_class,
                                    shared_kernel=False, optimize_hyperparameters=learn,
                                    max_iter=args.max_iter, random_state=0)
                t0, c0 = time.perf_counter(), time.process_time()
                clf.fit(X[idx], y[idx])
                total, cpu = time.perf_counter() - t0, time.process_time() - c0
                row = {"n": n, "d": d, "C": 5, "multi_class": multi_class, "learn": learn,
                       "fit (s)": total, "fit CPU (s)": cpu, "iterations": clf.n_iter_ if learn else 0,
                       "selections": stats["select_n"], "selection (s)": stats["select_s"],
                       "bound evaluations": stats["bound_n"], "bounds (s)": stats["bound_s"],
                       "rest (s)": total - stats["select_s"] - stats["bound_s"]}
                rows.append(row)
                print(row, flush=True)
    cols = ["n", "d", "multi_class", "learn", "fit (s)", "fit CPU (s)", "iterations", "selections",
            "selection (s)", "bound evaluations", "bounds (s)", "rest (s)"]
    print(common.table(rows, cols))
    suffix = f"iter{args.max_iter}" + ("" if args.multi_class == "joint,ovr" else f"-{args.multi_class}")
    path = common.write_json({"context": common.context(args.threads), "args": vars(args),
                              "rows": rows}, suffix)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
