"""Time one SVGP-classification ELBO + gradient evaluation, side by side with GPflow and GPyTorch.

The case is the one of ``shared/peers/svgp_step.py`` (re-created here from its definition): D = 8,
ARD RBF kernel (lengthscales 2, variance 1), Bernoulli-probit likelihood with 20-point
Gauss-Hermite, whitened q(u) with a full lower-triangular q_sqrt, N = 100 000, minibatch B, float64.
pygpfast is timed in this process; the peers, when ``--peers DIR`` names the peers' scripts and
``--peers-python`` a Python that has GPflow/GPyTorch, are run by their own driver in the same
session (each backend in a fresh process with the same thread count), and their medians are
reported next to pygpfast's.

"frac GEMM" uses the peers' nominal flop count, (7/3) M^3 + 10 M^2 B + 9 D (M^2 + M B), so that
it compares across libraries; "own GF/s" divides pygpfast's own count (svgp.hpp: 3 B M^2 + ~8 M^3
on the precomputed path, ~8 B M^2 + ~1 M^3 on the triangular-solve path) by its time. The "path"
column says which of the two evaluations ran.

Usage:
  python bench/python/svgp_step.py --threads 2 [--grid 64:256,256:4096] [--load]
      [--peers ../shared/peers --peers-python /path/to/venv-peers/bin/python]
"""

import argparse
import sys

import numpy as np

import common

import pygpfast
from pygpfast import _core, kernels, likelihoods
from pygpfast.svgp import SVGP

D = 8
N_TOTAL = 100_000
GRID = [(M, B) for M in (64, 256, 1024) for B in (256, 4096)]


def make_case(M, B, seed=1234):
    """The peers' synthetic minibatch and initial parameters (same generator calls in order)."""
    rng = np.random.default_rng(seed + 7919 * M + B)
    X = rng.standard_normal((B, D))
    f = np.sin(X[:, 0] * 1.5) + 0.5 * X[:, 1] * X[:, 2] - 0.3 * X[:, 3] ** 2 + 0.2
    y = (f + 0.3 * rng.standard_normal(B) > 0).astype(np.float64)
    Z = rng.standard_normal((M, D))
    q_mu = 0.3 * rng.standard_normal(M)
    q_sqrt = np.tril(0.02 * rng.standard_normal((M, M)), -1) + np.diag(0.3 + 0.5 * rng.random(M))
    return X, y, Z, q_mu, q_sqrt


def nominal_gflop(M, B):
    return ((7.0 / 3.0) * M**3 + 10.0 * M**2 * B + 9.0 * D * (M**2 + M * B)) / 1e9


def own_gflop(M, B, path):
    """pygpfast's own flop count of the BLAS work (svgp.hpp), for one latent function."""
    if path == "precomputed":
        return (3.0 * M**2 * B + 8.0 * M**3) / 1e9
    return (8.0 * M**2 * B + 1.0 * M**3) / 1e9


def path_used(model, X, y, scale):
    codes, params = model.kernel._spec(D)
    return _core.svgp.elbo(codes, params, *model.likelihood._core_args(), Z=model.Z, q_mu=model.q_mu, q_sqrt=model.q_sqrt,
                           whiten=model.whiten, X=X, y=y, scale=scale, jitter=model.jitter, with_grad=True, return_path=True)[5]


def bench_pygpfast(grid, whiten, load):
    rows = []
    with common.background_load(load):
        for M, B in grid:
            X, y, Z, q_mu, q_sqrt = make_case(M, B)
            model = SVGP(kernels.RBF(variance=1.0, lengthscale=np.full(D, 2.0)),
                         likelihoods.Bernoulli(link="probit", n_gh=20), Z, q_mu, q_sqrt, whiten=whiten)
            # The kernel and likelihood in the core's form, made once as the optimisers make
            # them (and as the peers keep theirs in variables), not parsed again in every call.
            hyper = model.core_hyper()
            value, _ = model.elbo(X, y, scale=N_TOTAL / B, with_grad=True, hyper=hyper)
            t = common.time_calls(lambda: model.elbo(X, y, scale=N_TOTAL / B, with_grad=True, hyper=hyper),
                                  min_time=2.0, min_calls=20, warmup=3)
            rows.append({"M": M, "B": B, "whiten": whiten, "median_s": t["median"], "p10_s": t["p10"],
                         "p90_s": t["p90"], "calls": t["calls"], "elbo_per_datum": value / N_TOTAL,
                         "path": path_used(model, X, y, N_TOTAL / B)})
    return rows


