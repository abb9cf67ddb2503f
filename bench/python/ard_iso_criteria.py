"""Can a fit tell from its own training data whether one lengthscale per input (ARD) or one
shared lengthscale (isotropic) will predict better? Two criteria that need no refit, against
the hold-out NLPD: issue 26's "ARD/isotropic choice" (``ard_vs_iso.py`` showed that the MAP
objective picks the isotropic kernel almost everywhere).

Per split of the defaults table's binary sets (``defaults_table.load``), two fits of
``VGPClassifier()`` (logit, the default priors, random_state=0): the default ARD kernel, and
``RBF(1, l0)`` with l0 the geometric mean of the default kernel's starting lengthscales. For
each fit:

* ``laplace``: a Laplace approximation of the log evidence over the log hyperparameters,
  ``F + k/2 log(2 pi) - 1/2 log det H``, F = ``objective_`` (the bound plus the log prior at the
  fitted theta), H = minus the Hessian of F in theta by central differences (step 1e-3) of its
  gradient, each evaluation the inference warm-started at the fitted posterior (the envelope
  theorem's gradient, as the search uses). Eigenvalues of H below 1e-12 are clipped there.
* ``loo``: approximate leave-one-out log predictive density at the fitted hyperparameters
  from the Gaussian sites of the fitted posterior (Vehtari et al. 2016, JMLR 17): at training
  point i with marginal N(m_i, v_i), site precision lambda_i and m = mean + K alpha, the cavity
  is v_-i = 1 / (1 / v_i - lambda_i), m_-i = m_i - v_-i alpha_i, and the LOO density
  int sigmoid(s_i f) N(f | m_-i, v_-i) df by 40-node Gauss-Hermite quadrature.

Each criterion picks the kernel with the higher value; the hold-out NLPD (``defaults_table.scores``)
says which one was right. One thread.

Usage: nice python bench/python/ard_iso_criteria.py [--splits 3] [--datasets heart,sonar,...]
Writes bench/results/ard_iso_criteria.json.
"""

import argparse
import time

import numpy as np
from scipy.special import log_expit, logsumexp

import common
import defaults_table

import pygpfast
from pygpfast import kernels
from pygpfast._base import _start
from pygpfast.cvi import _estimators as cvi_estimators

#: the defaults table's binary sets
DATASETS = tuple(d for d in defaults_table.DATASETS if d not in ("glass", "usps10"))
_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(40)
_LOG_WEIGHTS = np.log(_WEIGHTS / np.sqrt(2.0 * np.pi))


class _KeepRun:
    """Keeps the last (run, theta) a VGP fit set its attributes from: the profile of the bound
    over the hyperparameters, for the Hessian."""

    def __enter__(self):
        self.original = cvi_estimators._VGPEstimator._set_fitted
        original = self.original

        def keep(est, run, theta):
            est._kept = (run, theta.copy())
            return original(est, run, theta)

        cvi_estimators._VGPEstimator._set_fitted = keep
        return self

    def __exit__(self, *exc):
        cvi_estimators._VGPEstimator._set_fitted = self.original


def laplace_evidence(est, step=1e-3):
    """(log evidence, smallest eigenvalue of H, k) of a fitted VGPClassifier."""
    run, theta = est._kept

    def gradient(t):
        _, grads = run.evaluate(t)
        return run.hyper.gradient(*grads)

    k = theta.size
    H = np.empty((k, k))
    for j in range(k):
        e = np.zeros(k)
        e[j] = step
        H[:, j] = -(gradient(theta + e) - gradient(theta - e)) / (2.0 * step)
    run.at(theta)
    w = np.linalg.eigvalsh(0.5 * (H + H.T))
    logdet = float(np.sum(np.log(np.maximum(w, 1e-12))))
    return est.objective_ + 0.5 * k * np.log(2.0 * np.pi) - 0.5 * logdet, float(w.min()), k


