"""Time-to-accuracy of SVGPClassifier on the peers' svgp_fit problem (shared/peers/svgp_fit.py).

Data (re-created here from its definition; same generator calls in order): N = 100 000 train,
10 000 test, D = 4, x ~ N(0, I), p(y = 1 | x) = Phi(2.5 g(x)),
g(x) = sin(2 x0) + cos(1.5 x1) x2 - 0.5 x3^2 + 0.4. The peers' setting: M = 100, B = 256,
probit, whitened, ARD RBF (lengthscales 1, variance 1), Z0 from k-means on a 20 000-row subset.

Each configuration is an ``SVGPClassifier`` fitted by ``fit`` (so its own initialisation,
k-means included, is on the clock); a callback after every epoch evaluates the hold-out
accuracy and NLPD (mean -log p(y* | x*)) and takes that time off the clock. The result at a
budget b is the last epoch that ended within b seconds of training (so it is conservative);
the NLPD after every epoch is printed too (steps to accuracy do not depend on the load).

Configurations (``--configs``):
  default       SVGPClassifier(random_state=r) as a user gets it (optimizer 'auto').
  peers-adam    the peers' protocol: Adam lr 0.01 on everything, their Z0 and kernel.
  peers-natgrad natural gradients + Adam (defaults) from the peers' Z0 and kernel.
  name:key=value,...   any other settings, e.g. "ng05:natgrad_step=0.5".

With ``--peers DIR --peers-python PY`` the peers' own driver (DIR/svgp_fit.py: GPflow and GPyTorch,
Adam lr 0.01, the same data, each in its own process) runs in the same session and its hold-out
NLPD at the same budgets is printed next to pygpfast's. (Their clock excludes their first step,
GPflow's tracing; pygpfast's includes its whole fit, k-means initialisation included.)

Usage:
  python bench/python/svgp_fit.py [--threads 1] [--budgets 1,2,5,10] [--repeats 2]
      [--configs default,peers-adam] [--peers ../shared/peers --peers-python VENV/bin/python]
"""

import argparse
import os
import sys
import time

import numpy as np
from scipy.stats import norm
from sklearn.cluster import KMeans

import common

import pygpfast
from pygpfast import kernels
from pygpfast.svgp import SVGPClassifier

N_TRAIN, N_TEST, D, M = 100_000, 10_000, 4, 100


def make_data(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N_TRAIN + N_TEST, D))
    g = np.sin(2 * X[:, 0]) + np.cos(1.5 * X[:, 1]) * X[:, 2] - 0.5 * X[:, 3] ** 2 + 0.4
    p = norm.cdf(2.5 * g)
    y = (rng.random(len(X)) < p).astype(np.float64)
    sub = rng.choice(N_TRAIN, 20_000, replace=False)
    Z0 = KMeans(n_clusters=M, n_init=1, random_state=0).fit(X[:N_TRAIN][sub]).cluster_centers_
    pc = np.clip(p[N_TRAIN:], 1e-12, 1 - 1e-12)
    yt = y[N_TRAIN:]
    bayes_nlpd = float(-np.mean(yt * np.log(pc) + (1 - yt) * np.log(1 - pc)))
    return X[:N_TRAIN], y[:N_TRAIN], X[N_TRAIN:], yt, Z0, bayes_nlpd


def parse_config(spec, Z0):
    peers = {"kernel": kernels.RBF(variance=1.0, lengthscale=np.ones(D)), "inducing_points": Z0}
    if spec == "default":
        return spec, {}
    if spec == "peers-adam":
        return spec, {**peers, "optimizer": "adam", "learning_rate": 0.01}
    if spec == "peers-natgrad":
        return spec, {**peers, "optimizer": "natgrad"}
    name, _, rest = spec.partition(":")
    kw = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key == "peers":
            kw.update(peers)
            continue
        try:
            value = float(value) if "." in value or "e" in value else int(value)
        except ValueError:
            pass
        kw[key] = value
    return name, kw


