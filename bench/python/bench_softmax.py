"""Accuracy and cost of the softmax likelihood's expectations on realistic marginals.

1. Fit a multi-class SVGP (softmax likelihood, whitened, k-means inducing inputs kept fixed,
   isotropic RBF kernel) by full-batch L-BFGS-B through the core's ELBO, on USPS (10 classes)
   and/or UCI glass (6 classes), and take the marginals (mu, var) [N, C] of q(f) at training
   and test points.
2. Reference on a subsample of those points: Frullani's identity discretised densely and
   independently of the likelihood's rule (inner trapezoid in z, step 0.1 on [-12, 12]; outer
   trapezoid in u = log t, step 0.2 on [-60, 60]; no control variate, no closed-form tail):
   E[lse(f)], E[softmax_c(f)] and E[softmax_c(f)^2], which give the exact value, d/dmu
   (= e_y - E[softmax]) and d/dvar (= -(E[softmax_c] - E[softmax_c^2]) / 2, Price). On a
   smaller subsample, randomised QMC (scrambled Sobol, antithetic) checks the identity itself.
3. For n_gh in --n-gh: the errors of the core's value, gradients, class probabilities and log
   predictive density against the reference, and the time per point (1 thread). For
   comparison, a quasi-Monte-Carlo rule (scrambled Sobol with a fixed seed, antithetic,
   moment-matched so that it integrates every quadratic exactly) with K points.

Usage:
  python bench/python/bench_softmax.py [--data usps,glass] [--M 100] [--n-ref 1000]
      [--n-gh 8,12,16,20,32] [--qmc 256,1024,4096] [--max-iter 200]
"""

import argparse
import json
import time

import numpy as np
import scipy.optimize
from scipy.special import logsumexp, softmax
from scipy.stats import norm, qmc
from sklearn.cluster import KMeans

import common

import pygpfast
from pygpfast import _core, kernels, likelihoods


