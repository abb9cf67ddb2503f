"""Issue 26's table: pygpfast's default classifiers against scikit-learn's and GPflow's on every
classification set in shared/data, hold-out NLPD, accuracy and fit time, in one run.

Data (shared/data, common.data_dir), features standardised on each split's training part
(StandardScaler), labels 0 .. C - 1:

* the 13 Rätsch sets (ratsch_*.npz, binary): the first ``--splits`` published realisations where
  the file has them (banana, breast_cancer, german, heart, image, ringnorm, titanic, waveform),
  otherwise the first ``--splits`` folds of a stratified, shuffled (seed 0) 10-fold split of all
  rows (diabetis, flare_solar, splice, thyroid, twonorm; twonorm z-scored first, as
  svgp_common.load_ratsch does);
* UCI ionosphere, sonar, pima, wdbc (binary) and glass (6 classes), and USPS 3 vs 5
  (usps_3vs5.npz, binary): ``--splits`` stratified random 70/30 splits of all rows, seeds 0, 1, ...
  (for USPS 3 vs 5 not the file's standard train/test partition, which is a single split);
* USPS 10-class (usps_full.npz): split k trains on ``--usps-n`` (default 300, for the budget:
  scikit-learn's one-vs-rest fit on 1000 images took 13 minutes, ivm_usps.json) of the 7291
  training images drawn at random with seed k and tests on all 2007 test images.

UCI Parkinsons (uci_parkinsons_telemonitoring.npz) is left out: its targets (UPDRS scores y_motor,
y_total) are regression targets; the file has no classification target.

A training part with more than ``--max-train`` rows (default 1000) is cut to a stratified random
subsample of that many (seed k), so that scikit-learn's O(N^3) fits stay in the budget: it cuts
image (1300 training rows), splice (2857), twonorm (6660) and USPS 3 vs 5 (1078).

Configurations, per split:

* pygpfast ``SVGPClassifier()`` and ``VGPClassifier()`` at their defaults, each with
  ``priors="default"`` and ``priors=None``, and ``IVMClassifier()``, all with random_state=0
  (``VGPClassifier(likelihood="softmax")`` for C > 2, where its default 'logit' is binary only);
  for each, how many fitted log hyperparameters ended within 0.01 of the optimiser's box
  (priors_effect.at_bound);
* scikit-learn ``GaussianProcessClassifier`` (Laplace, one-vs-rest for C > 2) with
  ``ConstantKernel(4.0, (1e-3, 1e4)) * RBF(2.0, (1e-2, 1e3))``, the peers' kernel
  (shared/peers/gpc_full.py), one lengthscale ('sklearn_iso') or one per input ('sklearn_ard'),
  ``n_restarts_optimizer=--sklearn-restarts`` (default 2, random_state=0). For the budget, the
  ARD kernel is left out where N^2 (D + 2) times the number of binary models (C for C > 2)
  exceeds ``--sklearn-ard-size`` (default 1.25e7: image, splice, twonorm and the USPS sets are
  left out): scikit-learn's ARD gradient is an N x N x (D + 2) array, and on image (N = 1000,
  D = 18) one such fit took 224 s;
* GPflow's SVGP by multiclass_gap_gpflow.py's recipe, run by defaults_table_gpflow.py in the
  peers' Python (``--peers-python``; left out without it), kernels ``--gpflow-kernels``.

Per fit: hold-out NLPD (mean -log p(y* | x*), p clipped at 1e-12 for every configuration),
accuracy, fit time (wall and CPU of the process; for GPflow the worker's) and warnings. Every
library runs on ``--threads`` threads (default 1: pygpfast.set_num_threads, threadpoolctl for the
BLAS, TensorFlow's thread pools). Per set and configuration: the median NLPD and its spread
(interquartile range and min-max) over splits; per set the best peer (the peer configuration of
lowest median NLPD) and issue 26's targets for each pygpfast configuration: median NLPD at most
0.01 above the best peer's, no hyperparameter at a bound, and a median fit CPU time at least 10x
below the faster scikit-learn configuration's.

Usage:
  nice python bench/python/defaults_table.py [--splits 3] [--datasets heart,sonar,...]
      [--peers-python /work/venv-peers-bench/bin/python] [--resume] [--variant NAME]
Writes bench/results/defaults_table[-NAME].json (common.write_json) after every split;
``--resume`` keeps the fits already in that file and runs only the missing ones; the JSON's
``invocations`` lists the arguments of every run that added fits, ``complete`` whether the last
one finished.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.gaussian_process import GaussianProcessClassifier
from sklearn.gaussian_process.kernels import RBF, ConstantKernel
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

import common
import svgp_common
from priors_effect import at_bound, default_start

import pygpfast

RATSCH = ("banana", "breast_cancer", "diabetis", "flare_solar", "german", "heart", "image",
          "ringnorm", "splice", "thyroid", "titanic", "twonorm", "waveform")
UCI = ("ionosphere", "sonar", "pima", "wdbc", "glass")
DATASETS = RATSCH + UCI + ("usps3v5", "usps10")

PYGPFAST = ("svgp_default", "svgp_none", "vgp_default", "vgp_none", "ivm_default")
SKLEARN = ("sklearn_iso", "sklearn_ard")
#: The pygpfast configurations the targets are about (the defaults a user gets).
TARGETED = ("svgp_default", "vgp_default", "ivm_default")

NLPD_MARGIN = 0.01
SPEEDUP = 10.0
ARD_SIZE = 1.25e7


def load(name, n_splits, max_train, usps_n):
    """[(Xtr, ytr, Xte, yte)] (raw features, labels 0 .. C - 1) and how they were split."""
    if name in RATSCH:
        X, y, idx, how = svgp_common.load_ratsch(name)
        splits = [(X[tr], y[tr], X[te], y[te]) for tr, te in idx[:n_splits]]
    elif name == "usps10":
        d = np.load(common.data_dir() / "usps_full.npz")
        Xtr_all, ytr_all = np.asarray(d["X_train"], dtype=np.float64), np.asarray(d["y_train"])
        Xte, yte = np.asarray(d["X_test"], dtype=np.float64), np.asarray(d["y_test"])
        splits = []
        for k in range(n_splits):
            rows = np.random.default_rng(k).choice(len(ytr_all), usps_n, replace=False)
            splits.append((Xtr_all[rows], ytr_all[rows], Xte, yte))
        how = f"{usps_n} random training images (seed = split), the 2007 test images"
    else:
        file = "usps_3vs5.npz" if name == "usps3v5" else f"uci_{name}.npz"
        d = np.load(common.data_dir() / file)
        X, y = np.asarray(d["X"], dtype=np.float64), np.asarray(d["y"])
        splits = []
        for k in range(n_splits):
            Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, random_state=k, stratify=y)
            splits.append((Xtr, ytr, Xte, yte))
        how = "stratified random 70/30, seed = split"
    classes = np.unique(np.concatenate([splits[0][1], splits[0][3]]))
    out = []
    for k, (Xtr, ytr, Xte, yte) in enumerate(splits):
        if len(ytr) > max_train:
            Xtr, _, ytr, _ = train_test_split(Xtr, ytr, train_size=max_train, random_state=k,
                                              stratify=ytr)
            how = how.split(";")[0] + f"; training part cut to {max_train} rows (stratified, seed = split)"
        scaler = StandardScaler().fit(Xtr)
        out.append((scaler.transform(Xtr), np.searchsorted(classes, ytr),
                    scaler.transform(Xte), np.searchsorted(classes, yte)))
    return out, how


def loaded(datasets, n_splits, max_train=1000, usps_n=300):
    """(name, [(Xtr, ytr, Xte, yte)]) for each name in the comma-separated `datasets` whose
    file is there (``load``); a missing one is reported and skipped."""
    for name in datasets.split(","):
        try:
            splits, _ = load(name, n_splits, max_train, usps_n)
        except FileNotFoundError as e:
            print(f"{name}: skipped ({e})")
            continue
        yield name, splits


def pygpfast_estimator(config, C):
    family, priors = config.split("_")
    priors = "default" if priors == "default" else None
    if family == "svgp":
        return pygpfast.SVGPClassifier(priors=priors, random_state=0)
    if family == "vgp":
        return pygpfast.VGPClassifier(likelihood="logit" if C == 2 else "softmax", priors=priors,
                                      random_state=0)
    return pygpfast.IVMClassifier(random_state=0)


def sklearn_estimator(config, D, restarts):
    lengthscale = 2.0 if config == "sklearn_iso" else np.full(D, 2.0)
    kernel = ConstantKernel(4.0, (1e-3, 1e4)) * RBF(lengthscale, (1e-2, 1e3))
    return GaussianProcessClassifier(kernel=kernel, n_restarts_optimizer=restarts, random_state=0)


def timed_fit(est, X, y):
    """Fit; (wall s, CPU s of the process, sorted distinct warnings)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0, c0 = time.perf_counter(), time.process_time()
        est.fit(X, y)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, sorted({f"{w.category.__name__}: {str(w.message)[:100]}" for w in caught})


