"""Seed 003 (Zhang & Williamson, IS-MOE), Tables 2, 3, 4 and 6 with pygpfast's estimators.

Table 2: three synthetic 1-D problems (N = 1000 train, 100 test, noise variance 1): a GP draw
with RBF inverse lengthscale gamma = 15 (long), gamma = 5000 (short), and a non-stationary
function (slow on the left, fast on the right, inputs denser in the centre). IS-MOE with K = 10,
J = 10, no minibatch (the paper's setting; shared hyperparameters per sample on 1 and 2, own per
expert on 3) against the exact GP (ISMOERegressor with K = 1, J = 1, B = N: one expert of all
rows, ML-II) and SVGPRegressor (M = 100). Test log likelihood (sum over the 100 test points)
and MSE beside the paper's.
Table 3: the non-stationary problem with J = 6000 (paper: 61 s); default J = 600 (--full: 6000).
Table 4: the 10 000 x 100 GMM-input synthetic set (section 4.1.2), J = K = 10, B = 1000:
importance vs uniform weights, with and without the stochastic approximation (scale_evidence).
An isotropic RBF started at the median distance; one repetition by default (--reps).
Table 6: Pima and WDBC (shared/data; the UCI Parkinsons classification set is not there),
ISMOEClassifier (K = 5, J = 32, probit) against the full Laplace GP (K = 1, J = 1), a 2/1 split.

Usage: python bench/python/ismoe_table2.py [--full] [--reps 1] [--threads 2] [--skip 3,4]
"""

import argparse
import time
import warnings

import numpy as np
from sklearn.metrics import roc_auc_score

import common
import svgp_common
from pygpfast import ISMOEClassifier, ISMOERegressor, SVGPRegressor
from pygpfast.kernels import RBF

PAPER_T2 = {  # Table 2: (IS-MOE LL, GP LL, SVI LL, IS-MOE MSE, GP MSE, SVI MSE)
    "long": (-152.41, -143.52, -156.51, 1.20, 1.03, 1.30),
    "short": (-157.16, -172.32, -173.38, 1.35, 1.83, 1.87),
    "nonstationary": (-158.21, -181.40, -198.00, 1.39, 2.18, 2.12),
}
PAPER_T3 = {"ll": -154.79, "mse": 1.28, "seconds": 61.16}
PAPER_T4 = {"IS with SA": (-354.96, 0.096), "IS without SA": (-423.93, 0.097),
            "Unif. with SA": (-726.67, 0.19), "Unif. without SA": (-842.88, 0.25)}
PAPER_T6 = {"pima": (-128.79, -135.09, 0.83, 0.81), "wdbc": (-15.50, -12.62, 0.83, 0.91),
            "parkinsons": (-17.00, -22.76, 0.86, 0.93)}  # (full GP LL, IS-MOE LL, AUCs)


