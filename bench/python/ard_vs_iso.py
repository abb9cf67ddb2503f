"""One lengthscale per input (ARD, the default kernel) against one shared lengthscale
(isotropic), for SVGPClassifier() with the default priors, on the defaults table's data sets:
the evidence for issue 26's "ARD/isotropic choice".

Per split (defaults_table.load: the Ratsch splits, or stratified 70/30 with seed = split;
StandardScaler on the training part), each fitted from random_state=0:

* ``ard``: ``SVGPClassifier()``, the default kernel (RBF, one lengthscale per input started at
  the median-distance heuristic, default priors);
* ``iso``: ``SVGPClassifier(kernel=RBF(1, l0))``, one lengthscale started at the geometric mean
  l0 of the default kernel's (the default priors attach to it as to the default kernel);
* ``pick``: of the two fits, the one with the higher ``objective_`` (ELBO plus the priors' log
  density: the MAP objective; no further fit);
* ``corr`` (``--correlated RHO``): the default kernel with its lengthscales' independent
  log-normal priors replaced by one correlated Gaussian on theta = log l,
  N(loc, (1 - RHO) 3 I + RHO 3 11^T): the same marginal per lengthscale (Hvarfner et al.'s
  variance 3), the lengthscales pulled towards a common level (an ARD kernel shrunk towards an
  isotropic one); defined here, not in the package.

Hold-out NLPD (mean -log p(y* | x*), p clipped at 1e-12), accuracy, objective_, log_prior_ and
fit CPU time. One thread.

Usage: nice python bench/python/ard_vs_iso.py [--splits 3] [--datasets heart,sonar,...]
       [--correlated 0.9]
Writes bench/results/ard_vs_iso.json.
"""

import argparse

import numpy as np

import common
import defaults_table

import pygpfast
from pygpfast import kernels
from pygpfast._base import _priors, _start
from pygpfast.priors import LogNormal, Prior

#: every classification set of the defaults table but USPS-10 (a softmax SVGP fit of minutes)
DATASETS = tuple(d for d in defaults_table.DATASETS if d != "usps10")


class CorrelatedLogNormal(Prior):
    """theta = log l [D] ~ N(loc, t2 I + s2 11^T), t2 = (1 - rho) total, s2 = rho total."""

    def __init__(self, loc, total=3.0, rho=0.9):
        self.loc = np.asarray(loc, dtype=np.float64)
        self.t2, self.s2 = (1.0 - rho) * total, rho * total

    def _residual(self, theta):
        r = np.asarray(theta, dtype=np.float64) - self.loc
        return r, r.size, self.s2 / (self.t2 + r.size * self.s2)

    def log_density(self, theta):
        r, D, c = self._residual(theta)
        quad = (r @ r - c * r.sum() ** 2) / self.t2
        logdet = (D - 1) * np.log(self.t2) + np.log(self.t2 + D * self.s2)
        return -0.5 * (quad + logdet + D * np.log(2.0 * np.pi))

    def grad(self, theta):
        r, _, c = self._residual(theta)
        return -(r - c * r.sum()) / self.t2


def correlated_defaults(rho):
    """A replacement for _priors.attach_default_priors that swaps the ARD lengthscales'
    independent default priors for CorrelatedLogNormal(loc, scale^2, rho)."""
    attach = _priors.attach_default_priors

    def attach_correlated(kernel, X, scale=1.0):
        kernel = attach(kernel, X, scale)
        for leaf, _ in _priors.stationary_leaves(kernel):
            prior = leaf.priors.get("lengthscale")
            if isinstance(prior, LogNormal) and np.ndim(prior.loc):
                leaf.priors = {**leaf.priors, "lengthscale": CorrelatedLogNormal(
                    prior.loc, float(np.max(prior.scale)) ** 2, rho)}
        return kernel

    return attach, attach_correlated


def fit(kernel, Xtr, ytr, Xte, yte):
    est = pygpfast.SVGPClassifier(kernel=kernel, random_state=0)
    _, cpu, _ = defaults_table.timed_fit(est, Xtr, ytr)
    return {**defaults_table.scores(est.predict_proba(Xte), yte),
            "objective": float(est.objective_), "log_prior": float(est.log_prior_), "cpu": cpu}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", type=int, default=3)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--correlated", type=float, default=None, metavar="RHO")
    args = ap.parse_args()
    pygpfast.set_num_threads(1)
    runs, summary = [], []
    for name, splits in defaults_table.loaded(args.datasets, args.splits):
        for k, (Xtr, ytr, Xte, yte) in enumerate(splits):
            D = Xtr.shape[1]
            l0 = float(np.exp(np.mean(np.log(_start.default_kernel(Xtr, 0).lengthscale))))
            row = {"dataset": name, "split": k, "N": len(ytr), "D": D,
                   "C": int(len(np.unique(ytr))), "iso_start": l0,
                   "ard": fit(None, Xtr, ytr, Xte, yte),
                   "iso": fit(kernels.RBF(1.0, l0), Xtr, ytr, Xte, yte)}
            row["pick"] = "iso" if row["iso"]["objective"] > row["ard"]["objective"] else "ard"
            if args.correlated is not None:
                attach, correlated = correlated_defaults(args.correlated)
                _priors.attach_default_priors = correlated
                try:
                    row["corr"] = fit(None, Xtr, ytr, Xte, yte)
                finally:
                    _priors.attach_default_priors = attach
            runs.append(row)
        sel = [r for r in runs if r["dataset"] == name]
        med = {c: float(np.median([r[c]["nlpd"] for r in sel])) for c in ("ard", "iso")}
        entry = {"dataset": name, "N / D / C": f"{sel[0]['N']} / {sel[0]['D']} / {sel[0]['C']}",
                 "splits": len(sel), "ard": med["ard"], "iso": med["iso"],
                 "pick": float(np.median([r[r["pick"]]["nlpd"] for r in sel])),
                 "picked iso": sum(r["pick"] == "iso" for r in sel),
                 "iso - ard": med["iso"] - med["ard"],
                 "CPU ard / iso (s)": f"{np.median([r['ard']['cpu'] for r in sel]):.2f} / "
                                      f"{np.median([r['iso']['cpu'] for r in sel]):.2f}"}
        if args.correlated is not None:
            entry["corr"] = float(np.median([r["corr"]["nlpd"] for r in sel]))
        summary.append(entry)
        print(entry, flush=True)
    cols = ["dataset", "N / D / C", "splits", "ard", "iso", "iso - ard", "pick", "picked iso"]
    if args.correlated is not None:
        cols.append("corr")
    print(common.table(summary, cols + ["CPU ard / iso (s)"]))
    print("wrote", common.write_json({"args": vars(args), "runs": runs, "summary": summary},
                                     threads=1))


if __name__ == "__main__":
    main()
