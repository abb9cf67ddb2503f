"""The joint IVM's two cubature rules on real marginals: the 3-point Gauss-Hermite product (3^C
nodes, positive weights) and Stroud's degree-5 rule (2 C^2 + 1 nodes, negative weights from
C = 5 on), against a dense reference, on the marginals of fitted joint IVMs (seed 002's Table 1
set-up, even MNIST digits, C = 5).

Marginals: `IVMClassifier` fitted as in ivm_table1.py (per-class RBF + constant, 30 L-BFGS-B
iterations, the default rule), then the posterior marginals N(h_j, A_j) [C, C] of its training
points (what the section-4 bound integrates; the cavities the selection scores and projects are
of the same kind) and of its test points (what the prediction integrates), intercepts added, with
the true labels. Quantities, per point: the tilted (ADF) moments of the selection, log Z, mean
and covariance of N(h, A) p(y | u) / Z; the bound's data term E[-log p(y | u)] with its gradient
g_h; the predictive probabilities E[softmax(u + beta)]. Reference: the 10-point Gauss-Hermite
product (10^C nodes), its own error bounded by the 12-point product's distance on a subset.
Cost: the core's per-point time on one thread (`_core.ivm.multiclass_tilted`,
`multiclass_expected_nll`).

Usage: python bench/python/ivm_cubature.py [--tasks train5,train8] [--points 600]
(writes bench/results/ivm_cubature.json)
"""

import argparse
import itertools
import time

import numpy as np

import common
from ivm_table1 import TASKS, load_even_mnist, paper_kernel

import pygpfast
from pygpfast import IVMClassifier, _core
from pygpfast.ivm._estimators import _joint_spec

RULES = {"gauss-hermite": 0, "stroud": 1}


def product_rule(points, C):
    x, w = np.polynomial.hermite.hermgauss(points)
    x, w = x * np.sqrt(2.0), w / np.sqrt(np.pi)
    nodes = np.array(list(itertools.product(x, repeat=C)))
    weights = np.prod(np.array(list(itertools.product(w, repeat=C))), axis=1)
    return nodes, weights


def reference(h, A, y, beta, points):
    """Dense product-rule values per point: log Z, tilted mean and cov, E[-log p], g_h, E[softmax]."""
    m, C = h.shape
    z, w = product_rule(points, C)
    out = {k: [] for k in ("log_Z", "mean", "cov", "nll", "g_h", "prob")}
    for j in range(m):
        L = np.linalg.cholesky(A[j])
        u = h[j] + z @ L.T
        v = u + beta
        vmax = v.max(1, keepdims=True)
        lse = (vmax + np.log(np.exp(v - vmax).sum(1, keepdims=True)))[:, 0]
        logp = v[:, y[j]] - lse
        soft = np.exp(v - lse[:, None])
        p = np.exp(logp)
        Z = w @ p
        mean = (w * p) @ u / Z
        d = u - mean
        cov = (d.T * (w * p)) @ d / Z
        out["log_Z"].append(np.log(Z))
        out["mean"].append(mean)
        out["cov"].append(cov)
        out["nll"].append(-(w @ logp))
        # d/dh E[-log p(y | u)] = E[softmax(u + beta) - e_y]
        g = w @ soft
        out["prob"].append(g)
        e = np.zeros(C)
        e[y[j]] = 1.0
        out["g_h"].append(g - e)
    return {k: np.asarray(v) for k, v in out.items()}


def by_rule(h, A, y, beta, rule):
    """The core's values by `rule`, and its CPU time per point (one thread)."""
    t0 = time.process_time()
    tilted = _core.ivm.multiclass_tilted(h, A, y.astype(np.float64), beta=beta, rule=rule)
    t1 = time.process_time()
    nll = _core.ivm.multiclass_expected_nll(h, A, y.astype(np.float64), beta=beta, rule=rule)
    t2 = time.process_time()
    return ({"log_Z": tilted["log_Z"], "mean": tilted["mean"], "cov": tilted["cov"], "nll": nll["value"],
             "g_h": nll["g_h"], "prob": tilted["p_cavity"], "valid": tilted["valid"]},
            {"tilted_us": 1e6 * (t1 - t0) / len(h), "expected_nll_us": 1e6 * (t2 - t1) / len(h)})


