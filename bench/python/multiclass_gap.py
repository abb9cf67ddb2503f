"""Issue 26's ten-class gap: SVGPClassifier against GPflow's SVGP on scikit-learn's digits.

The issue: GPflow's SVGP (robust-max likelihood, M = 100) reaches hold-out NLPD 0.08 on digits
where ``SVGPClassifier(n_inducing=100)`` (softmax) reaches 0.11. This runs, on the peers' split
(load_digits, X / 16, train_test_split(test_size=0.3, random_state=0): 1257 / 540;
shared/peers/gpc_full.py):

* pygpfast: ``SVGPClassifier(n_inducing=M, likelihood=..., random_state=0)`` at its defaults
  (ARD RBF from the data's scale, k-means Z, default priors, L-BFGS-B), for each likelihood in
  ``--likelihoods`` (softmax, robustmax);
* GPflow (``--peers-python``, the peers' venv): multiclass_gap_gpflow.py's configurations, by
  default robust-max and softmax with the same kernel, Z and optimiser (L-BFGS-B, maxiter 1000);

and, for the question whether robust-max should be the default for C > 2, the same pygpfast
fits on the other multi-class sets in shared/data: UCI glass (214 rows, 6 classes, z-scored,
``--glass-splits`` stratified 2/3 - 1/3 splits) and USPS-10 (the first ``--usps-n`` training
images, the whole 2007-image test set).

Reported per fit: hold-out NLPD (mean -log p(y* | x*), log space) and accuracy, fit time,
iterations and warnings.

Usage:
  python bench/python/multiclass_gap.py [--sets digits,glass,usps] [--likelihoods softmax,robustmax]
      [--M 100] [--peers-python VENV/bin/python] [--gpflow-configs ...] [--threads 1]
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import StratifiedShuffleSplit, train_test_split

import common
import svgp_common

from pygpfast import SVGPClassifier

ISSUE_26 = {"gpflow_robustmax_nlpd": 0.08, "pygpfast_softmax_nlpd": 0.11}


def digits():
    d = load_digits()
    Xtr, Xte, ytr, yte = train_test_split(d.data / 16.0, d.target, test_size=0.3, random_state=0)
    return [(Xtr, ytr, Xte, yte)]


def glass(n_splits):
    d = np.load(common.data_dir() / "uci_glass.npz")
    X, y = np.asarray(d["X"], dtype=np.float64), np.asarray(d["y"])
    X = (X - X.mean(0)) / X.std(0)
    splits = StratifiedShuffleSplit(n_splits=n_splits, test_size=1 / 3, random_state=0).split(X, y)
    return [(X[tr], y[tr], X[te], y[te]) for tr, te in splits]


def usps(n):
    d = np.load(common.data_dir() / "usps_full.npz")
    return [(np.asarray(d["X_train"][:n], dtype=np.float64), np.asarray(d["y_train"][:n]),
             np.asarray(d["X_test"], dtype=np.float64), np.asarray(d["y_test"]))]


def run_pygpfast(name, splits, likelihood, M):
    rows = []
    for k, (Xtr, ytr, Xte, yte) in enumerate(splits):
        clf = SVGPClassifier(n_inducing=M, likelihood=likelihood, random_state=0)
        seconds, warns = svgp_common.fit(clf, Xtr, ytr)
        score = svgp_common.holdout(clf, Xte, yte)
        rows.append({"set": name, "split": k, "peer": "pygpfast", "likelihood": likelihood, "M": M,
                     "n_train": len(ytr), "n_test": len(yte), "fit_s": seconds, "n_iter": int(clf.n_iter_),
                     "objective_per_row": float(clf.objective_) / len(ytr), "warnings": warns,
                     "lengthscale_median": float(np.median(clf.kernel_.lengthscale)), **score})
        print(f"{name}[{k}] pygpfast {likelihood}: NLPD {score['nlp']:.4f} acc {score['acc']:.4f} "
              f"fit {seconds:.1f} s, {clf.n_iter_} it, {len(warns)} warnings", flush=True)
    return rows


def run_gpflow(peers_python, configs, M, maxiter):
    script = Path(__file__).with_name("multiclass_gap_gpflow.py")
    out = subprocess.run([peers_python, str(script), "--configs", configs, "--M", str(M), "--maxiter", str(maxiter)],
                         check=True, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=""))
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    for r in rows:
        print(f"digits gpflow {r['config']}: NLPD {r['nlpd']:.4f} acc {r['acc']:.4f} fit {r['fit_s']:.1f} s, "
              f"{r['nit']} it ({r['message']})", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="digits,glass,usps")
    ap.add_argument("--likelihoods", default="softmax,robustmax")
    ap.add_argument("--M", type=int, default=100)
    ap.add_argument("--glass-splits", type=int, default=5)
    ap.add_argument("--usps-n", type=int, default=1500)
    ap.add_argument("--peers-python", default=None)
    ap.add_argument("--gpflow-configs", default="robustmax:iso:kmeans,softmax:iso:kmeans")
    ap.add_argument("--gpflow-maxiter", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variant", default=None, help="suffix of the JSON's name")
    args = ap.parse_args()
    ctx = svgp_common.start(args.threads)
    loaders = {"digits": digits, "glass": lambda: glass(args.glass_splits), "usps": lambda: usps(args.usps_n)}
    rows = []
    for name in args.sets.split(","):
        splits = loaders[name]()
        for likelihood in args.likelihoods.split(","):
            rows += run_pygpfast(name, splits, likelihood, args.M)
    if args.peers_python:
        rows += [{"set": "digits", **r} for r in run_gpflow(args.peers_python, args.gpflow_configs, args.M,
                                                             args.gpflow_maxiter)]
    summary = {}
    for r in rows:
        key = f"{r['set']} {r['peer']} {r.get('likelihood') or r.get('config')}"
        summary.setdefault(key, []).append((r.get("nlp", r.get("nlpd")), r["acc"]))
    summary = {k: {"nlpd_mean": float(np.mean([v[0] for v in vals])), "acc_mean": float(np.mean([v[1] for v in vals])),
                   "n_splits": len(vals)} for k, vals in summary.items()}
    for k, v in summary.items():
        print(f"{k:40s} NLPD {v['nlpd_mean']:.4f} acc {v['acc_mean']:.4f} ({v['n_splits']} splits)")
    svgp_common.finish(args.variant, ctx, {"args": vars(args), "issue_26": ISSUE_26, "summary": summary, "rows": rows})


if __name__ == "__main__":
    sys.exit(main())