def run_peers(peers_dir, peers_python, threads, grid, whiten):
    """The peers' own svgp_step driver in the same session; returns {backend: {key: row}}."""
    args = ["--threads", str(threads), "--backends", "gpflow,gpytorch", "--rounds", "1",
            "--grid", ",".join(f"{M}:{B}" for M, B in grid)] + ([] if whiten else ["--unwhitened"])
    res = common.run_peers_script(peers_dir, peers_python, "svgp_step.py", args)
    out = {}
    for backend, entries in res["combined"].items():
        for key, e in entries.items():
            if isinstance(e, dict) and "summary" in e:
                out.setdefault(backend, {})[key] = {"median_s": e["summary"]["median"],
                                                    "elbo_per_datum": e["elbo_per_datum"]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--grid", default="")
    ap.add_argument("--unwhitened", action="store_true")
    ap.add_argument("--load", action="store_true", help="keep one core busy with another process")
    ap.add_argument("--peers", default=None, help="directory of the peers' scripts (shared/peers)")
    ap.add_argument("--peers-python", default=None)
    args = ap.parse_args()
    grid = [tuple(int(v) for v in s.split(":")) for s in args.grid.split(",")] if args.grid else GRID
    whiten = not args.unwhitened

    pygpfast.set_num_threads(args.threads)
    gemm = common.gemm_rate(args.threads, n=4000)
    ctx = common.context(args.threads) | {"gemm_gflops": gemm, "background_load": args.load}
    rows = bench_pygpfast(grid, whiten, args.load)
    peers = {}
    if args.peers and args.peers_python:
        peers = run_peers(args.peers, args.peers_python, args.threads, grid, whiten)

    key = lambda M, B: f"{M}:{B}:{'w' if whiten else 'u'}"  # noqa: E731
    table_rows = []
    for r in rows:
        M, B = r["M"], r["B"]
        gf = nominal_gflop(M, B)
        row = {"M": M, "B": B, "path": r["path"], "pygpfast ms": 1e3 * r["median_s"],
               "p10-p90 ms": f"{1e3 * r['p10_s']:.3g}-{1e3 * r['p90_s']:.3g}",
               "frac GEMM": gf / r["median_s"] / gemm,
               "own GF/s": own_gflop(M, B, r["path"]) / r["median_s"], "ELBO/N": f"{r['elbo_per_datum']:.6f}"}
        best = None
        for b in ("gpflow", "gpytorch"):
            p = peers.get(b, {}).get(key(M, B))
            if p:
                row[f"{b} ms"] = 1e3 * p["median_s"]
                best = p["median_s"] if best is None else min(best, p["median_s"])
        if best is not None:
            row["speedup vs best peer"] = best / r["median_s"]
        table_rows.append(row)
    cols = ["M", "B", "path", "pygpfast ms", "p10-p90 ms", "frac GEMM", "own GF/s"]
    if peers:
        cols += ["gpflow ms", "gpytorch ms", "speedup vs best peer"]
    cols.append("ELBO/N")
    blas = ", ".join(f"{b['internal_api']} {b['version']}" for b in ctx["blas"])
    print(f"SVGP ELBO+grad step, D={D}, N={N_TOTAL}, probit/20 GH, "
          f"{'whitened' if whiten else 'unwhitened'}, threads={args.threads}, "
          f"load={'1 busy core' if args.load else 'none'}; CPU {ctx['cpu']}; BLAS {blas}; "
          f"GEMM {gemm:.1f} GFLOP/s")
    print(common.table(table_rows, cols))
    variant = f"t{args.threads}" + ("-unwhitened" if not whiten else "") + ("-load" if args.load else "") \
        + ("-peers" if peers else "") + ("-grid" if args.grid else "")
    print("wrote", common.write_json({"context": ctx, "rows": rows, "peers": peers, "table": table_rows}, variant))
    return 0


if __name__ == "__main__":
    sys.exit(main())