def load(name):
    d = np.load(common.data_dir() / {"usps": "usps_full.npz", "glass": "uci_glass.npz"}[name])
    if name == "usps":
        return (d["X_train"].astype(float), d["y_train"].astype(float),
                d["X_test"].astype(float), d["y_test"].astype(float))
    X, y = d["X"].astype(float), d["y"].astype(float)
    X = (X - X.mean(0)) / X.std(0)
    idx = np.random.default_rng(0).permutation(len(y))
    tr, te = idx[: 2 * len(y) // 3], idx[2 * len(y) // 3:]
    return X[tr], y[tr], X[te], y[te]


def fit(X, y, C, M, max_iter, n_gh):
    """Full-batch L-BFGS-B on q_mu [M, C], tril(q_sqrt) [C, M(M+1)/2], log kernel params."""
    rng = np.random.default_rng(0)
    Z = KMeans(M, n_init=1, random_state=0).fit(X[rng.permutation(len(y))[: 20 * M]]).cluster_centers_
    Z = np.ascontiguousarray(Z)
    sub = X[rng.permutation(len(y))[:500]]
    ell = np.median(np.sqrt(((sub[:, None] - sub[None]) ** 2).sum(-1)))
    kernel = kernels.RBF(variance=5.0, lengthscale=float(ell))
    lik = likelihoods.Softmax(C, n_gh=n_gh)
    tril = np.tril_indices(M)
    nq = C * len(tril[0])

    def unpack(x):
        q_mu = x[: M * C].reshape(M, C).copy()
        q_sqrt = np.zeros((C, M, M))
        q_sqrt[:, tril[0], tril[1]] = x[M * C: M * C + nq].reshape(C, -1)
        kernel.theta = x[M * C + nq:]
        return q_mu, q_sqrt

    def objective(x):
        q_mu, q_sqrt = unpack(x)
        codes, params = kernel._spec(X.shape[1])
        value, _, _, _, (d_mu, d_sqrt, _, d_kern, _, _) = _core.svgp.elbo(
            codes, params, *lik._core_args(), Z=Z, q_mu=q_mu, q_sqrt=q_sqrt, whiten=True, X=X, y=y, scale=1.0, jitter=1e-6, with_grad=True)
        g = np.concatenate([d_mu.ravel(), d_sqrt[:, tril[0], tril[1]].ravel(), d_kern * params])
        return -value, -g

    x0 = np.concatenate([np.zeros(M * C), np.tile(np.eye(M)[tril], C), kernel.theta])
    t0 = time.perf_counter()
    res = scipy.optimize.minimize(objective, x0, jac=True, method="L-BFGS-B",
                                  options={"maxiter": max_iter})
    q_mu, q_sqrt = unpack(res.x)
    return {"Z": Z, "q_mu": q_mu, "q_sqrt": q_sqrt, "kernel": kernel, "lik": lik,
            "elbo": -res.fun, "nit": res.nit, "fit_s": time.perf_counter() - t0}


def marginals(model, X):
    codes, params = model["kernel"]._spec(X.shape[1])
    mean, var, _ = _core.svgp.predict_f(codes, params, Z=model["Z"], q_mu=model["q_mu"], q_sqrt=model["q_sqrt"],
                                        whiten=True, Xnew=np.ascontiguousarray(X), jitter=1e-6)
    return mean, var


def dense_reference(mu, var, chunk=50):
    """E[lse], E[softmax] [N, C], E[softmax^2] [N, C] by a dense, independent discretisation."""
    z = np.arange(-12.0, 12.0 + 1e-9, 0.1)
    wz = norm.pdf(z)
    wz /= wz.sum()
    u = np.arange(-60.0, 60.0 + 1e-9, 0.2)
    out_lse, out_p, out_p2 = [], [], []
    for i in range(0, len(mu), chunk):
        m = logsumexp(mu[i: i + chunk], axis=1)
        Y = np.exp((mu[i: i + chunk] - m[:, None])[:, :, None] + np.sqrt(var[i: i + chunk])[:, :, None] * z)
        lse = np.zeros(len(m))
        p = np.zeros(Y.shape[:2])
        p2 = np.zeros(Y.shape[:2])
        for uj in u:
            t = np.exp(uj)
            q = np.exp(-t * Y)
            L = q @ wz
            M1 = (Y * q) @ wz
            M2 = (Y * Y * q) @ wz
            ones = np.ones((len(m), 1))
            prefix = np.cumprod(np.hstack([ones, L[:, :-1]]), axis=1)
            suffix = np.cumprod(np.hstack([ones, L[:, :0:-1]]), axis=1)[:, ::-1]
            others = prefix * suffix  # prod over d != c of L_d
            lse += np.exp(-t) - np.prod(L, 1)
            p += t * M1 * others
            p2 += t * t * M2 * others
        out_lse.append(m + 0.2 * lse)
        out_p.append(0.2 * p)
        out_p2.append(0.2 * p2)
    return np.concatenate(out_lse), np.concatenate(out_p), np.concatenate(out_p2)


def qmc_rule(C, K, seed=0):
    """K points (K/2 scrambled Sobol, then their negatives), moment-matched: the rule's mean
    is 0 and its covariance I exactly."""
    U = qmc.Sobol(C, scramble=True, seed=seed).random(K // 2)
    Zp = norm.ppf(U)
    Zp = np.vstack([Zp, -Zp])
    L = np.linalg.cholesky(Zp.T @ Zp / K)
    return np.linalg.solve(L, Zp.T).T


def qmc_expectations(mu, var, Zq, chunk=200):
    lse, p = [], []
    for i in range(0, len(mu), chunk):
        f = mu[i: i + chunk, None, :] + np.sqrt(var[i: i + chunk])[:, None, :] * Zq[None]
        lse.append(logsumexp(f, axis=2).mean(1))
        p.append(softmax(f, axis=2).mean(1))
    return np.concatenate(lse), np.concatenate(p)


def rqmc_check(mu, var, log2n=18, reps=4):
    """E[lse] by randomised QMC (independent scrambles): mean and standard error."""
    C = mu.shape[1]
    ests = []
    for r in range(reps):
        Zq = qmc_rule(C, 2 ** log2n, seed=100 + r)
        ests.append(np.array([logsumexp(m + np.sqrt(v) * Zq, axis=1).mean() for m, v in zip(mu, var)]))
    ests = np.array(ests)
    return ests.mean(0), ests.std(0, ddof=1) / np.sqrt(reps)


def errors(name, mu, var, y, ref, n_gh_list, qmc_list):
    lse_ref, p_ref, p2_ref = ref
    n, C = mu.shape
    yi = y.astype(int)
    value_ref = mu[np.arange(n), yi] - lse_ref
    dmu_ref = np.eye(C)[yi] - p_ref
    dvar_ref = -0.5 * (p_ref - p2_ref)
    logdens_ref = np.log(p_ref[np.arange(n), yi])
    rows = []
    pygpfast.set_num_threads(1)
    for n_gh in n_gh_list:
        lik = likelihoods.Softmax(C, n_gh=n_gh)
        value, dmu, dvar = lik.variational_expectations(y, mu, var)
        proba = lik.predict_proba(mu, var)
        logdens = lik.predict_log_density(y, mu, var)
        timing = common.time_calls(lambda: lik.variational_expectations(y, mu, var), min_time=1.0)
        rows.append({
            "set": name, "method": f"frullani n_gh={n_gh}",
            "value_max": float(np.abs(value - value_ref).max()),
            "value_mean": float(np.abs(value - value_ref).mean()),
            "elbo_sum_rel": float(abs((value - value_ref).sum()) / abs(value_ref.sum())),
            "dmu_max": float(np.abs(dmu - dmu_ref).max()),
            "dvar_max": float(np.abs(dvar - dvar_ref).max()),
            "proba_max": float(np.abs(proba - p_ref).max()),
            "logdens_max": float(np.abs(logdens - logdens_ref).max()),
            "us_per_point": 1e6 * timing["median"] / n,
        })
    for K in qmc_list:
        Zq = qmc_rule(C, K)
        t0 = time.perf_counter()
        lse, p = qmc_expectations(mu, var, Zq)
        elapsed = time.perf_counter() - t0
        value = mu[np.arange(n), yi] - lse
        rows.append({
            "set": name, "method": f"QMC K={K} (numpy)",
            "value_max": float(np.abs(value - value_ref).max()),
            "value_mean": float(np.abs(value - value_ref).mean()),
            "elbo_sum_rel": float(abs((value - value_ref).sum()) / abs(value_ref.sum())),
            "dmu_max": float(np.abs((np.eye(C)[yi] - p) - dmu_ref).max()),
            "dvar_max": float("nan"),
            "proba_max": float(np.abs(p - p_ref).max()),
            "logdens_max": float(np.abs(np.log(p[np.arange(n), yi]) - logdens_ref).max()),
            "us_per_point": 1e6 * elapsed / n,
        })
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="glass,usps")
    ap.add_argument("--M", type=int, default=100)
    ap.add_argument("--max-iter", type=int, default=200)
    ap.add_argument("--n-ref", type=int, default=1000, help="points per split in the reference")
    ap.add_argument("--n-rqmc", type=int, default=50, help="points checked by randomised QMC")
    ap.add_argument("--n-gh", default="8,12,16,20,32")
    ap.add_argument("--qmc", default="256,1024,4096")
    args = ap.parse_args()
    n_gh_list = [int(v) for v in args.n_gh.split(",")]
    qmc_list = [int(v) for v in args.qmc.split(",") if v]
    results = {"context": common.context(1), "fits": [], "rows": []}
    for name in args.data.split(","):
        Xtr, ytr, Xte, yte = load(name)
        C = int(ytr.max()) + 1
        M = min(args.M, len(ytr) // 2)
        model = fit(Xtr, ytr, C, M, args.max_iter, 20)
        rng = np.random.default_rng(1)
        fit_info = {"set": name, "N": len(ytr), "C": C, "M": M, "elbo": model["elbo"],
                    "nit": model["nit"], "fit_s": model["fit_s"],
                    "kernel": repr(model["kernel"])}
        for split, X, y in (("train", Xtr, ytr), ("test", Xte, yte)):
            idx = rng.permutation(len(y))[: args.n_ref]
            mu, var = marginals(model, X[idx])
            yy = y[idx]
            p = model["lik"].predict_proba(*marginals(model, X))
            fit_info[f"{split}_accuracy"] = float(np.mean(p.argmax(1) == y))
            fit_info[f"{split}_var_quantiles"] = np.quantile(var, [0.5, 0.9, 0.99, 1.0]).tolist()
            t0 = time.perf_counter()
            ref = dense_reference(mu, var)
            fit_info[f"{split}_ref_s"] = time.perf_counter() - t0
            if args.n_rqmc:
                est, se = rqmc_check(mu[: args.n_rqmc], var[: args.n_rqmc])
                fit_info[f"{split}_rqmc_vs_dense_max"] = float(np.abs(est - ref[0][: args.n_rqmc]).max())
                fit_info[f"{split}_rqmc_se_max"] = float(se.max())
            for row in errors(f"{name}/{split}", mu, var, yy, ref, n_gh_list, qmc_list):
                results["rows"].append(row)
        results["fits"].append(fit_info)
        print(json.dumps(fit_info, indent=1))
    keys = ["value_max", "value_mean", "elbo_sum_rel", "dmu_max", "dvar_max", "proba_max", "logdens_max",
            "us_per_point"]
    print("| set | method | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 2) + "|")
    for r in results["rows"]:
        print(f"| {r['set']} | {r['method']} | " + " | ".join(f"{r[k]:.2g}" for k in keys) + " |")
    out = common.write_json(results, args.data.replace(",", "-") if args.data != "glass,usps" else None)
    print("wrote", out)


if __name__ == "__main__":
    main()