def scores(P, y):
    """Hold-out NLPD (p clipped at 1e-12) and accuracy from class probabilities P [T, C]."""
    p_true = np.clip(P[np.arange(len(y)), y], 1e-12, 1.0)
    return {"nlpd": float(-np.mean(np.log(p_true))),
            "accuracy": float(np.mean(np.argmax(P, axis=1) == y))}


def run_local(config, Xtr, ytr, Xte, yte, C, restarts, ard_size=ARD_SIZE):
    """One pygpfast or scikit-learn fit: its row (without the data set's keys), or None where
    the configuration is left out (scikit-learn's ARD where N^2 (D + 2) C exceeds `ard_size`)."""
    D = Xtr.shape[1]
    if config in PYGPFAST:
        est = pygpfast_estimator(config, C)
    else:
        if config == "sklearn_ard" and len(ytr) ** 2 * (D + 2) * (C if C > 2 else 1) > ard_size:
            return None
        est = sklearn_estimator(config, D, restarts)
    wall, cpu, warns = timed_fit(est, Xtr, ytr)
    row = {"fit_wall_s": wall, "fit_cpu_s": cpu, "warnings": warns,
           **scores(est.predict_proba(Xte), yte)}
    if config in PYGPFAST:
        kernel = est.kernel_
        row.update(at_bound=at_bound(kernel, default_start(Xtr)), n_params=int(kernel.theta.size),
                   kernel_variance=float(kernel.variance),
                   lengthscale_min=float(np.min(kernel.lengthscale)),
                   lengthscale_median=float(np.median(kernel.lengthscale)),
                   lengthscale_max=float(np.max(kernel.lengthscale)),
                   objective=float(est.objective_), log_prior=float(est.log_prior_),
                   n_iter=int(est.n_iter_))
    else:
        fitted = est.base_estimator_
        kernels = ([e.kernel_ for e in fitted.estimators_] if hasattr(fitted, "estimators_")
                   else [fitted.kernel_])
        row["kernel"] = [str(k) for k in kernels]
    return row


