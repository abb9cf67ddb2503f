"""Seed 003 at scale: (1) the 10 000-row, 100-dimensional synthetic set of section 4.1.2
(inputs from a 50-component GMM, y from an RBF GP with inverse lengthscale 0.001, amplitude 2,
noise variance 0.25; 2000 test rows): ISMOERegressor's fit time, test LL and MSE against K, J and
B (an isotropic RBF kernel started at the median distance); (2) the paper's Higgs setting on a
synthetic stand-in: 1 000 000 rows x 28 features, binary labels from a probit of a non-stationary
function, J = 128, K = 20, B = 1000 (ISMOEClassifier, probit; the default ARD kernel and an
isotropic RBF): fit time
(target: under 30 s on the 2-core machine), prediction on 100 000 test rows, peak memory
(getrusage), test LL and AUC, against SVGPClassifier (M = 100, natural gradients, minibatches of
1000) on the same data.

Usage: python bench/python/ismoe_scale.py [--full] [--threads 2] [--skip grid,higgs]
       [--rows 1000000] [--svgp-epochs 2]
       [--test-rows 10000] (the paper's: 100000; prediction is ~10x the fit, note section 8)
"""

import argparse
import resource
import time

import numpy as np
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

import common
import svgp_common
from ismoe_table2 import quiet_fit, synthetic_100d
from pygpfast import ISMOEClassifier, ISMOERegressor, SVGPClassifier
from pygpfast.kernels import RBF


def peak_rss_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def grid(args, out):
    rng = np.random.default_rng(0)
    n_train = 10000
    t0 = time.perf_counter()
    X, y, Xt, yt = synthetic_100d(rng, n_train)
    print(f"(data: {time.perf_counter() - t0:.1f} s)")
    sub = X[rng.choice(n_train, 500, replace=False)]
    med = float(np.median(np.sqrt(((sub[:, None] - sub[None, :200]) ** 2).sum(-1))))
    Js = (1, 10, 50) if not args.full else (1, 10, 50, 100)
    settings = ([(K, 10, 1000) for K in (5, 10, 20)] + [(10, J, 1000) for J in Js if J != 10]
                + [(10, 10, B) for B in (500, 2000)])
    rows = []
    for K, J, B in settings:
        m = ISMOERegressor(RBF(lengthscale=med), n_experts=K, n_samples=J, batch_size=B,
                           random_state=0)
        t = quiet_fit(m, X, y)
        t1 = time.perf_counter()
        ll = float(np.sum(m.predict_log_density(Xt, yt)))
        mse = float(np.mean((m.predict(Xt) - yt) ** 2))
        rows.append({"K": K, "J": J, "B": B, "fit s": t, "predict s": time.perf_counter() - t1,
                     "test LL": ll, "MSE": mse, "ESS": m.effective_sample_size_,
                     "blocks": J * K})
        print(rows[-1], flush=True)
    out["grid"] = {"n_train": n_train, "n_test": len(yt), "lengthscale0": med, "rows": rows}
    print("\n10 000 x 100 synthetic (2000 test rows): fit time against K, J, B")
    print(common.table(rows, list(rows[0])))


def higgs_like(rng, n, D=28):
    X = rng.standard_normal((n, D))
    f = (np.sin(2 * X[:, 0]) * (1 + X[:, 1] ** 2) ** 0.5 + np.tanh(X[:, 2] + X[:, 3])
         + 0.5 * X[:, 4] * X[:, 5] - 0.3 * X[:, 6] ** 2 + 0.3)
    y = (rng.random(n) < norm.cdf(f)).astype(np.int64)
    return X, y


def higgs(args, out):
    rng = np.random.default_rng(1)
    t0 = time.perf_counter()
    X, y = higgs_like(rng, args.rows)
    Xt, yt = higgs_like(rng, args.test_rows)
    t_data = time.perf_counter() - t0
    rss0 = peak_rss_gb()
    rows = []
    from pygpfast.moe import _proposal

    for label, kernel in (("ARD RBF (default)", None), ("isotropic RBF", RBF(lengthscale=7.0))):
        m = ISMOEClassifier(kernel, n_experts=20, n_samples=128, batch_size=1000, random_state=0)
        t_fit = quiet_fit(m, X, y)
        t0 = time.perf_counter()
        lp = m.predict_log_proba(Xt)
        t_pred = time.perf_counter() - t0
        it = m.experts_["iterations"]
        rows.append({"method": f"IS-MOE J=128 K=20 B=1000, {label}", "N": args.rows,
                     "fit s": t_fit, "predict s": t_pred,
                     "test LL": float(np.sum(lp[np.arange(len(yt)), yt])),
                     "AUC": float(roc_auc_score(yt, lp[:, 1])), "peak RSS GB": peak_rss_gb(),
                     "ESS": m.effective_sample_size_,
                     "samples kept": int(m.experts_["samples"].size),
                     "L-BFGS iterations per expert": float(it.mean()) if it.size else 0.0})
        print(rows[-1], flush=True)
    # where the time goes: the proposal (draws and responsibilities), the rest is the experts
    Xs = (X - m.x_mean_) / m.x_scale_
    t0 = time.perf_counter()
    for j in range(16):
        _proposal.draw_sample(Xs, 0, j, K=20, B=1000, partition="gmm",
                              prior=_proposal.Prior.default(20, 28))
    t_proposal = (time.perf_counter() - t0) / 16
    rss_fit = peak_rss_gb()
    svgp = SVGPClassifier(n_inducing=100, optimizer="natgrad", batch_size=1000,
                          max_iter=args.svgp_epochs, random_state=0)
    t_svgp = quiet_fit(svgp, X, y)
    t0 = time.perf_counter()
    lp = svgp.predict_log_proba(Xt)
    rows.append({"method": f"SVGP M=100 natgrad {args.svgp_epochs} epochs", "N": args.rows,
                 "fit s": t_svgp, "predict s": time.perf_counter() - t0,
                 "test LL": float(np.sum(lp[np.arange(len(yt)), yt])),
                 "AUC": float(roc_auc_score(yt, lp[:, 1])), "peak RSS GB": peak_rss_gb()})
    out["higgs"] = {"rows": rows, "data s": t_data, "rss before fit GB": rss0,
                    "proposal s per sample": t_proposal,
                    "rss after IS-MOE fit GB": rss_fit, "target fit s": 30.0}
    print(f"\nHiggs-like: {args.rows} x 28 train, {args.test_rows} test (data {t_data:.1f} s, "
          f"RSS before the fit {rss0:.2f} GB; the proposal: {t_proposal:.4f} s per sample)")
    print(common.table(rows, list(rows[0])))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip", default="")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--svgp-epochs", type=int, default=2)
    ap.add_argument("--test-rows", type=int, default=10_000)
    args = ap.parse_args()
    ctx = svgp_common.start(args.threads)
    out = {"args": vars(args)}
    skip = set(args.skip.split(",")) - {""}
    if "higgs" not in skip:
        higgs(args, out)
    if "grid" not in skip:
        grid(args, out)
    svgp_common.finish("full" if args.full else None, ctx, out)


if __name__ == "__main__":
    main()
