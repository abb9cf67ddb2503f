"""GPflow's side of defaults_table.py: SVGP on the splits that defaults_table.py wrote.

Run by defaults_table.py in the peers' Python (GPflow 2.11, TensorFlow CPU; shared/peers/README.md),
never imported by pygpfast. Reads ``--data`` (an .npz with ``Xtr_<k>, ytr_<k>, Xte_<k>, yte_<k>``
for k = 0 .. n_splits - 1, features already standardised, labels 0 .. C - 1) and prints one JSON
object per (split, kernel) on stdout, one per line.

The recipe of multiclass_gap_gpflow.py: ``gpflow.models.SVGP`` with whitened q(u), M inducing
inputs (``--M``, default 100, at most the training rows) started at the k-means centres of the
training inputs (scipy kmeans2, k-means++, seed 0; all rows when M >= N) and trained, a
SquaredExponential kernel started at lengthscale(s) ``--ls0`` (2.0) and variance ``--var0`` (4.0),
the peers' kernel (shared/peers/gpc_full.py), one lengthscale ('iso') or one per input ('ard')
(``--kernels``); Bernoulli likelihood (GPflow's probit, clipped to [1e-3, 1 - 1e-3]) for two
classes, MultiClass (robust-max, epsilon 1e-3, fixed) for C > 2; every parameter by
gpflow.optimizers.Scipy (L-BFGS-B, compiled), ``--maxiter`` (1000). The fit time includes the
tracing of the compiled loss. One TensorFlow thread (intra- and inter-op).
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def fit_one(Xtr, ytr, Xte, yte, C, kernel_name, args):
    import numpy as np
    import scipy.cluster.vq
    import gpflow

    N, D = Xtr.shape
    M = min(args.M, N)
    if M < N:
        Z0, _ = scipy.cluster.vq.kmeans2(Xtr, M, minit="++", seed=0)
    else:
        Z0 = Xtr.copy()
    ls0 = np.full(D, args.ls0) if kernel_name == "ard" else args.ls0
    kernel = gpflow.kernels.SquaredExponential(variance=args.var0, lengthscales=ls0)
    if C == 2:
        lik, L = gpflow.likelihoods.Bernoulli(), 1
    else:
        lik, L = gpflow.likelihoods.MultiClass(C), C
    model = gpflow.models.SVGP(kernel, lik, Z0, num_latent_gps=L, whiten=True)
    Y = ytr.reshape(-1, 1).astype(np.float64)
    t0, c0 = time.perf_counter(), time.process_time()
    loss = model.training_loss_closure((Xtr, Y), compile=True)
    res = gpflow.optimizers.Scipy().minimize(loss, model.trainable_variables,
                                             options={"maxiter": args.maxiter})
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    P = model.predict_y(Xte)[0].numpy()
    if C == 2:
        P = np.column_stack([1.0 - P[:, 0], P[:, 0]])
    p_true = np.clip(P[np.arange(len(yte)), yte], 1e-12, 1.0)
    ls = np.atleast_1d(model.kernel.lengthscales.numpy())
    return {"M": M, "nlpd": float(-np.mean(np.log(p_true))),
            "accuracy": float(np.mean(np.argmax(P, axis=1) == yte)),
            "fit_wall_s": wall, "fit_cpu_s": cpu, "nit": int(res.nit), "success": bool(res.success),
            "message": str(res.message), "elbo": float(-loss().numpy()),
            "kernel_variance": float(model.kernel.variance.numpy()),
            "lengthscale_min": float(ls.min()), "lengthscale_median": float(np.median(ls)),
            "lengthscale_max": float(ls.max())}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--kernels", default="iso")
    ap.add_argument("--M", type=int, default=100)
    ap.add_argument("--maxiter", type=int, default=1000)
    ap.add_argument("--ls0", type=float, default=2.0)
    ap.add_argument("--var0", type=float, default=4.0)
    args = ap.parse_args()
    import numpy as np
    import tensorflow as tf
    import gpflow

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    d = np.load(args.data)
    # (the splits' own numbers: a resumed run sends only the missing ones)
    splits = sorted(int(name[len("Xtr_"):]) for name in d.files if name.startswith("Xtr_"))
    C = int(d["n_classes"])
    for k in splits:
        arrays = (np.asarray(d[f"{part}_{k}"]) for part in ("Xtr", "ytr", "Xte", "yte"))
        Xtr, ytr, Xte, yte = arrays
        for kernel_name in args.kernels.split(","):
            row = fit_one(Xtr.astype(np.float64), ytr.astype(int), Xte.astype(np.float64),
                          yte.astype(int), C, kernel_name, args)
            row.update(split=k, config=f"gpflow_svgp_{kernel_name}", gpflow=gpflow.__version__,
                       tensorflow=tf.__version__)
            print(json.dumps(row), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
