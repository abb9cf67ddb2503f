"""Throughput of the foundation's hot kernels against equivalent numpy/scipy code, same run.

* kernel matrices K(X, X2) and their vector-Jacobian products (gradients w.r.t. variance,
  ARD lengthscales and X2), RBF and Matern 5/2, D in {8, 256};
* Gaussian expectations E_N(f|mu,var)[log p(y|f)] with d/dmu, d/dvar (20-point Gauss-Hermite for
  Bernoulli; closed form for Gaussian and Poisson).

The numpy references are written the fast way (GEMM-shaped distances, vectorised quadrature), so
the ratios are against good numpy code, not a strawman. GEMM-shaped flops are counted as 2·N·M·D
per distance product; "frac GEMM" divides that rate by the float64 GEMM rate measured in the same
run at the same thread count.

Usage: python bench/python/bench_foundation.py [--threads 1,2] [--load] [--quick]
"""

import argparse
import math
import sys

import numpy as np
from scipy.special import log_ndtr

import common

import pygpfast
from pygpfast import kernels, likelihoods


# ---------------------------------------------------------------- numpy references
def np_scaled_sqdist(A, B):
    r2 = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * (A @ B.T)
    np.maximum(r2, 0.0, out=r2)
    return r2


def np_K(kind, X, X2, var, ls):
    r2 = np_scaled_sqdist(X / ls, X2 / ls)
    if kind == "rbf":
        return var * np.exp(-0.5 * r2)
    r = np.sqrt(r2)
    s5r = math.sqrt(5.0) * r
    return var * (1.0 + s5r + 5.0 / 3.0 * r2) * np.exp(-s5r)


def np_vjp(kind, X, X2, var, ls, G):
    """(dvar, dls [D], dX2 [M, D]) of sum(G * K) — same quantities as the core's K_vjp."""
    A, B = X / ls, X2 / ls
    r2 = np_scaled_sqdist(A, B)
    if kind == "rbf":
        K = var * np.exp(-0.5 * r2)
        W = G * K * -0.5  # dK/d(r2)
    else:
        r = np.sqrt(r2)
        s5r = math.sqrt(5.0) * r
        e = np.exp(-s5r)
        K = var * (1.0 + s5r + 5.0 / 3.0 * r2) * e
        W = G * (-5.0 / 6.0 * var * (1.0 + s5r) * e)  # dK/d(r2)
    dvar = float((G * K).sum() / var)
    row, col = W.sum(1), W.sum(0)
    # d r2 / d l_d = -2 (a_d - b_d)^2 / l_d
    sq = (A * A * row[:, None]).sum(0) + (B * B * col[:, None]).sum(0) - 2.0 * (A * (W @ B)).sum(0)
    dls = -2.0 * sq / ls
    # d r2 / d x2_jd = 2 (b_jd - a_id) / l_d
    dX2 = 2.0 * (col[:, None] * B - W.T @ A) / ls
    return dvar, dls, dX2


GH_X, GH_W = np.polynomial.hermite.hermgauss(20)


def np_expectations(kind, y, mu, var):
    if kind == "gaussian":
        return (-0.5 * np.log(2 * np.pi) - 0.5 * ((y - mu) ** 2 + var), y - mu, np.full_like(mu, -0.5))
    if kind == "poisson":
        e = np.exp(mu + 0.5 * var)
        from scipy.special import gammaln

        return y * mu - e - gammaln(y + 1.0), y - e, -0.5 * e
    F = mu[:, None] + np.sqrt(2.0 * var)[:, None] * GH_X[None, :]
    s = (2.0 * y - 1.0)[:, None]
    if kind == "probit":
        logp = log_ndtr(s * F)
        r = s * np.exp(-0.5 * F * F - 0.5 * np.log(2 * np.pi) - logp)
        d1 = r
    else:  # logit
        logp = -np.logaddexp(0.0, -s * F)
        d1 = s * (1.0 / (1.0 + np.exp(s * F)))
    w = GH_W / math.sqrt(math.pi)
    # Exact derivatives of the quadrature value (as the core returns them).
    return logp @ w, d1 @ w, (d1 * GH_X) @ w / np.sqrt(2.0 * var)


# ---------------------------------------------------------------- pygpfast calls
def pg_kernel(kind, var, ls):
    cls = kernels.RBF if kind == "rbf" else kernels.Matern52
    return cls(variance=var, lengthscale=ls)


