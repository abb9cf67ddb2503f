"""IVM selection cost against n and C: time per inclusion and total selection time of the joint
multi-class IVM (seed 002, Algorithm 1; pygpfast._core.ivm.multiclass_select) and of C
one-vs-rest probit IVMs (binary_select), at d = 100 active points (--d) on synthetic data (D = 50,
labels the argmax of a random linear map plus noise), fixed kernel RBF(1, sqrt(D)).

Expected laws (ivm-math.md): joint per inclusion O(n C^2 d) (stub update) + O(n / C C^2 d)
scoring + the cubature (3^C nodes for C <= 5, 2 C^2 + 1 above); one-vs-rest O(n d) per
inclusion and class. The fitted slopes of log(time) on log(n) are printed.

Writes bench/results/ivm_scaling.json and bench/figures/ivm_scaling.png (matplotlib).

Usage: python bench/python/ivm_scaling.py [--quick] [--threads 2]
"""

import argparse
import time
from pathlib import Path

import numpy as np

import common

import pygpfast
from pygpfast import _core, kernels

FIGURES = Path(__file__).resolve().parents[1] / "figures"


def data(n, C, D=50, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    y = np.argmax(X @ rng.normal(size=(D, C)) + 0.5 * rng.normal(size=(n, C)), axis=1)
    return np.ascontiguousarray(X), y.astype(np.float64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--d", type=int, default=100)
    args = ap.parse_args()
    pygpfast.set_num_threads(args.threads)
    ns = [500, 1000] if args.quick else [1000, 2000, 4000]
    Cs = [3, 5] if args.quick else [3, 5, 10]
    d = 100 if args.quick else args.d
    codes, params = kernels.RBF(variance=1.0, lengthscale=np.sqrt(50.0))._spec(50)
    rows = []
    for C in Cs:
        rule = 0 if C <= 5 else 1
        for n in ns:
            X, y = data(n, C)
            t0 = time.perf_counter()
            s = _core.ivm.multiclass_select(codes, params, X, y, num_classes=C, active_size=d,
                                            seed=1, rule=rule)
            joint = time.perf_counter() - t0
            t0 = time.perf_counter()
            for c in range(C):
                _core.ivm.binary_select(codes, params, X, np.where(y == c, 1.0, -1.0),
                                        active_size=d, seed=1 + c)
            ovr = time.perf_counter() - t0
            row = {"C": C, "n": n, "d": d, "rule": ["gauss-hermite", "stroud"][rule],
                   "joint total (s)": joint, "joint per inclusion (ms)": 1e3 * joint / d,
                   "joint score (s)": float(np.sum(s["score_seconds"])),
                   "joint update (s)": float(np.sum(s["update_seconds"])),
                   "quadrature fallbacks": int(s["quadrature_fallbacks"]),
                   "ovr total (s)": ovr, "ovr per inclusion and class (ms)": 1e3 * ovr / (d * C)}
            rows.append(row)
            print(row, flush=True)
    slopes = []
    for C in Cs:
        sel = [r for r in rows if r["C"] == C]
        ln = np.log([r["n"] for r in sel])
        slopes.append({"C": C,
                       "joint slope in n": float(np.polyfit(ln, np.log([r["joint total (s)"]
                                                                       for r in sel]), 1)[0]),
                       "ovr slope in n": float(np.polyfit(ln, np.log([r["ovr total (s)"]
                                                                     for r in sel]), 1)[0])})
    cols = ["C", "n", "d", "rule", "joint total (s)", "joint per inclusion (ms)",
            "joint score (s)", "joint update (s)", "quadrature fallbacks", "ovr total (s)",
            "ovr per inclusion and class (ms)"]
    print(common.table(rows, cols))
    print(common.table(slopes, ["C", "joint slope in n", "ovr slope in n"]))
    path = common.write_json({"context": common.context(args.threads), "args": vars(args),
                              "rows": rows, "slopes": slopes}, "quick" if args.quick else None)
    print(f"wrote {path}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for C in Cs:
        sel = [r for r in rows if r["C"] == C]
        n = [r["n"] for r in sel]
        ax[0].loglog(n, [r["joint per inclusion (ms)"] for r in sel], "o-", label=f"joint C={C}")
        ax[0].loglog(n, [1e3 * r["ovr total (s)"] / d for r in sel], "s--", label=f"ovr C={C}")
    ax[0].set_xlabel("n")
    ax[0].set_ylabel("time per inclusion (ms)")
    ax[0].set_title(f"IVM selection, d = {d}")
    ax[0].legend(fontsize=7)
    for n in ns:
        sel = [r for r in rows if r["n"] == n]
        ax[1].plot([r["C"] for r in sel], [r["joint total (s)"] for r in sel], "o-",
                   label=f"joint n={n}")
    ax[1].set_xlabel("C")
    ax[1].set_ylabel("selection time (s)")
    ax[1].set_yscale("log")
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    FIGURES.mkdir(parents=True, exist_ok=True)
    figure = FIGURES / ("ivm_scaling" + ("-quick" if args.quick else "") + ".png")
    fig.savefig(figure, dpi=100)
    print(f"wrote {figure}")


if __name__ == "__main__":
    main()