def quiet_fit(est, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        est.fit(X, y)
        return time.perf_counter() - t0


def synthetic_1d(kind, rng, n=1100):
    if kind == "nonstationary":
        x = np.sort(2 * rng.beta(2, 2, n) - 1)
        f = np.where(x < 0, 2 * np.sin(2 * np.pi * x), 2 * np.sin(12 * np.pi * x))
    else:
        x = np.linspace(-1, 1, n)
        gamma = 15.0 if kind == "long" else 5000.0
        K = np.exp(-gamma * (x[:, None] - x[None, :]) ** 2) + 1e-8 * np.eye(n)
        f = np.linalg.cholesky(K) @ rng.standard_normal(n)
    y = f + rng.standard_normal(n)
    test = rng.choice(n, 100, replace=False)
    train = np.setdiff1d(np.arange(n), test)
    return x[train, None], y[train], x[test, None], y[test]


def gauss_ll(mean, std, y):
    return float(np.sum(-0.5 * np.log(2 * np.pi * std**2) - 0.5 * ((y - mean) / std) ** 2))


def table2(args, out):
    rows = []
    for kind in ("long", "short", "nonstationary"):
        rng = np.random.default_rng(0)
        X, y, Xt, yt = synthetic_1d(kind, rng)
        share = kind != "nonstationary"
        moe = ISMOERegressor(n_experts=10, n_samples=10, share_hyperparameters=share, random_state=0)
        t_moe = quiet_fit(moe, X, y)
        gp = ISMOERegressor(n_experts=1, n_samples=1, random_state=0)
        t_gp = quiet_fit(gp, X, y)
        svgp = SVGPRegressor(n_inducing=100, random_state=0)
        t_svgp = quiet_fit(svgp, X, y)
        r = {"data": kind}
        for name, m, t in (("IS-MOE", moe, t_moe), ("GP", gp, t_gp), ("SVGP", svgp, t_svgp)):
            mean, std = m.predict(Xt, return_std=True)
            ll = (float(np.sum(m.predict_log_density(Xt, yt))) if name != "SVGP"
                  else gauss_ll(mean, std, yt))
            r[f"{name} LL"], r[f"{name} MSE"], r[f"{name} s"] = ll, float(np.mean((mean - yt) ** 2)), t
        p = PAPER_T2[kind]
        r.update({"paper IS-MOE LL": p[0], "paper GP LL": p[1], "paper SVI LL": p[2],
                  "paper IS-MOE MSE": p[3], "paper GP MSE": p[4], "paper SVI MSE": p[5],
                  "ESS": moe.effective_sample_size_})
        rows.append(r)
    out["table2"] = rows
    print("\nTable 2 (test LL over 100 points, MSE; paper's in the 'paper' columns)")
    print(common.table(rows, ["data", "IS-MOE LL", "paper IS-MOE LL", "GP LL", "paper GP LL",
                              "SVGP LL", "paper SVI LL", "IS-MOE MSE", "paper IS-MOE MSE",
                              "GP MSE", "paper GP MSE", "SVGP MSE", "paper SVI MSE", "ESS",
                              "IS-MOE s", "GP s", "SVGP s"]))


def table3(args, out):
    J = 6000 if args.full else 600
    rng = np.random.default_rng(0)
    X, y, Xt, yt = synthetic_1d("nonstationary", rng)
    moe = ISMOERegressor(n_experts=10, n_samples=J, random_state=0)
    seconds = quiet_fit(moe, X, y)
    t0 = time.perf_counter()
    mean, _ = moe.predict(Xt, return_std=True)
    ll = float(np.sum(moe.predict_log_density(Xt, yt)))
    t_pred = time.perf_counter() - t0
    row = {"J": J, "LL": ll, "MSE": float(np.mean((mean - yt) ** 2)), "fit s": seconds,
           "predict s": t_pred, "s per sample": seconds / J, "ESS": moe.effective_sample_size_,
           "samples kept": int(moe.experts_["samples"].size), "paper LL": PAPER_T3["ll"],
           "paper MSE": PAPER_T3["mse"], "paper s (J=6000)": PAPER_T3["seconds"],
           "projected s at J=6000": seconds / J * 6000}
    out["table3"] = row
    print("\nTable 3 (non-stationary, K = 10)")
    print(common.table([row], list(row)))


def gmm_inputs(rng, n, D=100, C=50):
    centres = rng.standard_normal((C, D)) * 3.0
    labels = rng.integers(0, C, n)
    return centres[labels] + rng.standard_normal((n, D))


def synthetic_100d(rng, n_train, n_test=2000, D=100):
    """Section 4.1.2: inputs from a 50-component GMM in R^100, y from a GP with RBF inverse
    lengthscale 0.001 (lengthscale 1 / sqrt(0.002)), amplitude 2, noise variance 0.25.
    The GP draw over train and test is exact (one Cholesky of n x n)."""
    n = n_train + n_test
    X = gmm_inputs(rng, n, D)
    sq = np.sum(X**2, 1)
    K = 2.0 * np.exp(-0.001 * np.maximum(sq[:, None] + sq[None, :] - 2 * X @ X.T, 0.0))
    K[np.diag_indices(n)] += 1e-6
    f = np.linalg.cholesky(K) @ rng.standard_normal(n)
    y = f + 0.5 * rng.standard_normal(n)
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


def median_distance(X, n=300):
    """The median Euclidean distance between rows of X (a subsample): an isotropic RBF's start.
    (The default ARD kernel, 101 parameters on experts of ~100 rows, over-fits: MSE 1.34.)"""
    sub = X[:n]
    return float(np.median(np.sqrt(((sub[:, None] - sub[None, : n // 3]) ** 2).sum(-1))))


def table4(args, out):
    n_train = 10000
    rows = []
    settings = [("IS with SA", "importance", True), ("IS without SA", "importance", False),
                ("Unif. with SA", "uniform", True), ("Unif. without SA", "uniform", False)]
    results = {s[0]: [] for s in settings}
    for rep in range(args.reps):
        rng = np.random.default_rng(100 + rep)
        X, y, Xt, yt = synthetic_100d(rng, n_train)
        kernel = RBF(lengthscale=median_distance(X))
        for name, weighting, sa in settings:
            m = ISMOERegressor(kernel, n_experts=10, n_samples=10, batch_size=min(1000, n_train),
                               weighting=weighting, scale_evidence=sa, random_state=rep)
            t = quiet_fit(m, X, y)
            mean = m.predict(Xt)
            results[name].append((float(np.sum(m.predict_log_density(Xt, yt))),
                                  float(np.mean((mean - yt) ** 2)), t))
    for name, _, _ in settings:
        a = np.array(results[name])
        se = a.std(axis=0, ddof=1) / np.sqrt(len(a)) if len(a) > 1 else np.full(3, np.nan)
        rows.append({"setting": name, "LL": a[:, 0].mean(), "LL se": se[0], "MSE": a[:, 1].mean(),
                     "MSE se": se[1], "fit s": a[:, 2].mean(), "paper LL": PAPER_T4[name][0],
                     "paper MSE": PAPER_T4[name][1]})
    out["table4"] = {"n_train": n_train, "reps": args.reps, "rows": rows}
    print(f"\nTable 4 (N = {n_train}, 2000 test, J = K = 10, B = 1000; {args.reps} repetition(s))")
    print(common.table(rows, list(rows[0])))


def table6(args, out):
    data = common.data_dir()
    rows = []
    for name, file in (("pima", "uci_pima.npz"), ("wdbc", "uci_wdbc.npz")):
        d = np.load(data / file)
        X, y = d["X"].astype(float), (d["y"] > 0).astype(int)
        rng = np.random.default_rng(0)
        perm = rng.permutation(len(y))
        n_test = len(y) // 3
        te, tr = perm[:n_test], perm[n_test:]
        mu, sd = X[tr].mean(0), X[tr].std(0)
        sd[sd == 0] = 1
        Xtr, Xte = (X[tr] - mu) / sd, (X[te] - mu) / sd
        r = {"data": name, "n_test": n_test}
        for label, est in (("full GP", ISMOEClassifier(n_experts=1, n_samples=1, random_state=0)),
                           ("IS-MOE", ISMOEClassifier(n_experts=5, n_samples=32, random_state=0))):
            t = quiet_fit(est, Xtr, y[tr])
            lp = est.predict_log_proba(Xte)
            r[f"{label} LL"] = float(np.sum(lp[np.arange(n_test), y[te]]))
            r[f"{label} AUC"] = float(roc_auc_score(y[te], lp[:, 1]))
            r[f"{label} s"] = t
        p = PAPER_T6[name]
        r.update({"paper full GP LL": p[0], "paper IS-MOE LL": p[1], "paper full GP AUC": p[2],
                  "paper IS-MOE AUC": p[3]})
        rows.append(r)
    out["table6"] = rows
    print("\nTable 6 (test LL and AUC; 1/3 of the rows held out, seed 0)")
    print(common.table(rows, list(rows[0])))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip", default="")
    args = ap.parse_args()
    ctx = svgp_common.start(args.threads)
    out = {"args": vars(args)}
    skip = set(args.skip.split(",")) - {""}
    for number, fn in (("2", table2), ("3", table3), ("4", table4), ("6", table6)):
        if number not in skip:
            t0 = time.perf_counter()
            fn(args, out)
            print(f"(table {number}: {time.perf_counter() - t0:.1f} s)")
    svgp_common.finish("full" if args.full else None, ctx, out)


if __name__ == "__main__":
    main()
