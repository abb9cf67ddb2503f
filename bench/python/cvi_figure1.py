"""Seed 004's Figure 1 and flops table, re-run: Algorithm 1 against Opper-Archambeau.

For UCI ionosphere (binary, Bernoulli-logit with the 20-piece quadratic bound) and UCI glass
(6 classes, stick-breaking as in the seed's Figure 1(b); ``--glass-likelihood softmax`` for
the log-sum-exp bound), 80/20 split (fixed permutation, features z-scored on the training part),
kernel sigma^2 exp(-|x - x'|^2 / (2 s)) at {log s, log sigma} in {-1, 1, 3}^2, both methods
maximise the same bound for fixed hyperparameters from the same start (alpha = lambda = 0):

* fixed point: Algorithm 1 with the literal rank-one updates (block_size=1, BLAS 2), run to a
  relative tolerance of 1e-12, twice: as the seed writes it (``coupled_means=False``) and as
  pygpfast runs it, with coupled mean steps (csrc/include/pygpfast/cvi/cvi.hpp);
* Opper-Archambeau: L-BFGS-B over (alpha, lambda >= 0) on eq. (11), to ftol 1e-13 or
  ``--oa-max-iter`` iterations.

Flops are counted, not sampled: the core adds the exact operation count of every BLAS/LAPACK call
and O(N^2) pass (GEMM 2mnk, SYRK/SYR n^2 k, POTRF n^3/3, TRSM/TRSV n^2 k, SYMV 2n^2, ...) and
counts local-bound evaluations, which are charged FLOPS_PER_EVAL below (one erfc and one exp,
~20 flops each, plus ~20 of arithmetic, per piece; 20 per class for the log-sum-exp bound).
L-BFGS-B's own work is charged 50 flops per variable and iteration. Wall times come from the same
runs (fixed point: the core's clock; Opper-Archambeau: around each L-BFGS-B iteration, Python
included, which is how it runs). The seed's table counts flops "until successive increase in the
objective function is below 1e-3"; the table also gives the flops to reach the final optimum to
1e-6 (relative), which does not reward an optimiser for stalling.

Usage: python bench/python/cvi_figure1.py [--data ionosphere,glass] [--oa-max-iter 5000]
       [--threads 1] [--glass-likelihood stick-breaking|softmax] [--replot]
Writes bench/results/cvi_figure1-<data>.json and bench/figures/cvi_figure1_<data>.png (<data>:
ionosphere, glass, or glass_softmax).
"""

import argparse
import time
from pathlib import Path

import numpy as np

import common

from pygpfast import cvi
from pygpfast.kernels import RBF

FIGURES = Path(__file__).resolve().parents[1] / "figures"
GRID = (-1.0, 1.0, 3.0)
PIECES = 20
PAPER_TOL = 1e-3   # the seed's convergence criterion (absolute increase of the bound)
OPTIMUM_RTOL = 1e-6


def flops_per_eval(lb):
    return 20.0 * lb.n_classes if lb.likelihood == "softmax" else 60.0 * PIECES


def load(name, glass_likelihood):
    d = np.load(common.data_dir() / f"uci_{name}.npz")
    X, y = d["X"].astype(np.float64), d["y"]
    if name == "ionosphere":
        y = (y > 0).astype(np.float64)
        lb = cvi.LocalBound("logit", n_pieces=PIECES)
    else:
        y = y.astype(np.float64)
        lb = cvi.LocalBound(glass_likelihood, n_pieces=PIECES, n_classes=6)
    idx = np.random.RandomState(0).permutation(len(y))
    tr = idx[: int(0.8 * len(y))]
    Xtr = X[tr][:, X[tr].std(0) > 0]
    Xtr = (Xtr - Xtr.mean(0)) / Xtr.std(0)
    return np.ascontiguousarray(Xtr), np.ascontiguousarray(y[tr]), lb


def first_index(values, condition):
    hits = np.flatnonzero(condition(values))
    return int(hits[0]) if hits.size else None