def loo_log_density(est, X, y):
    """Mean approximate LOO log predictive density over the training points."""
    m, v = est.predict_latent(X)
    alpha, lam = est.alpha_[:, 0], est.lambda_[:, 0]
    cavity_precision = 1.0 / v - lam
    vc = np.where(cavity_precision > 0, 1.0 / np.maximum(cavity_precision, 1e-300), np.inf)
    mc = m - vc * alpha
    f = mc[:, None] + np.sqrt(vc)[:, None] * _NODES[None, :]
    s = 2.0 * y - 1.0
    return float(np.mean(logsumexp(log_expit(s[:, None] * f) + _LOG_WEIGHTS, axis=1)))


def fit(kernel, Xtr, ytr, Xte, yte):
    est = pygpfast.VGPClassifier(kernel=kernel, random_state=0)
    _, cpu, _ = defaults_table.timed_fit(est, Xtr, ytr)
    t0 = time.process_time()
    evidence, eig_min, k = laplace_evidence(est)
    return {**defaults_table.scores(est.predict_proba(Xte), yte), "objective": est.objective_,
            "laplace": evidence, "hessian_eig_min": eig_min, "k": k,
            "loo": loo_log_density(est, Xtr, ytr), "fit_cpu_s": cpu,
            "criteria_cpu_s": time.process_time() - t0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", type=int, default=3)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    args = ap.parse_args()
    pygpfast.set_num_threads(1)
    runs, summary = [], []
    with _KeepRun():
        for name, splits in defaults_table.loaded(args.datasets, args.splits):
            for k, (Xtr, ytr, Xte, yte) in enumerate(splits):
                l0 = float(np.exp(np.mean(np.log(_start.default_kernel(Xtr, 0).lengthscale))))
                row = {"dataset": name, "split": k, "N": len(ytr), "D": Xtr.shape[1],
                       "ard": fit(None, Xtr, ytr, Xte, yte),
                       "iso": fit(kernels.RBF(1.0, l0), Xtr, ytr, Xte, yte)}
                row["better"] = "iso" if row["iso"]["nlpd"] < row["ard"]["nlpd"] else "ard"
                for crit in ("objective", "laplace", "loo"):
                    row[f"pick_{crit}"] = "iso" if row["iso"][crit] > row["ard"][crit] else "ard"
                runs.append(row)
                print({key: row[key] for key in ("dataset", "split", "better", "pick_objective",
                                                 "pick_laplace", "pick_loo")},
                      {c: round(row[c]["nlpd"], 4) for c in ("ard", "iso")}, flush=True)
            sel = [r for r in runs if r["dataset"] == name]
            entry = {"dataset": name, "N / D": f"{sel[0]['N']} / {sel[0]['D']}"}
            for c in ("ard", "iso"):
                entry[c] = float(np.median([r[c]["nlpd"] for r in sel]))
            for crit in ("objective", "laplace", "loo"):
                entry[crit] = float(np.median([r[r[f"pick_{crit}"]]["nlpd"] for r in sel]))
                entry[f"{crit} right"] = sum(r[f"pick_{crit}"] == r["better"] for r in sel)
            entry["loo - hold-out (ard)"] = float(np.median([-r["ard"]["loo"] - r["ard"]["nlpd"]
                                                             for r in sel]))
            summary.append(entry)
    cols = ["dataset", "N / D", "ard", "iso", "objective", "objective right", "laplace",
            "laplace right", "loo", "loo right", "loo - hold-out (ard)"]
    print(common.table(summary, cols))
    right = {crit: sum(r[f"pick_{crit}"] == r["better"] for r in runs)
             for crit in ("objective", "laplace", "loo")}
    print("right picks of", len(runs), right)
    print("wrote", common.write_json({"args": vars(args), "runs": runs, "summary": summary,
                                      "right_picks": right, "fits": len(runs)}, threads=1))


if __name__ == "__main__":
    main()
