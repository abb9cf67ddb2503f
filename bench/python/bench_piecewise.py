"""Throughput of the expected piecewise bound E[B(x)], x ~ N(m, v), with d/dm and d/dv.

pygpfast's core (one erfc and one exp per breakpoint and point, OpenMP over points) against a
vectorised numpy/scipy implementation of the same closed form (truncated-Gaussian moments and
jump terms), processed in blocks of points so that its [block, R] temporaries stay in cache. Both
are run in the same process on the same (m, v), their calls alternating (the machine may be
shared), and their results are compared as a sanity check. Medians and minima are reported.

Usage: python bench/python/bench_piecewise.py [--threads 1,2] [--n 1000000] [--rounds 7] [--load]
"""

import argparse
import sys
import time

import numpy as np
from scipy.special import erfc

import common

import pygpfast
from pygpfast.piecewise import expected_llp_bound, llp_bound

INV_SQRT_2PI = 1.0 / np.sqrt(2.0 * np.pi)


def numpy_expected_bound(bound, m, v, block=16384):
    """The core's formula in numpy, v > 0: (value, dm, dv) [N]."""
    t, a, b, c = bound.knots[1:-1], bound.a, bound.b, bound.c
    dq = (a[1:] - a[:-1]) * t * t + (b[1:] - b[:-1]) * t + (c[1:] - c[:-1])  # jumps at t
    dslope = 2.0 * (a[1:] - a[:-1]) * t + (b[1:] - b[:-1])
    value, dm, dv = np.empty_like(m), np.empty_like(m), np.empty_like(m)
    for start in range(0, m.shape[0], block):
        sl = slice(start, start + block)
        mb, vb = m[sl, None], v[sl, None]
        s = np.sqrt(vb)
        z = (t - mb) / s                      # [B, R-1]
        phi = INV_SQRT_2PI * np.exp(-0.5 * z * z)
        tail = 0.5 * erfc(np.abs(z) / np.sqrt(2.0))
        ones, zeros = np.ones_like(mb), np.zeros_like(mb)
        lo_tail, hi_tail = np.hstack([zeros, tail]), np.hstack([tail, zeros])
        lo_z, hi_z = np.hstack([-np.inf * ones, z]), np.hstack([z, np.inf * ones])
        # Mass per piece from the small tails (no 1 - Phi cancellation), as in the core.
        m0 = np.where(lo_z >= 0.0, lo_tail - hi_tail,
                      np.where(hi_z <= 0.0, hi_tail - lo_tail, 1.0 - lo_tail - hi_tail))
        lo_phi, hi_phi = np.hstack([zeros, phi]), np.hstack([phi, zeros])
        zphi = z * phi
        lo_zphi, hi_zphi = np.hstack([zeros, zphi]), np.hstack([zphi, zeros])
        dphi = lo_phi - hi_phi
        slope_m = 2.0 * a * mb + b
        q_m = (a * mb + b) * mb + c
        value[sl] = (((q_m + a * vb) * m0 + s * slope_m * dphi + a * vb * (lo_zphi - hi_zphi))
                     .sum(1))
        dm[sl] = (slope_m * m0 + 2.0 * a * s * dphi).sum(1) + (phi * dq).sum(1) / s[:, 0]
        dv[sl] = ((a * m0).sum(1)
                  + 0.5 * (phi * (dq * z / s + dslope)).sum(1) / s[:, 0])
    return value, dm, dv


def interleaved(fns, rounds):
    """Time each of fns once per round, alternating, so that a shared machine's changing load
    hits them alike; median and min (s) per function."""
    for fn in fns:
        fn()  # warm-up
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, t in zip(fns, times):
            start = time.perf_counter()
            fn()
            t.append(time.perf_counter() - start)
    return [{"median": float(np.median(t)), "min": float(np.min(t)), "calls": len(t)}
            for t in times]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=7, help="alternating timings per method")
    ap.add_argument("--load", action="store_true", help="keep one core busy with another process")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    m = rng.uniform(-10.0, 10.0, args.n)
    v = np.exp(rng.uniform(np.log(1e-3), np.log(10.0), args.n))
    rows, runs = [], []
    for kind, R in [("quadratic", 20), ("quadratic", 5), ("linear", 20)]:
        bound = llp_bound(R, kind)
        ref = numpy_expected_bound(bound, m, v)
        for T in [int(t) for t in args.threads.split(",")]:
            pygpfast.set_num_threads(T)
            with common.background_load(args.load):
                ctx = common.context(T) | {"background_load": args.load}
                ours = expected_llp_bound(bound, m, v)
                diff = max(float(np.max(np.abs(x - y) / (1.0 + np.abs(y))))
                           for x, y in zip(ours, ref))
                t_core, t_numpy = interleaved(
                    [lambda: expected_llp_bound(bound, m, v),
                     lambda: numpy_expected_bound(bound, m, v)], args.rounds)
            row = {
                "bound": f"{kind} R={R}", "N": args.n, "threads": T,
                "pygpfast ms": 1e3 * t_core["median"], "numpy ms": 1e3 * t_numpy["median"],
                "speedup": t_numpy["median"] / t_core["median"],
                "pygpfast min ms": 1e3 * t_core["min"], "numpy min ms": 1e3 * t_numpy["min"],
                "Mpoints/s": args.n / t_core["min"] / 1e6,
                "max rel diff": diff,
            }
            rows.append(row)
            runs.append({"context": ctx, "row": row, "core": t_core, "numpy": t_numpy})
            print(f"{row['bound']}, threads={T}: pygpfast {row['pygpfast ms']:.1f} ms, "
                  f"numpy {row['numpy ms']:.1f} ms, x{row['speedup']:.1f}, diff {diff:.1e}",
                  flush=True)
    ctx = runs[0]["context"]
    print(f"\nCPU {ctx['cpu']}, {ctx['cores']} cores, load avg {ctx['loadavg']}\n")
    print(common.table(rows, ["bound", "N", "threads", "pygpfast ms", "numpy ms", "speedup",
                              "pygpfast min ms", "numpy min ms", "Mpoints/s", "max rel diff"]))
    print("\nwrote", common.write_json({"runs": runs}, "load" if args.load else None,
                                            threads=max(int(t) for t in args.threads.split(","))))
    pygpfast.set_num_threads(None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
