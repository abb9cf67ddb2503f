"""Label noise (Kim & Ghahramani 2008) against the plain probit on the Rätsch sets.

``SVGPClassifier(label_noise=eps)`` (``--estimator ivm``: ``IVMClassifier(label_noise=eps)``,
fixed eps only) with every other setting at its default, on the first
``--splits`` published realisations of each Rätsch set (../shared/data), for each eps in
``--eps`` (0 is the plain probit; ``learn``: epsilon learned with the hyperparameters under
its default prior). Reported: the median hold-out negative log predictive probability and
accuracy per set and eps (and for ``learn`` the median fitted epsilon), and how many sets each
eps wins, the input to the decision whether label noise is on by default (issue 26). With
``--flip F`` a fraction F of each training part's labels is flipped at random (seed = split;
the test labels stay clean): the mislabelled data the robust likelihood is for.

    python bench/python/label_noise.py [--splits 3] [--eps 0 0.001 0.01 learn] [--sets ringnorm ...]
        [--n-inducing M] [--estimator svgp|ivm] [--flip F]
        (writes bench/results/label_noise[-ivm][-M<M>][-flip<F>].json)
"""

import argparse

import numpy as np

import common
import svgp_common
from svgp_table1 import SETS

from pygpfast import IVMClassifier, SVGPClassifier


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, default=3)
    ap.add_argument("--eps", type=lambda v: v if v == "learn" else float(v), nargs="+",
                    default=[0.0, 1e-3, 1e-2, "learn"])
    ap.add_argument("--sets", nargs="+", default=list(SETS))
    ap.add_argument("--n-inducing", type=int, default=None,
                    help="M (default: the estimator's); 8 is seed 000 Table 1's first column")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--estimator", choices=("svgp", "ivm"), default="svgp")
    ap.add_argument("--flip", type=float, default=0.0,
                    help="fraction of the training labels flipped at random (seed = split)")
    args = ap.parse_args()
    if args.estimator == "ivm" and ("learn" in args.eps or args.n_inducing is not None):
        raise SystemExit("--estimator ivm takes fixed --eps values and no --n-inducing")
    ctx = svgp_common.start(args.threads)
    rows = []
    for name in args.sets:
        X, y, splits, how = svgp_common.load_ratsch(name)
        for eps in args.eps:
            fits = []
            for k, (tr, te) in enumerate(splits[: args.splits]):
                ytr = y[tr].copy()
                if args.flip:
                    flips = np.random.default_rng(k).random(len(ytr)) < args.flip
                    labels = np.unique(y)
                    ytr[flips] = np.where(ytr[flips] == labels[0], labels[1], labels[0])
                if args.estimator == "ivm":
                    clf = IVMClassifier(label_noise=eps, random_state=k)
                else:
                    kw = {} if args.n_inducing is None else {"n_inducing": args.n_inducing}
                    clf = SVGPClassifier(label_noise=eps, random_state=k, **kw)
                seconds, warns = svgp_common.fit(clf, X[tr], ytr)
                fitted = eps if args.estimator == "ivm" else clf.likelihood_.label_noise
                fits.append({"split": k, "fit_s": seconds, "n_warnings": len(warns),
                             "eps_fitted": fitted, **svgp_common.holdout(clf, X[te], y[te])})
            row = {"set": name, "eps": eps, "splits": how, "n_train": len(splits[0][0]),
                   "nlp_median": float(np.median([f["nlp"] for f in fits])),
                   "acc_median": float(np.median([f["acc"] for f in fits])),
                   "fit_s_median": float(np.median([f["fit_s"] for f in fits])),
                   "eps_fitted_median": float(np.median([f["eps_fitted"] for f in fits])), "fits": fits}
            rows.append(row)
            print(f"{name:13s} eps={eps!s:<6} NLP {row['nlp_median']:.4f} acc {row['acc_median']:.4f} "
                  f"fit {row['fit_s_median']:.2f} s eps fitted {row['eps_fitted_median']:.3g}", flush=True)
    wins = {eps: 0 for eps in args.eps}
    for name in args.sets:
        best = min((r for r in rows if r["set"] == name), key=lambda r: r["nlp_median"])
        wins[best["eps"]] += 1
    print("sets won (lowest median NLP):", {str(e): w for e, w in wins.items()})
    parts = ([] if args.estimator == "svgp" else ["ivm"]) + \
        ([] if args.n_inducing is None else [f"M{args.n_inducing}"]) + ([f"flip{args.flip:g}"] if args.flip else [])
    variant = "-".join(parts) or None
    svgp_common.finish(variant, ctx, {"splits": args.splits, "eps": args.eps, "n_inducing": args.n_inducing,
                                      "estimator": args.estimator, "flip": args.flip, "rows": rows,
                                   "wins": {str(e): w for e, w in wins.items()}})


if __name__ == "__main__":
    main()