def run_gpflow(peers_python, splits, C, args):
    """defaults_table_gpflow.py on `splits` in the peers' Python: its rows."""
    script = Path(__file__).with_name("defaults_table_gpflow.py")
    with tempfile.TemporaryDirectory(prefix="pygpfast-defaults-") as tmp:
        path = Path(tmp) / "splits.npz"
        arrays = {"n_classes": C}
        for k, (Xtr, ytr, Xte, yte) in splits:
            arrays.update({f"Xtr_{k}": Xtr, f"ytr_{k}": ytr, f"Xte_{k}": Xte, f"yte_{k}": yte})
        np.savez(path, **arrays)
        threads = str(args.threads)
        env = dict(os.environ, PYTHONPATH="", OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads,
                   MKL_NUM_THREADS=threads)
        out = subprocess.run([peers_python, str(script), "--data", str(path), "--kernels",
                              args.gpflow_kernels, "--M", str(args.gpflow_M), "--maxiter",
                              str(args.gpflow_maxiter)],
                             check=True, capture_output=True, text=True, env=env)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def quantiles(values):
    v = np.asarray(values, dtype=np.float64)
    q25, q50, q75 = np.percentile(v, [25, 50, 75])
    return {"median": float(q50), "q25": float(q25), "q75": float(q75), "min": float(v.min()),
            "max": float(v.max())}