def errors(got, want, valid):
    """Per quantity: the largest absolute entry error per point, over the points whose moments the rule gave."""
    out = {}
    for k in ("log_Z", "mean", "cov", "nll", "g_h", "prob"):
        e = np.abs(np.asarray(got[k]) - want[k]).reshape(len(want[k]), -1).max(1)[valid]
        out[k] = {"median": float(np.median(e)), "p90": float(np.quantile(e, 0.9)), "max": float(e.max())}
    return out


def marginals(task, X, y, draw, rs_points, points):
    n, m, d, _ = TASKS[task]
    rng = np.random.default_rng(draw)
    perm = rng.permutation(len(X))
    tr, te = perm[:n], perm[n:n + m]
    clf = IVMClassifier(paper_kernel(X[tr]), active_size=d, shared_kernel=False, max_iter=30,
                        reselect_every=10, random_state=draw)
    clf.fit(X[tr], y[tr])
    codes, params = _joint_spec(clf.kernel_, X.shape[1])
    beta = np.ascontiguousarray(clf.intercept_)
    sets = {}
    for name, rows in (("train", tr), ("test", te)):
        pick = np.sort(rs_points.choice(len(rows), min(len(rows), points), replace=False))
        Xs = np.ascontiguousarray(X[rows[pick]])
        out = _core.ivm.multiclass_predict(codes, params, np.ascontiguousarray(clf.X_active_),
                                           clf._sites["pi"], clf._sites["b"], Xs, beta=beta,
                                           rule=clf._rule, with_cov=True, with_prob=False)
        sets[name] = (np.ascontiguousarray(out["mean"]), np.ascontiguousarray(out["cov"]),
                      np.searchsorted(clf.classes_, y[rows[pick]]))
    return sets, beta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="train5,train8")
    ap.add_argument("--points", type=int, default=600, help="marginals per set (train, test)")
    ap.add_argument("--check-points", type=int, default=60,
                    help="points on which the 10-point reference is compared with the 12-point one")
    args = ap.parse_args()
    pygpfast.set_num_threads(1)
    X, y = load_even_mnist()
    rs = np.random.default_rng(0)
    rows, summary = [], []
    for task in args.tasks.split(","):
        sets, beta = marginals(task, X, y, 0, rs, args.points)
        for name, (h, A, t) in sets.items():
            want = reference(h, A, t, beta, 10)
            k = min(args.check_points, len(h))
            finer = reference(h[:k], A[:k], t[:k], beta, 12)
            ref_err = {q: float(np.abs(finer[q] - want[q][:k]).max()) for q in want}
            var = np.diagonal(A, axis1=1, axis2=2)
            row = {"task": task, "set": name, "points": len(h),
                   "latent var median": float(np.median(var)), "latent var p90": float(np.quantile(var, 0.9)),
                   "latent var max": float(var.max()), "reference error (10 vs 12 points)": ref_err,
                   "rules": {}}
            for rule, code in RULES.items():
                got, cost = by_rule(h, A, t, beta, code)
                valid = np.asarray(got["valid"], dtype=bool)
                row["rules"][rule] = {"errors": errors(got, want, valid), "cost": cost,
                                      "invalid (moments of no positive measure)": int((~valid).sum())}
                e = row["rules"][rule]["errors"]
                summary.append({"task": task, "set": name, "rule": rule,
                                "log Z": e["log_Z"]["median"], "log Z max": e["log_Z"]["max"],
                                "mean": e["mean"]["median"], "cov": e["cov"]["median"],
                                "E[-log p]": e["nll"]["median"], "E[-log p] max": e["nll"]["max"],
                                "g_h": e["g_h"]["median"], "prob": e["prob"]["median"],
                                "prob max": e["prob"]["max"], "invalid": row["rules"][rule][
                                    "invalid (moments of no positive measure)"],
                                "tilted us/pt": cost["tilted_us"], "E[-log p] us/pt": cost["expected_nll_us"]})
            rows.append(row)
            print(task, name, "reference 10 vs 12:", {q: f"{v:.1e}" for q, v in ref_err.items()}, flush=True)
    cols = ["task", "set", "rule", "log Z", "log Z max", "mean", "cov", "E[-log p]", "E[-log p] max", "g_h",
            "prob", "prob max", "invalid", "tilted us/pt", "E[-log p] us/pt"]
    print(common.table(summary, cols))
    path = common.write_json({"context": common.context(1), "args": vars(args), "rows": rows,
                              "summary": summary})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