def bench_kernels(threads, gemm_gflops, quick):
    rng = np.random.default_rng(0)
    rows = []
    sizes = [(2000, 2000, 8), (4000, 1024, 8), (2000, 2000, 256)] if not quick else [(1000, 1000, 8)]
    for N, M, D in sizes:
        X = rng.standard_normal((N, D))
        X2 = rng.standard_normal((M, D))
        G = rng.standard_normal((N, M))
        ls = np.exp(rng.uniform(-0.5, 0.5, D)) * math.sqrt(D)
        for kind in ("rbf", "matern52"):
            k = pg_kernel(kind, 1.3, ls)
            # Correctness cross-check of the two implementations before timing.
            K_pg = k(X, X2)
            np.testing.assert_allclose(K_pg, np_K(kind, X, X2, 1.3, ls), rtol=1e-9, atol=1e-12)
            dpar, _, dX2 = k.vjp(X, X2, G, wrt_X2=True)
            dv, dl, dX2_np = np_vjp(kind, X, X2, 1.3, ls, G)
            np.testing.assert_allclose(dpar, np.r_[dv, dl], rtol=1e-7, atol=1e-8 * abs(dv))
            np.testing.assert_allclose(dX2, dX2_np, rtol=1e-7, atol=1e-8 * np.abs(dX2_np).max())

            t_K = common.time_calls(lambda: k(X, X2))
            t_K_np = common.time_calls(lambda: np_K(kind, X, X2, 1.3, ls))
            t_g = common.time_calls(lambda: k.vjp(X, X2, G, wrt_X2=True))
            t_g_np = common.time_calls(lambda: np_vjp(kind, X, X2, 1.3, ls, G))
            flops_K = 2.0 * N * M * D
            for what, t, t_np, flops in (("K", t_K, t_K_np, flops_K), ("K+vjp", t_g, t_g_np, 4 * flops_K)):
                rows.append({
                    "kernel": kind, "N": N, "M": M, "D": D, "op": what,
                    "pygpfast ms": 1e3 * t["median"], "numpy ms": 1e3 * t_np["median"],
                    "speedup": t_np["median"] / t["median"],
                    "Melem/s": N * M / t["median"] / 1e6,
                    "frac GEMM": flops / t["median"] / 1e9 / gemm_gflops,
                    "threads": threads,
                })
    return rows


def bench_expectations(threads, quick):
    rng = np.random.default_rng(1)
    rows = []
    for N in ([100_000, 1_000_000] if not quick else [100_000]):
        mu = rng.standard_normal(N) * 2
        var = rng.uniform(0.01, 3.0, N)
        for kind in ("probit", "logit", "poisson", "gaussian"):
            if kind in ("probit", "logit"):
                y = (rng.random(N) < 0.5).astype(float)
                lik = likelihoods.Bernoulli(link=kind, n_gh=20)
            elif kind == "poisson":
                y = rng.poisson(2.0, N).astype(float)
                lik = likelihoods.Poisson()
            else:
                y = rng.standard_normal(N)
                lik = likelihoods.Gaussian(variance=1.0)
            f, dm, dv = lik.variational_expectations(y, mu, var)
            f_np, dm_np, dv_np = np_expectations(kind, y, mu, var)
            np.testing.assert_allclose(f, f_np, rtol=1e-9, atol=1e-10)
            np.testing.assert_allclose(dm, dm_np, rtol=1e-8, atol=1e-10)
            np.testing.assert_allclose(dv, dv_np, rtol=1e-8, atol=1e-10)
            t = common.time_calls(lambda: lik.variational_expectations(y, mu, var))
            t_np = common.time_calls(lambda: np_expectations(kind, y, mu, var))
            rows.append({
                "likelihood": kind, "N": N, "pygpfast ms": 1e3 * t["median"],
                "numpy ms": 1e3 * t_np["median"], "speedup": t_np["median"] / t["median"],
                "Mpoints/s": N / t["median"] / 1e6, "threads": threads,
            })
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--load", action="store_true", help="keep one core busy with another process")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    out = {"runs": []}
    for T in [int(t) for t in args.threads.split(",")]:
        pygpfast.set_num_threads(T)
        gemm = common.gemm_rate(T)
        with common.background_load(args.load):
            run = {
                "context": common.context(T) | {"background_load": args.load, "gemm_gflops": gemm},
                "kernels": bench_kernels(T, gemm, args.quick),
                "expectations": bench_expectations(T, args.quick),
            }
        out["runs"].append(run)
        ctx = run["context"]
        blas = ", ".join(f"{b['internal_api']} {b['version']} ({b['num_threads']} thr)" for b in ctx["blas"])
        print(f"\n## threads={T}  load={'1 busy core' if args.load else 'none'}  "
              f"GEMM {gemm:.1f} GFLOP/s  CPU {ctx['cpu']}  BLAS {blas}\n")
        print(common.table(run["kernels"], ["kernel", "N", "M", "D", "op", "pygpfast ms", "numpy ms",
                                            "speedup", "Melem/s", "frac GEMM"]))
        print()
        print(common.table(run["expectations"], ["likelihood", "N", "pygpfast ms", "numpy ms",
                                                 "speedup", "Mpoints/s"]))
    variant = "-".join(v for v, on in (("load", args.load), ("quick", args.quick)) if on)
    print("\nwrote", common.write_json(out, variant, threads=max(int(t) for t in args.threads.split(","))))
    pygpfast.set_num_threads(None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