def summarize(runs, datasets):
    """Per data set: each configuration's NLPD, accuracy and fit times over splits, the best
    peer, and issue 26's targets for each pygpfast configuration."""
    out = []
    for name in datasets:
        rows = [r for r in runs if r["dataset"] == name]
        if not rows:
            continue
        configs = {}
        for config in sorted({r["config"] for r in rows}):
            fits = [r for r in rows if r["config"] == config]
            entry = {"n_splits": len(fits), "nlpd": quantiles([r["nlpd"] for r in fits]),
                     "accuracy": quantiles([r["accuracy"] for r in fits]),
                     "fit_wall_s": float(np.median([r["fit_wall_s"] for r in fits])),
                     "fit_cpu_s": float(np.median([r["fit_cpu_s"] for r in fits])),
                     "n_warnings": int(sum(len(r.get("warnings", [])) for r in fits))}
            if "at_bound" in fits[0]:
                entry["at_bound"] = int(sum(r["at_bound"] for r in fits))
                entry["n_params"] = int(sum(r["n_params"] for r in fits))
            configs[config] = entry
        peers = [c for c in configs if c not in PYGPFAST]
        best = min(peers, key=lambda c: configs[c]["nlpd"]["median"]) if peers else None
        sk = [c for c in configs if c in SKLEARN]
        sk_cpu = min(configs[c]["fit_cpu_s"] for c in sk) if sk else None
        targets = {}
        for config in (c for c in PYGPFAST if c in configs):
            e = configs[config]
            t = {"at_bound": e["at_bound"]}
            if best is not None:
                t["nlpd_minus_best_peer"] = e["nlpd"]["median"] - configs[best]["nlpd"]["median"]
                t["nlpd_ok"] = bool(t["nlpd_minus_best_peer"] <= NLPD_MARGIN)
            if sk_cpu is not None:
                t["speedup_vs_sklearn_cpu"] = sk_cpu / e["fit_cpu_s"]
                t["speedup_ok"] = bool(t["speedup_vs_sklearn_cpu"] >= SPEEDUP)
            targets[config] = t
        first = rows[0]
        out.append({"dataset": name, "n_train": first["n_train"], "n_test": first["n_test"],
                    "D": first["D"], "C": first["C"], "splits": first["splits_how"],
                    "best_peer": best, "configs": configs, "targets": targets})
    return out


