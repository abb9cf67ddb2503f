"""IS-MOE on Dask (seed 003's embarrassingly parallel loop): bytes sent per fit and per
prediction, speed-up from 1 to 2 threads and from 1 to 2 Dask workers on this machine, and a
projection to many workers.

Bytes are the pickled sizes of what crosses the network: the scattered training data (X, the
standardised X for the proposal, y; once per worker), each task's arguments (the config and its
sample indices) and each task's result: its log weights, then the experts (for prediction) of
the samples within 1e16 of the running largest weight only.
Prediction runs in the driver from the fitted state: no bytes cross the network.

Data: the 10 000 x 100 synthetic set of section 4.1.2 (inputs only matter for the timing);
ISMOERegressor with K = 10, J = 32, B = 1000, isotropic RBF.

Usage: python bench/python/ismoe_dask.py [--samples 32] [--rows 10000]
"""

import argparse
import pickle
import time
import warnings

import numpy as np

import common
import svgp_common
import pygpfast
from ismoe_table2 import gmm_inputs
from pygpfast import ISMOERegressor
from pygpfast.kernels import RBF


def timed_fit(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = ISMOERegressor(**kw)
        t0 = time.perf_counter()
        m.fit(_X, _y)
        return time.perf_counter() - t0, m


def main():
    global _X, _y
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--rows", type=int, default=10000)
    args = ap.parse_args()
    ctx = svgp_common.start(2)
    rng = np.random.default_rng(0)
    _X = gmm_inputs(rng, args.rows)
    _y = np.sin(_X[:, 0] / 3) + np.cos(_X[:, 1] / 3) + 0.5 * rng.standard_normal(args.rows)
    J, per = args.samples, 4
    kw = dict(kernel=RBF(lengthscale=20.0), n_experts=10, n_samples=J, batch_size=1000,
              samples_per_iteration=per, random_state=0)
    out = {"args": vars(args)}

    # bytes: what run_chunks sends and receives
    from pygpfast.moe import _engine

    _, ref = timed_fit(**kw)
    Xs = (_X - ref.x_mean_) / ref.x_scale_
    scattered = sum(len(pickle.dumps(a, protocol=5)) for a in (_X, Xs, _y))
    cfg_bytes = []
    result_bytes = []
    m = ISMOERegressor(**kw)
    cfg = None
    # rebuild the config as fit does and run the chunks here, sizing each payload
    import math
    from pygpfast.moe import _proposal

    codes, params0 = RBF(lengthscale=20.0)._spec(_X.shape[1])
    theta0 = np.log(params0)
    cfg = _engine.Config(
        codes=codes, params0=params0, likelihood="gaussian", K=10, B=1000, partition="gmm",
        prior=_proposal.Prior.default(10, _X.shape[1]), seed=0, gamma=1.0, share=False,
        optimize=True, noise0=0.1, lower=np.r_[theta0 - math.log(1e3), math.log(1e-4), -10],
        upper=np.r_[theta0 + math.log(1e3), math.log(10), 10], max_iter=200, tol=1e-9,
        jitter=1e-6, min_block_size=10, fit_mean=True)
    ys = (_y - _y.mean()) / _y.std()
    top = -np.inf
    full_bytes = []
    for a in range(0, J, per):
        chunk = list(range(a, min(a + per, J)))
        cfg_bytes.append(len(pickle.dumps((cfg, chunk), protocol=5)))
        res = _engine.fit_chunk(_X, Xs, ys, cfg, chunk)
        full_bytes.append(len(pickle.dumps(res, protocol=5)))
        # what comes back: the log weights, then the experts of the samples still in reach of
        # the running maximum (ISMOERegressor's Dask path)
        top = max(top, res["log_weight"].max())
        keep = res["log_weight"] >= top - _engine.PRUNE_LOG_RATIO
        result_bytes.append(len(pickle.dumps(res["log_weight"], protocol=5))
                            + len(pickle.dumps(_engine.select_samples(res, keep), protocol=5)))
    fitted_state = len(pickle.dumps(ref.experts_, protocol=5))
    bytes_row = {"scattered per worker": scattered, "task arguments (all tasks)": sum(cfg_bytes),
                 "results sent back (all tasks)": sum(result_bytes),
                 "results if every sample's experts came back": sum(full_bytes),
                 "results per sample": sum(result_bytes) / J,
                 "fitted state kept (pruned)": fitted_state, "prediction": 0}
    out["bytes"] = bytes_row
    print(f"\nBytes per fit (N = {args.rows}, D = 100, J = {J}, K = 10, B = 1000)")
    print(common.table([{k: f"{v / 1e6:.3f} MB" for k, v in bytes_row.items()}], list(bytes_row)))

    rows = []
    for n in (1, 2):
        pygpfast.set_num_threads(n)
        t, _ = timed_fit(**kw)
        rows.append({"backend": f"threads x{n}", "fit s": t})
    pygpfast.set_num_threads(1)
    from distributed import Client, LocalCluster

    for workers in (1, 2):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   host="127.0.0.1", dashboard_address=None)
            client = Client(cluster)
            client.run(lambda: pygpfast.set_num_threads(1))
            t0 = time.perf_counter()
            t, m = timed_fit(client=client, **kw)
            same = bool(np.array_equal(m.log_weights_, ref.log_weights_))
            client.close()
            cluster.close()
        rows.append({"backend": f"dask x{workers} workers", "fit s": t, "equal to threads": same})
    pygpfast.set_num_threads(None)
    base_t, base_d = rows[0]["fit s"], rows[2]["fit s"]
    rows[1]["speed-up"] = base_t / rows[1]["fit s"]
    rows[3]["speed-up"] = base_d / rows[3]["fit s"]
    out["speed"] = rows
    print("\nSpeed-up (wall time of one fit; the machine is shared, see loadavg)")
    print(common.table(rows, ["backend", "fit s", "speed-up", "equal to threads"]))
    # projection: per-sample work t_s (threads x1), a fixed driver+scatter cost c = dask x1 - t_s J
    t_sample = base_t / J
    overhead = max(base_d - base_t, 0.0)
    proj = []
    for W in (1, 2, 8, 32, 128):
        tasks = math.ceil(J / per)
        waves = math.ceil(tasks / W)
        proj.append({"workers": W, "J": J, "projected fit s": overhead + waves * per * t_sample,
                     "projected s at J=1024 (chunks of 4)":
                     overhead + math.ceil(1024 / per / W) * per * t_sample})
    out["projection"] = {"seconds per sample": t_sample, "fixed overhead s": overhead, "rows": proj}
    print(f"\nProjection: {t_sample:.3f} s per sample on one core, {overhead:.2f} s fixed "
          "(cluster round trips, scatter); tasks of 4 samples in waves over W workers")
    print(common.table(proj, list(proj[0])))
    svgp_common.finish(None, ctx, out)


if __name__ == "__main__":
    main()