def summarise(history, c_eval, best):
    """Per-iteration arrays and the points where the paper's criterion and the optimum are met."""
    bound = history[:, 0]
    flops = history[:, 1] + c_eval * history[:, 2]
    seconds = history[:, 3]
    inc = np.diff(bound)
    k_paper = first_index(inc, lambda d: d < PAPER_TOL)
    k_paper = len(bound) - 1 if k_paper is None else k_paper + 1
    k_opt = first_index(bound, lambda b: b >= best - OPTIMUM_RTOL * abs(best))
    return {"bound": bound.tolist(), "flops": flops.tolist(), "seconds": seconds.tolist(),
            "iters_paper": k_paper, "flops_paper": float(flops[k_paper]),
            "seconds_paper": float(seconds[k_paper]),
            "iters_opt": k_opt, "flops_opt": None if k_opt is None else float(flops[k_opt]),
            "seconds_opt": None if k_opt is None else float(seconds[k_opt]),
            "final": float(bound[-1])}


def run_setting(X, y, lb, log_s, log_sigma, oa_max_iter):
    kernel = RBF(variance=np.exp(2 * log_sigma), lengthscale=np.exp(0.5 * log_s))
    Sigma = kernel(X)
    c_eval = flops_per_eval(lb)
    # the fixed-point method as pygpfast runs it (coupled mean steps, cvi.hpp) and the seed's
    # Algorithm 1 as written
    fp = cvi.infer(Sigma, y, lb, method="fixed-point", tol=1e-12, max_iter=500, block_size=1)
    alg1 = cvi.infer(Sigma, y, lb, method="fixed-point", tol=1e-12, max_iter=500, block_size=1,
                     coupled_means=False)
    t0 = time.perf_counter()
    oa = cvi.infer(Sigma, y, lb, method="opper-archambeau", tol=1e-13, max_iter=oa_max_iter)
    oa_wall = time.perf_counter() - t0
    best = max(fp.bound, alg1.bound, oa.bound)
    row = {"log_s": log_s, "log_sigma": log_sigma,
           "fp": summarise(fp.history, c_eval, best), "oa": summarise(oa.history, c_eval, best),
           "alg1": summarise(alg1.history, c_eval, best),
           "fp_converged": bool(fp.converged), "oa_message": oa.info.get("message"),
           "oa_wall_s": oa_wall, "rel_diff": (fp.bound - oa.bound) / abs(fp.bound),
           "fp_info": {k: v for k, v in fp.info.items() if k != "history"}}
    for key in ("paper", "opt"):
        f_fp, f_oa = row["fp"][f"flops_{key}"], row["oa"][f"flops_{key}"]
        t_fp, t_oa = row["fp"][f"seconds_{key}"], row["oa"][f"seconds_{key}"]
        row[f"flops_ratio_{key}"] = None if (f_fp is None or f_oa is None) else f_oa / f_fp
        row[f"time_ratio_{key}"] = None if (t_fp is None or t_oa is None) else t_oa / max(t_fp, 1e-9)
    return row


def fmt_flops(f):
    if f is None:
        return "not reached"
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if f >= scale:
            return f"{f / scale:.3g}{unit}"
    return f"{f:.3g}"