def run(kw, data, budgets, repeat):
    Xtr, ytr, Xte, yte, _, _ = data
    last = max(budgets)
    marks = []
    clock = {"eval": 0.0}

    def callback(est, it, elbo):
        t_in = time.perf_counter()
        train_s = t_in - clock["start"] - clock["eval"]
        p = np.clip(est.predict_proba(Xte)[:, 1], 1e-12, 1 - 1e-12)
        nlpd = float(-np.mean(yte * np.log(p) + (1 - yte) * np.log(1 - p)))
        acc = float(np.mean((p > 0.5) == (yte > 0.5)))
        marks.append({"train_s": train_s, "epoch": it, "steps": est._trainer.t, "nlpd": nlpd,
                      "acc": acc, "elbo_per_row": elbo / N_TRAIN})
        clock["eval"] += time.perf_counter() - t_in
        return train_s >= last

    clf = SVGPClassifier(random_state=repeat, callback=callback, max_iter=10_000, tol=0.0, **kw)
    clock["start"] = time.perf_counter()
    clf.fit(Xtr, ytr)
    out = []
    for b in budgets:
        within = [m for m in marks if m["train_s"] <= b]
        row = dict(within[-1]) if within else {"train_s": float("nan"), "steps": 0, "nlpd": float("nan"),
                                               "acc": float("nan"), "epoch": 0}
        row["budget_s"] = b
        out.append(row)
    steady = marks[-1]["steps"] - marks[0]["steps"]
    rate = steady / max(marks[-1]["train_s"] - marks[0]["train_s"], 1e-9)
    return out, rate, clf, marks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--budgets", default="1,2,5,10")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--configs", default="default,peers-adam")
    ap.add_argument("--peers", default=None, help="directory of the peers' scripts (shared/peers)")
    ap.add_argument("--peers-python", default=None)
    args = ap.parse_args()
    pygpfast.set_num_threads(args.threads)
    ctx = common.context(args.threads)
    budgets = [float(b) for b in args.budgets.split(",")]
    data = make_data()
    print(f"Bayes-optimal test NLPD {data[5]:.4f}; loadavg {os.getloadavg()}", file=sys.stderr)
    results, epochs = [], []
    for spec in args.configs.split(","):
        name, kw = parse_config(spec, data[4])
        for r in range(args.repeats):
            load0 = os.getloadavg()[0]
            rows, rate, clf, marks = run(kw, data, budgets, r)
            print(common.table(marks, ["epoch", "steps", "train_s", "acc", "nlpd"]), file=sys.stderr)
            load1 = os.getloadavg()[0]
            for row in rows:
                row.update({"config": name, "repeat": r, "steps_per_s": rate, "load": f"{load0:.1f}->{load1:.1f}",
                            "optimizer": clf.optimizer_})
                results.append(row)
            epochs.append({"config": name, "repeat": r, "marks": marks})
            print(common.table(rows, ["budget_s", "train_s", "epoch", "steps", "acc", "nlpd"]), file=sys.stderr)
            print(f"  {name} rep {r}: {rate:.0f} steps/s, load {load0:.1f}->{load1:.1f}", file=sys.stderr)
    peers = {}
    if args.peers and args.peers_python:
        res = common.run_peers_script(args.peers, args.peers_python, "svgp_fit.py",
                                      ["--threads", str(args.threads), "--repeats", str(args.repeats),
                                       "--budgets", ",".join(f"{b:g}" for b in budgets),
                                       "--backends", "gpflow,gpytorch"])
        peers = res.get("summary", {})
        for backend, by_budget in peers.items():
            for b in budgets:
                s = by_budget.get(str(b)) or by_budget.get(f"{b:g}")
                if s:
                    results.append({"config": backend, "repeat": "median", "optimizer": "adam 0.01", "budget_s": b,
                                    "train_s": float("nan"), "steps": s["steps_median"],
                                    "steps_per_s": s["steps_per_s_median"], "acc": s["acc_median"],
                                    "nlpd": s["nlpd_median"], "load": "-"})
    print(common.table(results, ["config", "repeat", "optimizer", "budget_s", "train_s", "steps", "steps_per_s",
                                 "acc", "nlpd", "load"]))
    variant = f"t{args.threads}" + ("-peers" if peers else "")
    print("wrote", common.write_json({"context": ctx, "budgets": budgets, "bayes_nlpd": data[5], "results": results,
                                      "epochs": epochs, "peers": peers}, variant))


if __name__ == "__main__":
    main()
