"""10-class USPS: IVMClassifier (joint multi-class IVM and one-vs-rest probit IVMs, seed 002)
against pygpfast.SVGPClassifier (softmax, seed 000) and scikit-learn's
GaussianProcessClassifier (one-vs-rest Laplace, Rasmussen & Williams 2006, Algorithm 3.1), in
one run, on the same training subset.

scikit-learn's GPC is an exact GP (O(n^3) per class and optimiser step), so every method trains
on the same random subset of n rows of the standard 7291-image training set (default n = 1000)
and is tested on the full 2007-image test set. Settings: IVM d = min(200, n / 5) active points,
shared RBF-ARD default kernel, 20 hyperparameter iterations (re-selection every 10); SVGP M = 100
k-means inducing points, full-batch L-BFGS-B (100 iterations); GPC 1 * RBF(10) with its own
L-BFGS-B and no restarts.

Reported: test accuracy, NLPD (mean -log p(y* | x*)), fit time.

Usage: python bench/python/ivm_usps.py [--quick] [--n 1500] [--threads 2] [--methods ivm,svgp,gpc]
[--ivm-kernel default|isotropic]; writes bench/results/ivm_usps[-<methods>][-isotropic][-quick].json
(<methods> when not all three run).
"""

import argparse
import time
import warnings

import numpy as np

import common

import pygpfast
from pygpfast import IVMClassifier, SVGPClassifier


def load_usps():
    d = np.load(common.data_dir() / "usps_full.npz")
    return (np.asarray(d["X_train"], dtype=np.float64), np.asarray(d["y_train"], dtype=np.int64),
            np.asarray(d["X_test"], dtype=np.float64), np.asarray(d["y_test"], dtype=np.int64))


def evaluate(name, make, Xtr, ytr, Xte, yte):
    clf = make()
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (convergence warnings of the small budgets)
        clf.fit(Xtr, ytr)
    fit = time.perf_counter() - t0
    proba = clf.predict_proba(Xte)
    p = np.clip(proba[np.arange(len(yte)), np.searchsorted(clf.classes_, yte)], 1e-300, None)
    row = {"method": name, "accuracy": float(np.mean(clf.classes_[np.argmax(proba, 1)] == yte)),
           "nlpd": float(-np.mean(np.log(p))), "fit (s)": fit}
    print(row, flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="n = 500, fewer iterations")
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--methods", default="ivm,svgp,gpc")
    ap.add_argument("--ivm-kernel", choices=("default", "isotropic"), default="default",
                    help="IVM kernel: the default (RBF-ARD, median heuristic) or an isotropic "
                         "RBF at the root mean square distance, variance 10")
    args = ap.parse_args()
    if args.quick:
        args.n = 500
    it = 10 if args.quick else 20
    pygpfast.set_num_threads(args.threads)
    Xtr, ytr, Xte, yte = load_usps()
    idx = np.random.default_rng(0).permutation(len(Xtr))[:args.n]
    Xtr, ytr = Xtr[idx], ytr[idx]
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    d = min(200, args.n // 5)
    kernel = None
    if args.ivm_kernel == "isotropic":
        from pygpfast import kernels

        sub = Xtr[:500]
        rms = float(np.sqrt(np.mean(((sub[:, None, :] - sub[None, :100, :]) ** 2).sum(-1))))
        kernel = kernels.RBF(variance=10.0, lengthscale=rms)
    tag = "" if kernel is None else ", isotropic RBF"
    methods = [
        ("IVMClassifier joint (d=%d%s)" % (d, tag),
         lambda: IVMClassifier(kernel, active_size=d, max_iter=it, random_state=0)),
        ("IVMClassifier ovr (d=%d%s)" % (d, tag),
         lambda: IVMClassifier(kernel, active_size=d, multi_class="ovr", max_iter=it,
                               random_state=0)),
        ("SVGPClassifier softmax (M=100, L-BFGS-B)",
         lambda: SVGPClassifier(n_inducing=100, optimizer="lbfgs", max_iter=100 if not args.quick
                                else 20, random_state=0)),
        ("sklearn GaussianProcessClassifier (OvR Laplace)",
         lambda: GaussianProcessClassifier(ConstantKernel(1.0) * RBF(10.0),
                                           multi_class="one_vs_rest", random_state=0)),
    ]
    keep = set(args.methods.split(","))
    methods = [m for m in methods if ("ivm" if m[0].startswith("IVM") else "svgp"
                                      if m[0].startswith("SVGP") else "gpc") in keep]
    rows = [evaluate(name, make, Xtr, ytr, Xte, yte) for name, make in methods]
    print(common.table(rows, ["method", "accuracy", "nlpd", "fit (s)"]))
    parts = ([] if keep >= {"ivm", "svgp", "gpc"} else ["-".join(sorted(keep))]) + (
        ["isotropic"] if kernel is not None else []) + (["quick"] if args.quick else [])
    path = common.write_json({
        "context": common.context(args.threads), "args": vars(args), "n_train": args.n,
        "n_test": len(yte), "rows": rows}, "-".join(parts) or None)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
