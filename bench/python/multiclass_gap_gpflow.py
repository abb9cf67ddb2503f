"""GPflow's side of multiclass_gap.py: SVGP on scikit-learn's digits with the peers' split.

Run by multiclass_gap.py in the peers' Python (GPflow 2.11, TensorFlow CPU; shared/peers/README.md),
never imported by pygpfast. One JSON object per configuration on stdout, one per line.

Configurations (``--configs``, comma list of ``likelihood:kernel:z``):
  likelihood  robustmax  GPflow's MultiClass (RobustMax, epsilon 1e-3, fixed), 1-D Gauss-Hermite
              softmax    GPflow's Softmax with its Monte Carlo expectation replaced by a fixed set of
                         S standard-normal draws (common random numbers), so that the objective
                         L-BFGS sees is deterministic; predictions by 4096 fresh draws
  kernel      iso        SquaredExponential, one lengthscale, shared by the C latent functions
              ard        SquaredExponential with one lengthscale per input dimension, shared
  z           kmeans     k-means centres of the training inputs (scipy kmeans2, seed 0)
              random     M training rows drawn without replacement (seed 0)
Kernel start: lengthscale(s) ``--ls0`` (default 2.0) and variance ``--var0`` (default 4.0), the
peers' digits kernel (shared/peers/gpc_full.py).
Optimiser: gpflow.optimizers.Scipy (L-BFGS-B, compiled) on everything, ``--maxiter``.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def digits_data():
    """The peers' split (shared/peers/gpc_full.py digits_data)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    return train_test_split(d.data / 16.0, d.target, test_size=0.3, random_state=0)


class FixedDrawSoftmax:
    """Factory of a GPflow Softmax likelihood whose variational expectation averages log softmax
    over S fixed standard-normal draws per latent dimension (deterministic objective)."""

    @staticmethod
    def make(C, S, seed):
        import numpy as np
        import tensorflow as tf
        import gpflow

        eps = tf.constant(np.random.default_rng(seed).standard_normal((S, 1, C)))

        class _Softmax(gpflow.likelihoods.Softmax):
            def _variational_expectations(self, X, Fmu, Fvar, Y):
                F = Fmu[None] + tf.sqrt(Fvar)[None] * eps  # [S, N, C]
                lse = tf.reduce_logsumexp(F, axis=2)
                idx = tf.cast(Y[:, 0], tf.int32)
                f_y = tf.reduce_sum(F * tf.one_hot(idx, C, dtype=F.dtype)[None], axis=2)
                return tf.reduce_mean(f_y - lse, axis=0)

        return _Softmax(C)


def run(spec, data, args):
    import numpy as np
    import scipy.cluster.vq
    import tensorflow as tf
    import gpflow

    lik_name, kern_name, z_name = spec.split(":")
    Xtr, Xte, ytr, yte = data
    N, D = Xtr.shape
    C = 10
    M = args.M
    if z_name == "kmeans":
        Z0, _ = scipy.cluster.vq.kmeans2(Xtr, M, minit="++", seed=0)
    else:
        Z0 = Xtr[np.random.default_rng(0).choice(N, M, replace=False)]
    ls0 = np.full(D, args.ls0) if kern_name == "ard" else args.ls0
    kernel = gpflow.kernels.SquaredExponential(variance=args.var0, lengthscales=ls0)
    if lik_name == "robustmax":
        lik = gpflow.likelihoods.MultiClass(C)  # RobustMax, epsilon 1e-3 (not trained)
    else:
        lik = FixedDrawSoftmax.make(C, args.S, 0)
    model = gpflow.models.SVGP(kernel, lik, Z0.copy(), num_latent_gps=C, whiten=True)
    Y = ytr.reshape(-1, 1).astype(np.float64)
    loss = model.training_loss_closure((Xtr, Y), compile=True)
    t0 = time.perf_counter()
    res = gpflow.optimizers.Scipy().minimize(loss, model.trainable_variables,
                                             options={"maxiter": args.maxiter})
    fit_s = time.perf_counter() - t0
    mu, var = (t.numpy() for t in model.predict_f(Xte))
    if lik_name == "robustmax":
        P = model.likelihood.predict_mean_and_var(Xte, mu, var)[0].numpy()
    else:
        rng = np.random.default_rng(1)
        P = np.zeros_like(mu)
        for _ in range(16):  # 16 x 256 draws
            F = mu[None] + np.sqrt(var)[None] * rng.standard_normal((256,) + mu.shape)
            F -= F.max(axis=2, keepdims=True)
            E = np.exp(F)
            P += (E / E.sum(axis=2, keepdims=True)).mean(axis=0) / 16
    p_true = np.clip(P[np.arange(len(yte)), yte], 1e-12, 1.0)
    ls = np.atleast_1d(model.kernel.lengthscales.numpy())
    return {"peer": "gpflow", "config": spec, "M": M, "maxiter": args.maxiter,
            "S": args.S if lik_name == "softmax" else None,
            "nlpd": float(-np.mean(np.log(p_true))),
            "acc": float(np.mean(np.argmax(P, axis=1) == yte)),
            "elbo": float(-loss().numpy()), "nit": int(res.nit), "nfev": int(res.nfev),
            "success": bool(res.success), "message": str(res.message), "fit_s": fit_s,
            "kernel_variance": float(model.kernel.variance.numpy()),
            "lengthscale_median": float(np.median(ls)), "lengthscale_min": float(ls.min()),
            "mean_test_latent_var": float(var.mean()),
            "gpflow": gpflow.__version__, "tensorflow": tf.__version__}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="robustmax:iso:kmeans,softmax:iso:kmeans")
    ap.add_argument("--M", type=int, default=100)
    ap.add_argument("--maxiter", type=int, default=1000)
    ap.add_argument("--S", type=int, default=64, help="fixed draws of the softmax expectation")
    ap.add_argument("--ls0", type=float, default=2.0)
    ap.add_argument("--var0", type=float, default=4.0)
    args = ap.parse_args()
    data = digits_data()
    for spec in args.configs.split(","):
        print(json.dumps(run(spec, data, args)), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
