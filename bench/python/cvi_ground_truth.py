"""Poisson and ordinal regression by concave variational inference on data with a known truth.

Replicated synthetic data sets (``--reps``, different seeds), N points on [-3, 3] (1-D input):

* Poisson: y ~ Poisson(exp(f(x))), f(x) = 1 + cos(x); VGPPoissonRegressor with a learned RBF
  kernel and constant prior mean.
* ordinal: K = 4 classes, p(y <= k | x) = sigmoid(phi_k - f(x)), f(x) = 2 sin(x),
  phi = (-1.5, 0, 1.5); VGPClassifier(likelihood="ordinal") with learned kernel and thresholds.

Reported per model: the coverage of the true latent function by the posterior's 95% intervals
(mean +- 1.96 sd of q at 200 grid points), the RMSE of the posterior mean, and for the ordinal
model the learned thresholds as mean +- standard deviation over the replicates (their error bars)
next to the truth.

Usage: python bench/python/cvi_ground_truth.py [--n 500] [--reps 10]
Writes bench/results/cvi_ground_truth.json.
"""

import argparse

import numpy as np
from scipy import special

import common

import pygpfast
from pygpfast.kernels import RBF

PHI = np.array([-1.5, 0.0, 1.5])


def poisson_rep(n, seed, grid):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 1))
    y = rng.poisson(np.exp(1.0 + np.cos(X[:, 0])))
    reg = pygpfast.VGPPoissonRegressor(kernel=RBF(variance=1.0, lengthscale=1.0),
                                       random_state=seed).fit(X, y)
    mean, var = reg.predict_latent(grid)  # one latent function: [n_grid]
    return mean, np.sqrt(var), 1.0 + np.cos(grid[:, 0]), {}


def ordinal_rep(n, seed, grid):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, size=(n, 1))
    f = 2.0 * np.sin(X[:, 0])
    y = (rng.random(n)[:, None] > special.expit(PHI[None, :] - f[:, None])).sum(1)
    clf = pygpfast.VGPClassifier(likelihood="ordinal", kernel=RBF(variance=2.0, lengthscale=1.0),
                                 random_state=seed).fit(X, y)
    mean, var = clf.predict_latent(grid)
    return mean, np.sqrt(var), 2.0 * np.sin(grid[:, 0]), {
        "thresholds": clf.local_bound_.thresholds.tolist()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    grid = np.linspace(-2.9, 2.9, 200)[:, None]
    out = {"context": common.context(pygpfast.get_num_threads()), "n": args.n, "reps": args.reps}
    for name, fn in (("poisson", poisson_rep), ("ordinal", ordinal_rep)):
        cover, rmse, extra = [], [], []
        for rep in range(args.reps):
            mean, sd, truth, more = fn(args.n, rep, grid)
            cover.append(float(np.mean(np.abs(mean - truth) <= 1.96 * sd)))
            rmse.append(float(np.sqrt(np.mean((mean - truth) ** 2))))
            extra.append(more)
        res = {"coverage_95": cover, "rmse": rmse}
        line = (f"{name}: coverage of the truth by the 95% intervals {np.mean(cover):.3f} "
                f"(min {np.min(cover):.3f}), RMSE of the latent mean {np.mean(rmse):.3f}")
        if name == "ordinal":
            phis = np.array([e["thresholds"] for e in extra])
            res["thresholds"] = phis.tolist()
            mu, sd = phis.mean(0), phis.std(0, ddof=1)
            res["thresholds_mean"], res["thresholds_sd"] = mu.tolist(), sd.tolist()
            line += "; thresholds " + ", ".join(
                f"{m:.3f} +- {s:.3f} (true {t:g})" for m, s, t in zip(mu, sd, PHI))
        out[name] = res
        print(line, flush=True)
    print("wrote", common.write_json(out))


if __name__ == "__main__":
    main()
