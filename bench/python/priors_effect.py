"""Hyperparameter priors on and off: hold-out NLPD and accuracy of SVGPClassifier() and
VGPClassifier() (default settings) with ``priors="default"`` (the MAP point) and
``priors=None`` (type-II maximum likelihood), on four UCI binary tasks.

Data: shared/data/uci_{ionosphere,sonar,wdbc,pima}.npz (skipped when absent), each split
``--splits`` times at random 70/30 (stratified, seeds 0, 1, ...), features standardised on the
training part (StandardScaler). Both settings fit the same split from the same start
(random_state=0). Per fit: hold-out NLPD (mean -log p(y* | x*)), accuracy, fit time, the fitted
kernel variance and lengthscales, and how many log hyperparameters ended within 0.01 of the
optimiser's box (pygpfast.kernels.hyper_bounds around the start: 1e-5 to 1e5 times it).

``--regression``: SVGPRegressor() (Gaussian likelihood, normalize_y) the same way on UCI
Parkinsons telemonitoring (y_motor, 19 features) and SARCOS (its test file: torque 1 from 21
inputs), 2000 random rows of each split 70/30: hold-out RMSE, NLPD (Gaussian predictive) and
the fitted noise variance (in y's standardised units), for the noise variance's prior.

Usage: nice python bench/python/priors_effect.py [--splits 4] [--datasets ionosphere,sonar,...]
       [--regression]
Writes bench/results/priors_effect.json (common.write_json; PYGPFAST_BENCH_RESULTS elsewhere).
"""

import argparse
import time
import warnings

import numpy as np
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from sklearn.utils import check_random_state

import common
import pygpfast
from pygpfast._base import _start
from pygpfast.kernels import hyper_bounds

DATASETS = ("ionosphere", "sonar", "wdbc", "pima")
MODELS = {
    "SVGPClassifier": lambda priors: pygpfast.SVGPClassifier(priors=priors, random_state=0),
    "VGPClassifier": lambda priors: pygpfast.VGPClassifier(priors=priors, random_state=0),
}
SETTINGS = {"default": "default", "none": None}


def find_data():
    """shared/data (common.data_dir), or None."""
    try:
        return common.data_dir()
    except SystemExit as e:
        print(e)
        return None


def load(path):
    d = np.load(path, allow_pickle=False)
    X = np.asarray(d["X"], dtype=np.float64)
    y = np.asarray(d["y"])
    return X, (y == np.max(y)).astype(int)


def nlpd(p1, y):
    p1 = np.clip(p1, 1e-12, 1 - 1e-12)
    return float(-np.mean(np.where(y == 1, np.log(p1), np.log1p(-p1))))


def default_start(Xtr):
    """Where the search of a default estimator (kernel=None, random_state=0) starts on the
    training inputs Xtr [N, D]: the default kernel, the first use of random_state=0."""
    return _start.default_kernel(Xtr, check_random_state(0), 1.0)


def at_bound(kernel, start):
    """How many log hyperparameters of the fitted `kernel` ended within 0.01 of the optimiser's
    box around `start` (the kernel the search started from; hyper_bounds)."""
    lo, hi = hyper_bounds(start.theta)
    theta = kernel.theta
    return int(np.sum((theta - lo < 0.01) | (hi - theta < 0.01)))


def one_fit(make, Xtr, ytr, Xte, yte):
    est = make()
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(Xtr, ytr)
    fit_s = time.perf_counter() - t0
    p1 = est.predict_proba(Xte)[:, 1]
    kernel = est.kernel_
    start = default_start(Xtr)
    return {
        "nlpd": nlpd(p1, yte),
        "accuracy": float(np.mean((p1 > 0.5) == (yte == 1))),
        "fit_s": fit_s,
        "objective": float(est.objective_),
        "log_prior": float(est.log_prior_),
        "variance": float(kernel.variance),
        "lengthscale_min": float(np.min(kernel.lengthscale)),
        "lengthscale_median": float(np.median(kernel.lengthscale)),
        "lengthscale_max": float(np.max(kernel.lengthscale)),
        "start_lengthscale_median": float(np.median(start.lengthscale)),
        "at_bound": at_bound(kernel, start),
        "n_params": int(kernel.theta.size),
        "restart": None if est.restart_ is None else est.restart_["kept"],
        "warnings": sorted({f"{w.category.__name__}: {str(w.message)[:80]}" for w in caught}),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--splits", type=int, default=4)
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--regression", action="store_true")
    args = parser.parse_args()
    if args.threads:
        pygpfast.set_num_threads(args.threads)
    data = find_data()
    results = {"context": common.context(pygpfast.get_num_threads()), "splits": args.splits,
               "runs": []}
    if data is None:
        print("shared/data not found: skipped")
        return
    for name in args.datasets.split(","):
        path = data / f"uci_{name}.npz"
        if not path.exists():
            print(f"{path} not found: skipped")
            continue
        X, y = load(path)
        for split in range(args.splits):
            Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=split,
                                                  stratify=y)
            scaler = StandardScaler().fit(Xtr)
            Xtr, Xte = scaler.transform(Xtr), scaler.transform(Xte)
            for model, make in MODELS.items():
                for setting, priors in SETTINGS.items():
                    row = one_fit(lambda: make(priors), Xtr, ytr, Xte, yte)
                    row.update(dataset=name, split=split, model=model, priors=setting,
                               n_train=int(Xtr.shape[0]), D=int(X.shape[1]))
                    results["runs"].append(row)
                    print(f"{name:10s} {split} {model:15s} {setting:7s} nlpd {row['nlpd']:.4f} "
                          f"acc {row['accuracy']:.3f} var {row['variance']:9.3g} "
                          f"ls [{row['lengthscale_min']:.3g}, {row['lengthscale_max']:.3g}] "
                          f"at_bound {row['at_bound']}/{row['n_params']} {row['fit_s']:.1f} s",
                          flush=True)
            common.write_json(results)
    results["summary"] = summary(results["runs"])
    common.write_json(results)
    print_table(results["summary"])
    if args.regression:
        results["regression"] = regression(data, args.splits)
        common.write_json(results)


