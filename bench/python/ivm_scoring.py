"""Where the joint IVM's selection spends its CPU time (seed 002, Algorithm 1;
pygpfast._core.ivm.multiclass_select): the scoring of the selection index J (each candidate's
marginal from the stub buffers, then its tilted moments by cubature) against the stub-buffer
update, and the cubature alone per point (multiclass_tilted on the selection's final marginals).
Synthetic data (D = 50) as ivm_scaling.py, fixed RBF(1, sqrt(D)), one thread; CPU times by
time.process_time (a shared machine's load inflates wall times, not these), the score/update
split from the core's per-inclusion wall timers scaled to the CPU total.

Writes bench/results/ivm_scoring[-<label>].json.

Usage: python bench/python/ivm_scoring.py [--label before|after]
"""

import argparse
import time

import numpy as np

import common
from ivm_scaling import data

import pygpfast
from pygpfast import _core, kernels

SHAPES = [(800, 150, 5, 0), (4000, 400, 5, 0), (1000, 100, 10, 1)]  # n, d, C, rule


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default=None)
    args = ap.parse_args()
    pygpfast.set_num_threads(1)
    codes, params = kernels.RBF(variance=1.0, lengthscale=np.sqrt(50.0))._spec(50)
    rows = []
    for n, d, C, rule in SHAPES:
        X, y = data(n, C)
        c0, w0 = time.process_time(), time.perf_counter()
        s = _core.ivm.multiclass_select(codes, params, X, y, num_classes=C, active_size=d, seed=1,
                                        rule=rule)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        score, update = float(np.sum(s["score_seconds"])), float(np.sum(s["update_seconds"]))
        candidates = ((n + C - 1) // C) * (d - 2)
        m = min(n, 2000)
        reps = max(1, candidates // (4 * m))
        c1 = time.process_time()
        for _ in range(reps):
            _core.ivm.multiclass_tilted(s["h"][:m], s["A"][:m], y[:m], rule=rule)
        tilted = (time.process_time() - c1) / (reps * m)
        row = {"n": n, "d": d, "C": C, "rule": ["gauss-hermite", "stroud"][rule],
               "selection CPU (s)": cpu, "score CPU (s)": cpu * score / wall,
               "update CPU (s)": cpu * update / wall, "candidates scored": candidates,
               "per candidate CPU (us)": 1e6 * cpu * score / wall / candidates,
               "cubature per point CPU (us)": 1e6 * tilted}
        rows.append(row)
        print(row, flush=True)
    cols = ["n", "d", "C", "rule", "selection CPU (s)", "score CPU (s)", "update CPU (s)",
            "per candidate CPU (us)", "cubature per point CPU (us)"]
    print(common.table(rows, cols))
    print("wrote", common.write_json({"context": common.context(1), "args": vars(args), "rows": rows},
                                     args.label))


if __name__ == "__main__":
    main()
