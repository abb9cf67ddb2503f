"""Seed 000 (Hensman, Matthews & Ghahramani 2015), the MNIST experiment, on USPS.

The paper fits odd-vs-even MNIST (60000 points) with M = 200 inducing points by stochastic
optimisation (ADADELTA, step-rate 0.1, minibatches of 10) and reports hold-out accuracy 97.8%
and mean negative log probability 0.069. shared/data has only the MNIST test set, so this runs
the same experiment on USPS (standard split: 7291 training, 2007 test images of 16x16 pixels
in [0, 1]) with SVGPClassifier's public options: M = 200, k-means initialisation, default ARD
RBF kernel, probit, minibatch Adam (batch 256, step 0.01, a fixed number of steps) by default.

* binary: odd vs even digits (two classes, Bernoulli-probit);
* 10-class: all ten digits (softmax over 10 latent functions sharing Z and the kernel).

Reported: hold-out accuracy and mean negative log predictive probability (NLPD), fit time.

Usage:
  python bench/python/svgp_usps.py [--quick] [--tasks binary,10class] [--optimizer adam|lbfgs]
                                   [--max-iter 10000] [--threads 1]
"""

import argparse

import numpy as np

import common
import svgp_common

from pygpfast import SVGPClassifier

# Seed 000, section 5 "Stochastic optimization": odd-vs-even MNIST, M = 200.
PAPER_MNIST = {"acc": 0.978, "nlp": 0.069}


def load_usps():
    d = np.load(common.data_dir() / "usps_full.npz")
    return (np.asarray(d["X_train"], dtype=np.float64), np.asarray(d["y_train"], dtype=np.int64),
            np.asarray(d["X_test"], dtype=np.float64), np.asarray(d["y_test"], dtype=np.int64))


def run(task, args, data):
    Xtr, ytr, Xte, yte = data
    if task == "binary":
        ytr, yte = np.where(ytr % 2, "odd", "even"), np.where(yte % 2, "odd", "even")
    clf = SVGPClassifier(n_inducing=args.M, optimizer=args.optimizer, max_iter=args.max_iter,
                         tol=0.0, random_state=0)
    row = {"task": task, "n_train": len(ytr), "n_test": len(yte), "classes": len(np.unique(ytr)),
           "M": args.M, "optimizer": args.optimizer, "max_iter": args.max_iter}
    seconds, warns = svgp_common.fit(clf, Xtr, ytr)
    score = svgp_common.holdout(clf, Xte, yte)
    print(f"{task}: acc {score['acc']:.4f} NLPD {score['nlp']:.4f} fit {seconds:.1f} s, "
          f"{clf.n_iter_} it, warnings {len(warns)}", flush=True)
    return {**row, "fit_s": seconds, "n_iter": int(clf.n_iter_), "warnings": warns,
            "elbo_history": clf.history_, **score}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="binary,10class")
    ap.add_argument("--M", type=int, default=200)
    ap.add_argument("--optimizer", default="adam", choices=("adam", "lbfgs"))
    ap.add_argument("--max-iter", type=int, default=10000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="first 1000 training images, M = 20, 200 steps")
    args = ap.parse_args()
    if args.quick:
        args.M, args.max_iter = 20, 200
    ctx = svgp_common.start(args.threads)
    Xtr, ytr, Xte, yte = load_usps()
    if args.quick:
        Xtr, ytr = Xtr[:1000], ytr[:1000]
    rows = [run(task, args, (Xtr, ytr, Xte, yte)) for task in args.tasks.split(",")]
    cols = ["task", "classes", "n_train", "M", "optimizer", "max_iter", "acc", "nlp", "fit_s"]
    txt = common.table(rows, cols)
    print(f"\nUSPS (paper, odd-vs-even MNIST: acc {PAPER_MNIST['acc']}, NLPD {PAPER_MNIST['nlp']})\n")
    print(txt)
    name = "-".join(v for v, on in (("lbfgs", args.optimizer == "lbfgs"), (args.tasks, args.tasks != "binary,10class"),
                                    (f"maxiter{args.max_iter}", args.max_iter != 10000 and not args.quick),
                                    (f"t{args.threads}", args.threads != 1), ("quick", args.quick)) if on) or None
    svgp_common.finish(name, ctx,
                       {"settings": vars(args), "paper_mnist": PAPER_MNIST, "rows": rows, "table": txt})


if __name__ == "__main__":
    main()
