"""Seed 000 (Hensman, Matthews & Ghahramani 2015), Figure 2: time against hold-out NLP on image.

For method 'kl' and 'mf' and several M, SVGPClassifier is fitted on the first published
realisation of the image set (1300 training points, 1010 held out; k-means initialisation,
full-batch L-BFGS-B, default ARD RBF kernel, probit). The paper records the wall-clock time
after each function call and the hold-out NLP of the parameters at that step. Here:

* the time: one uninterrupted fit whose ``callback`` only notes the clock at every iteration
  (seconds since ``fit`` was called, k-means initialisation included);
* the hold-out NLP at iteration k: the same fit run again and stopped by its ``callback`` at k
  (a fixed ``random_state`` makes it the same trajectory; the ELBO the callback sees at k is
  compared with the first run's and the largest difference is reported), then scored with
  ``predict_log_proba``. Evaluation never runs inside a timed fit.

Checkpoints are spaced geometrically in the iteration count, so the re-runs cost a few times
one fit. Output: bench/figures/svgp_figure2.png (hold-out NLP and error against time).

Usage:
  python bench/python/svgp_figure2.py [--quick] [--Ms 8,16,32,64,128] [--points 20] [--threads 1]
"""

import argparse
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import svgp_common  # noqa: E402

from pygpfast import SVGPClassifier  # noqa: E402

METHODS = ("kl", "mf")


def classifier(method, M, max_iter, callback):
    return SVGPClassifier(n_inducing=M, method=method, optimizer="lbfgs", max_iter=max_iter,
                          random_state=0, callback=callback)


def trace(method, M, X, y, max_iter):
    """One uninterrupted fit; [(iteration, seconds since fit started, ELBO)], the fit, warnings."""
    log = []

    def note(est, it, elbo):
        log.append((it, time.perf_counter() - t0, float(elbo)))
        return False

    clf = classifier(method, M, max_iter, note)
    t0 = time.perf_counter()
    seconds, warns = svgp_common.fit(clf, X, y)
    return log, seconds, clf, warns


def stopped_at(k, method, M, X, y, max_iter):
    """The same fit stopped by its callback at iteration k; (fit, ELBO seen at k)."""
    seen = {}

    def stop(est, it, elbo):
        seen[it] = float(elbo)
        return it >= k

    clf = classifier(method, M, max_iter, stop)
    svgp_common.fit(clf, X, y)
    return clf, seen.get(k, np.nan)


def run(method, M, data, args):
    Xtr, ytr, Xte, yte = data
    log, seconds, final, warns = trace(method, M, Xtr, ytr, args.max_iter)
    n = log[-1][0] if log else 0
    ks = np.unique(np.round(np.geomspace(1, max(n, 1), args.points)).astype(int)) if n else []
    at = {it: (t, elbo) for it, t, elbo in log}
    points, mismatch = [], 0.0
    for k in ks[:-1]:
        clf, elbo_k = stopped_at(int(k), method, M, Xtr, ytr, args.max_iter)
        t, elbo = at[k]
        mismatch = max(mismatch, abs(elbo_k - elbo) / max(1.0, abs(elbo)))
        points.append({"iter": int(k), "time_s": t, "elbo": elbo, **svgp_common.holdout(clf, Xte, yte)})
    points.append({"iter": n, "time_s": seconds, "elbo": log[-1][2] if log else np.nan,
                   **svgp_common.holdout(final, Xte, yte)})
    last = points[-1]
    print(f"{method} M={M:3d}: {n} it in {seconds:.2f} s, final NLP {last['nlp']:.3f} "
          f"err {1 - last['acc']:.3f}, re-run ELBO mismatch {mismatch:.1e}, warnings {len(warns)}",
          flush=True)
    return {"method": method, "M": M, "fit_s": seconds, "n_iter": n, "warnings": warns,
            "rerun_elbo_mismatch": mismatch, "points": points}


def plot(runs, Ms, quick):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(Ms)))
    for r in runs:
        c = colours[Ms.index(r["M"])]
        t = [p["time_s"] for p in r["points"]]
        kl = r["method"] == "kl"
        style = dict(color=c, ls="-" if kl else "--", marker="o" if kl else "s", ms=3,
                     label=f"{r['method'].upper()} M={r['M']}")
        axes[0].plot(t, [p["nlp"] for p in r["points"]], **style)
        axes[1].plot(t, [1 - p["acc"] for p in r["points"]], **style)
    for ax, what in zip(axes, ("hold-out negative log probability", "hold-out error rate")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("wall-clock time of the fit (s)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle("image (first realisation, 1300 train / 1010 test): KL (solid) and MF (dashed), L-BFGS-B")
    svgp_common.save_figure(fig, "svgp_figure2_quick" if quick else "svgp_figure2", quick)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--Ms", default="8,16,32,64,128")
    ap.add_argument("--points", type=int, default=20, help="checkpoints per fit")
    ap.add_argument("--max-iter", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="M = 8, 32; 100 iterations; 8 checkpoints")
    args = ap.parse_args()
    if args.quick:
        args.Ms, args.max_iter, args.points = "8,32", 100, 8
    Ms = [int(m) for m in args.Ms.split(",")]
    ctx = svgp_common.start(args.threads)
    X, y, splits, how = svgp_common.load_ratsch("image")
    tr, te = splits[0]
    runs = [run(method, M, (X[tr], y[tr], X[te], y[te]), args) for M in Ms for method in METHODS]
    plot(runs, Ms, args.quick)
    svgp_common.finish("quick" if args.quick else None, ctx,
                       {"settings": vars(args), "splits": how, "runs": runs})


if __name__ == "__main__":
    main()