def plot(name, rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 3, figsize=(12, 10))
    for ax, r in zip(axes.ravel(), rows):
        for key, style, color, label in (
                ("alg1", "^-", "C1", "fixed point (Alg. 1 as in the seed)"),
                ("fp", "o-", "C0", "fixed point, coupled mean steps"),
                ("oa", "s-", "k", "Opper-Archambeau, L-BFGS")):
            f = np.maximum(np.array(r[key]["flops"]), 1.0)
            b = -np.array(r[key]["bound"])
            n = len(b)
            # the seed's markers (iterations 1, 2, 4, 50) and then 100, 200, 400, ... (every 50
            # would black out the 10^4 L-BFGS iterations)
            marks = [i for i in range(n) if i in (1, 2, 4, 50) or (i >= 100 and (i // 100) & (i // 100 - 1) == 0 and i % 100 == 0)]
            ax.plot(f, b, style[-1], color=color, lw=1, label=label)
            ax.plot(f[marks], b[marks], style[0], color=color, ms=4)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"log s = {r['log_s']:g}, log sigma = {r['log_sigma']:g}", fontsize=9)
        ax.set_xlabel("flops")
        ax.set_ylabel("- lower bound")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"{name}: negative lower bound against flops (markers at iterations 1, 2, 4, "
                 "50, 100, 200, 400, ...)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="ionosphere,glass")
    ap.add_argument("--oa-max-iter", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--glass-likelihood", default="stick-breaking",
                    choices=["stick-breaking", "softmax"])
    ap.add_argument("--replot", action="store_true",
                    help="redraw the PNGs from bench/results/cvi_figure1-*.json")
    args = ap.parse_args()
    if args.replot:
        import json

        for path in sorted(common.RESULTS.glob("cvi_figure1-*.json")):
            res = json.loads(path.read_text())
            plot(res["label"], res["rows"], FIGURES / Path(res["png"]).name)
        return
    from threadpoolctl import threadpool_limits

    import pygpfast

    pygpfast.set_num_threads(args.threads)
    with threadpool_limits(args.threads, user_api="blas"):
        for name in args.data.split(","):
            if not (common.data_dir() / f"uci_{name}.npz").exists():
                print(f"skipping {name}: uci_{name}.npz not in {common.data_dir()}")
                continue
            X, y, lb = load(name, args.glass_likelihood)
            rows = []
            for log_s in GRID:
                for log_sigma in GRID:
                    r = run_setting(X, y, lb, log_s, log_sigma, args.oa_max_iter)
                    rows.append(r)
                    print(f"{name} log s={log_s:g} log sigma={log_sigma:g}: bound fp "
                          f"{r['fp']['final']:.8f} oa {r['oa']['final']:.8f} rel {r['rel_diff']:.1e}"
                          f"; fp iters(1e-3) {r['fp']['iters_paper']}, flops fp/oa "
                          f"{fmt_flops(r['fp']['flops_opt'])}/{fmt_flops(r['oa']['flops_opt'])}",
                          flush=True)
            label = f"{name} ({lb.likelihood}, N={len(y)}, D={X.shape[1]})"
            tag = name if lb.likelihood in ("logit", "stick-breaking") else f"{name}_{lb.likelihood}"
            png = FIGURES / f"cvi_figure1_{tag}.png"
            plot(label, rows, png)
            print(table(label, rows))
            out = {"context": common.context(args.threads), "label": label, "rows": rows,
                   "png": str(png)}
            print("wrote", common.write_json(out, tag))


def table(label, rows):
    lines = [f"\n{label}\n",
             "| log s | log sigma | final bound FP | rel. diff OA | FP iters (1e-3): Alg. 1 / "
             "coupled | FP iters (optimum): Alg. 1 / coupled | flops Alg. 1 / coupled / OA "
             "(optimum) | flops ratio OA / coupled | time coupled / OA (optimum) | time ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def s(x):
            return "n/a" if x is None else f"{x:.3g}"
        fp, oa, a1 = r["fp"], r["oa"], r["alg1"]
        lines.append(
            f"| {r['log_s']:g} | {r['log_sigma']:g} | {fp['final']:.6f} | {r['rel_diff']:.1e} | "
            f"{a1['iters_paper']} / {fp['iters_paper']} | {a1['iters_opt']} / {fp['iters_opt']} | "
            f"{fmt_flops(a1['flops_opt'])} / {fmt_flops(fp['flops_opt'])} / "
            f"{fmt_flops(oa['flops_opt'])} | {s(r['flops_ratio_opt'])} | "
            f"{s(fp['seconds_opt'])} s / {s(oa['seconds_opt'])} s | {s(r['time_ratio_opt'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