def print_tables(summary):
    order = PYGPFAST + SKLEARN + ("gpflow_svgp_iso", "gpflow_svgp_ard")
    present = [c for c in order if any(c in s["configs"] for s in summary)]
    print("\nHold-out NLPD, median [min-max] over splits")
    print("| data | N/D/C | " + " | ".join(present) + " |")
    print("|---|---|" + "---|" * len(present))
    for s in summary:
        cells = []
        for c in present:
            e = s["configs"].get(c)
            cells.append("-" if e is None else
                         f"{e['nlpd']['median']:.3f} [{e['nlpd']['min']:.3f}-{e['nlpd']['max']:.3f}]")
        print(f"| {s['dataset']} | {s['n_train']}/{s['D']}/{s['C']} | " + " | ".join(cells) + " |")
    print("\nTargets: NLPD - best peer's (median), at bound, fit CPU speedup vs scikit-learn")
    print("| data | best peer | " + " | ".join(c for c in TARGETED) + " |")
    print("|---|---|" + "---|" * len(TARGETED))
    for s in summary:
        best = s["best_peer"]
        cells = []
        for c in TARGETED:
            t = s["targets"].get(c)
            if t is None:
                cells.append("-")
                continue
            d = t.get("nlpd_minus_best_peer")
            sp = t.get("speedup_vs_sklearn_cpu")
            cells.append(("" if d is None else f"{d:+.3f}") + f", {t['at_bound']} at bound"
                         + ("" if sp is None else f", {sp:.1f}x"))
        peer = "-" if best is None else f"{best} {s['configs'][best]['nlpd']['median']:.3f}"
        print(f"| {s['dataset']} | {peer} | " + " | ".join(cells) + " |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--splits", type=int, default=3)
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--configs", default=",".join(PYGPFAST + SKLEARN),
                    help="pygpfast and scikit-learn configurations to run")
    ap.add_argument("--max-train", type=int, default=1000)
    ap.add_argument("--usps-n", type=int, default=300)
    ap.add_argument("--sklearn-restarts", type=int, default=2)
    ap.add_argument("--sklearn-ard-size", type=float, default=ARD_SIZE,
                    help="largest N^2 (D + 2) C for which scikit-learn's ARD kernel is fitted")
    ap.add_argument("--peers-python", default=None)
    ap.add_argument("--gpflow-kernels", default="iso")
    ap.add_argument("--gpflow-M", type=int, default=100)
    ap.add_argument("--gpflow-maxiter", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--replace", default="",
                    help="with --resume: configurations whose earlier fits of --datasets are "
                         "dropped and run again (a re-measurement of those beside the kept peers)")
    ap.add_argument("--variant", default=None, help="suffix of the JSON's name")
    args = ap.parse_args()
    datasets = args.datasets.split(",")
    unknown = sorted(set(datasets) - set(DATASETS))
    if unknown:
        raise SystemExit(f"unknown data sets {unknown}; known: {','.join(DATASETS)}")
    configs = args.configs.split(",")
    ctx = svgp_common.start(args.threads)
    threadpool_limits(args.threads)
    runs, invocations = [], []
    path = common.result_path(args.variant)
    if args.resume and path.exists():
        previous = json.loads(path.read_text())
        runs, invocations = previous["runs"], previous["invocations"]
        replace = set(filter(None, args.replace.split(",")))
        runs = [r for r in runs if not (r["config"] in replace and r["dataset"] in datasets)]
        print(f"resumed {len(runs)} fits from {path}"
              + (f" ({len(previous['runs']) - len(runs)} dropped: --replace)" if replace else ""))
    done = {(r["dataset"], r["split"], r["config"]) for r in runs}
    # (Each invocation's arguments, in order: a resumed run's rows came from the earlier ones.)
    payload = {"context": ctx, "invocations": invocations + [vars(args)], "complete": False,
               "runs": runs}
    for name in datasets:
        splits, how = load(name, args.splits, args.max_train, args.usps_n)
        C = int(max(max(s[1].max(), s[3].max()) for s in splits)) + 1
        for k, (Xtr, ytr, Xte, yte) in enumerate(splits):
            keys = {"dataset": name, "split": k, "n_train": len(ytr), "n_test": len(yte),
                    "D": Xtr.shape[1], "C": C, "splits_how": how}
            for config in configs:
                if (name, k, config) in done:
                    continue
                row = run_local(config, Xtr, ytr, Xte, yte, C, args.sklearn_restarts,
                                args.sklearn_ard_size)
                if row is None:
                    continue
                runs.append({**keys, "config": config, **row})
                print(f"{name:13s} {k} {config:13s} nlpd {row['nlpd']:.4f} acc {row['accuracy']:.3f} "
                      f"{row['fit_wall_s']:7.2f} s (cpu {row['fit_cpu_s']:.2f})"
                      + (f" at_bound {row['at_bound']}/{row['n_params']}" if "at_bound" in row else "")
                      + (f" {len(row['warnings'])} warnings" if row["warnings"] else ""), flush=True)
            payload["summary"] = summarize(runs, DATASETS)
            common.write_json(payload, args.variant)
        if args.peers_python:
            todo = [(k, s) for k, s in enumerate(splits)
                    if any((name, k, f"gpflow_svgp_{kern}") not in done
                           for kern in args.gpflow_kernels.split(","))]
            if todo:
                for r in run_gpflow(args.peers_python, todo, C, args):
                    Xtr, ytr, Xte, yte = splits[r["split"]]
                    runs.append({"dataset": name, "n_train": len(ytr), "n_test": len(yte),
                                 "D": Xtr.shape[1], "C": C, "splits_how": how, **r})
                    print(f"{name:13s} {r['split']} {r['config']:13s} nlpd {r['nlpd']:.4f} "
                          f"acc {r['accuracy']:.3f} {r['fit_wall_s']:7.2f} s "
                          f"(cpu {r['fit_cpu_s']:.2f}) {r['nit']} it", flush=True)
        payload["summary"] = summarize(runs, DATASETS)
        common.write_json(payload, args.variant)
    payload["complete"] = True
    common.write_json(payload, args.variant)
    print_tables(payload["summary"])
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
