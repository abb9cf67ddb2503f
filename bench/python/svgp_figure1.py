"""Seed 000 (Hensman, Matthews & Ghahramani 2015), Figure 1: banana with M = 4 ... 64.

Rows: method 'kl' and method 'mf' of SVGPClassifier; columns: M = 4, 8, 16, 32, 64 inducing
points (k-means initialisation, full-batch L-BFGS-B, default ARD RBF kernel, probit). Each pane
shows the training points coloured by class, the learned inducing inputs as black dots and the
decision boundary p(y=+1|x) = 0.5 as a black line; the title gives the hold-out NLP and error.
The paper does not say which banana points it trained on: this uses the first published
realisation (400 training points, 4900 for testing), or with --all every one of the 5300 points
(then nothing is held out and the score is on the training set).

Usage:
  python bench/python/svgp_figure1.py [--quick] [--all] [--threads 1]
"""

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import svgp_common  # noqa: E402

from pygpfast import SVGPClassifier  # noqa: E402

MS = (4, 8, 16, 32, 64)
METHODS = ("kl", "mf")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="train on all 5300 points")
    ap.add_argument("--max-iter", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="M = 4, 16 and 200 iterations")
    args = ap.parse_args()
    Ms = (4, 16) if args.quick else MS
    if args.quick:
        args.max_iter = 200
    ctx = svgp_common.start(args.threads)
    X, y, splits, how = svgp_common.load_ratsch("banana")
    tr, te = (np.arange(len(y)), np.arange(len(y))) if args.all else splits[0]
    Xtr, ytr = X[tr], y[tr]

    lo, hi = X.min(axis=0) - 0.3, X.max(axis=0) + 0.3
    g0, g1 = np.meshgrid(np.linspace(lo[0], hi[0], 200), np.linspace(lo[1], hi[1], 200))
    grid = np.column_stack([g0.ravel(), g1.ravel()])

    fig, axes = plt.subplots(len(METHODS), len(Ms), figsize=(3.0 * len(Ms), 3.1 * len(METHODS)),
                             sharex=True, sharey=True, squeeze=False)
    runs = []
    for i, method in enumerate(METHODS):
        for j, M in enumerate(Ms):
            clf = SVGPClassifier(n_inducing=M, method=method, optimizer="lbfgs",
                                 max_iter=args.max_iter, random_state=0)
            seconds, warns = svgp_common.fit(clf, Xtr, ytr)
            score = svgp_common.holdout(clf, X[te], y[te])
            runs.append({"method": method, "M": M, "fit_s": seconds, "n_iter": int(clf.n_iter_),
                         "warnings": warns, "Z": clf.inducing_points_.tolist(), **score})
            print(f"{method} M={M:2d}: NLP {score['nlp']:.3f} acc {score['acc']:.3f} "
                  f"fit {seconds:.2f} s, {clf.n_iter_} it, warnings {len(warns)}", flush=True)
            ax = axes[i, j]
            ax.scatter(Xtr[:, 0], Xtr[:, 1], c=np.where(ytr > 0, "tab:orange", "tab:blue"),
                       s=4 if args.all else 8, alpha=0.6, linewidths=0)
            p1 = clf.predict_proba(grid)[:, 1].reshape(g0.shape)
            ax.contour(g0, g1, p1, levels=[0.5], colors="k", linewidths=1.5)
            Z = clf.inducing_points_
            ax.plot(Z[:, 0], Z[:, 1], "o", color="k", ms=4)
            ax.set_xlim(lo[0], hi[0])
            ax.set_ylim(lo[1], hi[1])
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"{method.upper()} M={M}\nNLP {score['nlp']:.3f}, err {1 - score['acc']:.3f}",
                         fontsize=9)
    source = "all points" if args.all else "first published realisation"
    scored = "the training set" if args.all else f"{len(te)} held-out points"
    fig.suptitle(f"banana, {len(tr)} training points ({source}); scores on {scored}", fontsize=10)
    name = "svgp_figure1" + ("_all" if args.all else "") + ("_quick" if args.quick else "")
    variant = "-".join(v for v, on in (("all", args.all), ("quick", args.quick)) if on)
    svgp_common.save_figure(fig, name, args.quick)
    svgp_common.finish(variant, ctx, {"settings": vars(args), "n_train": len(tr), "n_test": len(te),
                                   "splits": how, "runs": runs})


if __name__ == "__main__":
    main()
