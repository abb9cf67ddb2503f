"""Ten classes with full GPs: pygpfast's VGPClassifier against scikit-learn's
GaussianProcessClassifier on scikit-learn's digits, in one run.

Data: the first 600 images of ``sklearn.datasets.load_digits`` (8 x 8 pixels, D = 64, 10
classes), a stratified 75/25 split (N = 450 training images), features standardised on the
training part (pixels that are constant there are left at 0).

* scikit-learn: one-vs-rest Laplace with its default-style kernel ConstantKernel(1) * RBF(8)
  (one lengthscale), with the kernel fixed and learned (L-BFGS-B on each binary problem's
  Laplace evidence, as scikit-learn does by default).
* pygpfast: ``VGPClassifier`` with the softmax (log-sum-exp) and the stick-breaking bound,
  its defaults (ARD RBF from the median-distance heuristic, hyperparameters learned).

Metrics: fit time, hold-out accuracy and NLPD (mean -log p(y* | x*)), the number of objective
evaluations (pygpfast), the load average around each fit (the machine is shared).

Usage: nice python bench/python/cvi_digits.py [--threads 2] [--backends sklearn-fixed,
       sklearn-learned,softmax,stick-breaking]
Writes bench/results/cvi_digits.json.
"""

import argparse
import os
import time

import numpy as np

import common


def digits_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    X, y = load_digits(return_X_y=True)
    X, y = X[:600], y[:600]
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.25, random_state=0, stratify=y)
    mean, std = Xtr.mean(axis=0), Xtr.std(axis=0)
    std[std == 0] = 1.0
    return (Xtr - mean) / std, ytr, (Xte - mean) / std, yte


def make(backend):
    if backend.startswith("sklearn"):
        from sklearn.gaussian_process import GaussianProcessClassifier
        from sklearn.gaussian_process.kernels import RBF, ConstantKernel

        return GaussianProcessClassifier(
            kernel=ConstantKernel(1.0) * RBF(8.0),
            optimizer=None if backend == "sklearn-fixed" else "fmin_l_bfgs_b")
    import pygpfast

    return pygpfast.VGPClassifier(likelihood=backend, random_state=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backends", default="sklearn-fixed,sklearn-learned,softmax,stick-breaking")
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits

    import pygpfast

    pygpfast.set_num_threads(args.threads)
    Xtr, ytr, Xte, yte = digits_split()
    out = {"context": common.context(args.threads), "N": len(ytr), "rows": []}
    with threadpool_limits(args.threads, user_api="blas"):
        for backend in args.backends.split(","):
            clf = make(backend)
            load0 = os.getloadavg()[0]
            t0 = time.perf_counter()
            clf.fit(Xtr, ytr)
            fit_s = time.perf_counter() - t0
            P = clf.predict_proba(Xte)
            p_true = np.clip(P[np.arange(len(yte)), np.searchsorted(clf.classes_, yte)], 1e-12, 1)
            row = {"backend": backend, "fit_s": fit_s,
                   "acc": float(np.mean(clf.classes_[np.argmax(P, axis=1)] == yte)),
                   "nlpd": float(-np.mean(np.log(p_true))),
                   "evaluations": getattr(clf, "n_evaluations_", None),
                   "load_before": load0, "load_after": os.getloadavg()[0]}
            out["rows"].append(row)
            print(f"{backend:16s} fit {fit_s:7.1f} s  acc {row['acc']:.3f}  NLPD {row['nlpd']:.3f}  "
                  f"evaluations {row['evaluations']}  load {load0:.1f}->{row['load_after']:.1f}",
                  flush=True)
    print(f"\nthreads={args.threads}, N={len(ytr)}\n")
    print(common.table(out["rows"], ["backend", "fit_s", "acc", "nlpd", "evaluations",
                                     "load_before", "load_after"]))
    print("wrote", common.write_json(out))


if __name__ == "__main__":
    main()