REGRESSION = {
    "parkinsons": ("uci_parkinsons_telemonitoring.npz", lambda d: (d["X"], d["y_motor"])),
    "sarcos": ("sarcos_inv_test.npz", lambda d: (d["X"], d["Y"][:, 0])),
}


def regression(data, splits, rows=2000):
    """SVGPRegressor() with and without priors (module docstring): per-fit rows, and a table."""
    out = []
    for name, (file, read) in REGRESSION.items():
        path = data / file
        if not path.exists():
            print(f"{path} not found: skipped")
            continue
        X, y = (np.asarray(a, dtype=np.float64) for a in read(np.load(path, allow_pickle=False)))
        for split in range(splits):
            idx = np.random.default_rng(split).choice(len(y), min(rows, len(y)), replace=False)
            Xtr, Xte, ytr, yte = train_test_split(X[idx], y[idx], test_size=0.3,
                                                  random_state=split)
            scaler = StandardScaler().fit(Xtr)
            Xtr, Xte = scaler.transform(Xtr), scaler.transform(Xte)
            for setting, priors in SETTINGS.items():
                est = pygpfast.SVGPRegressor(priors=priors, random_state=0)
                t0 = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    est.fit(Xtr, ytr)
                fit_s = time.perf_counter() - t0
                mean, std = est.predict(Xte, return_std=True)
                row = {"dataset": name, "split": split, "priors": setting,
                       "rmse": float(np.sqrt(np.mean((mean - yte) ** 2))),
                       "nlpd": float(-np.mean(-0.5 * np.log(2 * np.pi * std**2)
                                              - 0.5 * (yte - mean) ** 2 / std**2)),
                       "noise_variance": float(est.likelihood_.variance),
                       "kernel_variance": float(est.kernel_.variance),
                       "lengthscale_max": float(np.max(est.kernel_.lengthscale)),
                       "fit_s": fit_s, "y_scale": float(est.y_scale_)}
                out.append(row)
                print(f"{name:10s} {split} SVGPRegressor {setting:7s} rmse {row['rmse']:.4g} "
                      f"nlpd {row['nlpd']:.4f} noise {row['noise_variance']:.3g} "
                      f"var {row['kernel_variance']:.3g} ls_max {row['lengthscale_max']:.3g} "
                      f"{fit_s:.1f} s", flush=True)
    print("| data | priors | RMSE | NLPD | noise variance | kernel variance | max lengthscale |")
    print("|---|---|---|---|---|---|---|")
    for name in REGRESSION:
        for setting in SETTINGS:
            rows_ = [r for r in out if r["dataset"] == name and r["priors"] == setting]
            if not rows_:
                continue
            m = {k: np.array([r[k] for r in rows_]) for k in ("rmse", "nlpd", "noise_variance",
                                                               "kernel_variance",
                                                               "lengthscale_max")}
            se = lambda v: v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0
            print(f"| {name} | {setting} | {m['rmse'].mean():.4g} ± {se(m['rmse']):.2g} "
                  f"| {m['nlpd'].mean():.3f} ± {se(m['nlpd']):.3f} "
                  f"| {np.median(m['noise_variance']):.3g} | {np.median(m['kernel_variance']):.3g} "
                  f"| {np.max(m['lengthscale_max']):.3g} |")
    return out


def summary(runs):
    """Mean and standard error over splits per (dataset, model, priors)."""
    out = []
    keys = sorted({(r["dataset"], r["model"], r["priors"]) for r in runs},
                  key=lambda k: (DATASETS.index(k[0]) if k[0] in DATASETS else 99, k[1], k[2]))
    for dataset, model, priors in keys:
        rows = [r for r in runs if (r["dataset"], r["model"], r["priors"]) == (dataset, model, priors)]
        entry = {"dataset": dataset, "model": model, "priors": priors, "n": len(rows)}
        for metric in ("nlpd", "accuracy", "fit_s"):
            v = np.array([r[metric] for r in rows])
            entry[metric] = float(v.mean())
            entry[metric + "_se"] = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else 0.0
        entry["at_bound"] = int(sum(r["at_bound"] for r in rows))
        entry["n_params"] = int(sum(r["n_params"] for r in rows))
        entry["variance_max"] = float(max(r["variance"] for r in rows))
        entry["lengthscale_max"] = float(max(r["lengthscale_max"] for r in rows))
        out.append(entry)
    return out


def print_table(rows):
    print("| data | model | priors | NLPD | accuracy | fit s | at bound | max variance | max lengthscale |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dataset']} | {r['model']} | {r['priors']} | {r['nlpd']:.3f} ± {r['nlpd_se']:.3f} "
              f"| {r['accuracy']:.3f} ± {r['accuracy_se']:.3f} | {r['fit_s']:.1f} "
              f"| {r['at_bound']}/{r['n_params']} | {r['variance_max']:.3g} "
              f"| {r['lengthscale_max']:.3g} |")


if __name__ == "__main__":
    main()
