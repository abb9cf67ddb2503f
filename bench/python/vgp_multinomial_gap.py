"""Issue 26: why the full-GP multinomial model, ``VGPClassifier(likelihood="softmax")``, predicts
worse than the sparse softmax model ``SVGPClassifier()`` on the same data (defaults table: glass
0.866 against 0.756, USPS-10 with 300 images 0.750 against 0.582): its log-sum-exp bound, the
predictive integral, or the search.

The VGP fits q and its hyperparameters to the Blei-Lafferty bound
E[log softmax_y(z)] >= m_y - log sum_c exp(m_c + v_c / 2); the SVGP fits both to the exact
expectation (quadrature, pygpfast.likelihoods.Softmax). With the inducing inputs fixed at the
training inputs (Z = X, M = N) the SVGP is a full GP with the exact expectation: the same model
and the same q family as the VGP, so the pairs below differ in one thing at a time.

Data: defaults_table.load (StandardScaled on each training part, labels 0 .. C - 1): glass,
stratified random 70/30 splits (seed = split); usps10, 300 random training images (seed =
split), the 2007 test images. Per split, each fitted with random_state=0, one thread:

* ``vgp``: ``VGPClassifier(likelihood="softmax")``, the default (bound, learned constant prior
  mean per class, default priors, L-BFGS-B on bound + log prior);
* ``svgp``: ``SVGPClassifier()``, the default (M = 100 k-means inducing inputs, learned);
* ``svgp_zx``: ``SVGPClassifier(inducing_points=Xtr, train_inducing=False)``: full GP, exact
  expectation, its own search (default priors, zero prior mean: the SVGP classifier has none);
* ``svgp_zx_at_vgp``: the same with ``optimize_hyperparameters=False, priors=None`` and the kernel
  a copy of vgp's fitted ``kernel_``, and the prior mean fixed at vgp's ``mean_`` (a subclass
  defined here overrides ``_prior_mean``; with the search off the SVGP's L-BFGS-B leaves it
  fixed): the exact expectation's q at the VGP's hyperparameters;
* ``svgp_zx_at_vgp_mean0``: as ``svgp_zx_at_vgp`` with the SVGP's zero prior mean;
* ``vgp_at_exact``: ``VGPClassifier(likelihood="softmax", kernel=<copy of svgp_zx's kernel_>,
  optimize_hyperparameters=False, priors=None, learn_mean=False)``: the bound's q at the exact
  model's hyperparameters, zero prior mean as svgp_zx (learn_mean=False: the mean stays 0);
* ``vgp_mean0``: the default VGP search with ``learn_mean=False`` (zero prior mean): what the
  learned mean does to the bound's search;
* ``vgp_from_exact``: the default VGP search started from svgp_zx's kernel_ (default priors):
  whether the bound's search leaves the exact model's hyperparameters for its own optimum;
* ``vgp_tight``: the default VGP with ``tol=1e-11`` (the search's ftol 100 tol), ``max_iter=1000``:
  whether the default search stops early.

Per fit: hold-out NLPD (mean -log p(y* | x*), p clipped at 1e-12) and accuracy of predict_proba;
the kernel variance and median lengthscale; the mean latent variance at the test points; at the
fit's marginals on the training points (predict_latent(Xtr)), the exact E[log softmax_y]
(Softmax(C, n_gh=40).variational_expectations) minus the Blei-Lafferty value
m_y - logsumexp(m + v/2): its total and median over points (nats); the fit's ELBO with the exact
expectation and with the bound (for the VGP fits ``objective_ - log_prior_`` is the bound's
ELBO, the exact one adds the gap; for the SVGP fits ``objective_ - log_prior_`` is the exact ELBO
(a sparse one for ``svgp``), the bound's subtracts the gap), and the log density of the kernel's
hyperparameters under the default priors (those vgp's fit attached: the same for SVGP and VGP),
so that fits at different hyperparameters compare on the exact MAP objective; fit CPU time.

Predictive integral: for vgp and svgp_zx, predict_proba (Softmax quadrature) against a Monte
Carlo estimate of E[softmax(z)] under the fit's own predict_latent marginals (``--mc`` draws,
seed 0), the NLPD of each and the largest difference in a probability; and the plug-in
softmax(mean) for reference.

Usage: nice python bench/python/vgp_multinomial_gap.py [--datasets glass,usps10] [--splits 3]
       [--usps-splits 1] [--mc 20000]
Writes bench/results/vgp_multinomial_gap.json.
"""

import argparse
import copy
import time

import numpy as np
from scipy.special import logsumexp, softmax

import common
import defaults_table

import pygpfast
from pygpfast import SVGPClassifier, VGPClassifier
from pygpfast.likelihoods import Softmax

CONFIGS = ("vgp", "svgp", "svgp_zx", "svgp_zx_at_vgp", "svgp_zx_at_vgp_mean0", "vgp_at_exact",
           "vgp_mean0", "vgp_from_exact", "vgp_tight")
#: full-GP fits (q on the training points is the whole posterior): their ELBOs are full-GP ones
FULL = {c for c in CONFIGS if c != "svgp"}


class FixedMeanSVGP(SVGPClassifier):
    """SVGPClassifier with a constant prior mean per class, ``fixed_mean`` (set after
    construction); with optimize_hyperparameters=False the fit leaves it fixed."""

    fixed_mean = None

    def _prior_mean(self, t):
        return None if self.fixed_mean is None else np.array(self.fixed_mean, dtype=np.float64)


def bound_gap(m, v, y, C):
    """exact E[log softmax_y(z)] - (m_y - logsumexp(m + v/2)) per point, z_c ~ N(m_c, v_c)."""
    exact = Softmax(C, n_gh=40).variational_expectations(y.astype(np.float64), m, v)[0]
    bl = m[np.arange(len(y)), y] - logsumexp(m + 0.5 * v, axis=1)
    return exact - bl


def mc_proba(m, v, draws, seed=0, block=20):
    """E[softmax(z)] [T, C] by Monte Carlo, z_c ~ N(m_c, v_c) independent, `draws` per point."""
    rng = np.random.default_rng(seed)
    out = np.empty_like(m)
    for s in range(0, len(m), block):
        mb, sb = m[s:s + block], np.sqrt(v[s:s + block])
        z = mb[:, None, :] + sb[:, None, :] * rng.standard_normal((len(mb), draws, m.shape[1]))
        out[s:s + block] = softmax(z, axis=2).mean(axis=1)
    return out


def fit(est, Xtr, ytr):
    wall, cpu, warns = defaults_table.timed_fit(est, Xtr, ytr)
    return est, {"fit_cpu_s": cpu, "fit_wall_s": wall, "warnings": warns,
                 "n_iter": int(getattr(est, "n_iter_", -1))}


def describe(name, est, info, Xtr, ytr, Xte, yte, C, prior_kernel):
    """The row of one fit: scores, hyperparameters, bound gap, ELBOs."""
    m, v = est.predict_latent(Xtr)
    gap = bound_gap(m, v, ytr, C)
    mt, vt = est.predict_latent(Xte)
    P = est.predict_proba(Xte)
    elbo = float(est.objective_) - float(est.log_prior_)
    is_vgp = isinstance(est, VGPClassifier)
    elbo_bl, elbo_exact = (elbo, elbo + gap.sum()) if is_vgp else (elbo - gap.sum(), elbo)
    ref = copy.deepcopy(prior_kernel)
    ref.theta = est.kernel_.theta
    log_prior = float(ref.log_prior())
    N = len(ytr)
    row = {**defaults_table.scores(P, yte), **info,
           "kernel_variance": float(est.kernel_.variance),
           "lengthscale_median": float(np.median(est.kernel_.lengthscale)),
           "lengthscale_min": float(np.min(est.kernel_.lengthscale)),
           "prior_mean": (est.mean_ if is_vgp else
                          (est.model_.prior_mean if est.model_.prior_mean is not None
                           else np.zeros(C))).tolist(),
           "test_var_mean": float(vt.mean()), "train_var_mean": float(v.mean()),
           "test_maxprob_mean": float(P.max(axis=1).mean()),
           "gap_total": float(gap.sum()), "gap_median": float(np.median(gap)),
           "gap_max": float(gap.max()),
           "elbo_exact_per_row": elbo_exact / N, "elbo_bound_per_row": elbo_bl / N,
           "log_prior_default": log_prior,
           "map_exact_per_row": (elbo_exact + log_prior) / N,
           "map_bound_per_row": (elbo_bl + log_prior) / N,
           "full_gp": name in FULL}
    print(f"  {name:21s} nlpd {row['nlpd']:.4f} acc {row['accuracy']:.3f} var {row['kernel_variance']:7.3f} "
          f"l_med {row['lengthscale_median']:6.2f} test v {row['test_var_mean']:6.3f} gap {row['gap_total']:7.2f} "
          f"(med {row['gap_median']:.4f}) ELBO exact/bound {elbo_exact / N:.4f}/{elbo_bl / N:.4f} "
          f"MAP exact/bound {row['map_exact_per_row']:.4f}/{row['map_bound_per_row']:.4f} cpu {info['fit_cpu_s']:.1f} s"
          + (f" {len(info['warnings'])} warnings" if info["warnings"] else ""), flush=True)
    return row, (mt, vt, P)


def predictive(name, latent, yte, draws):
    """predict_proba (quadrature) against Monte Carlo and the plug-in softmax(mean)."""
    mt, vt, P = latent
    Pmc = mc_proba(mt, vt, draws)
    out = {"quadrature": defaults_table.scores(P, yte)["nlpd"],
           "monte_carlo": defaults_table.scores(Pmc, yte)["nlpd"],
           "plug_in": defaults_table.scores(softmax(mt, axis=1), yte)["nlpd"],
           "max_abs_diff": float(np.abs(P - Pmc).max()), "draws": draws}
    print(f"  {name} predictive NLPD: quadrature {out['quadrature']:.4f}, MC {out['monte_carlo']:.4f} "
          f"(max |dP| {out['max_abs_diff']:.1e}), plug-in {out['plug_in']:.4f}", flush=True)
    return out


def run_split(Xtr, ytr, Xte, yte, C, draws):
    rows, lat = {}, {}

    def add(name, est):
        est, info = fit(est, Xtr, ytr)
        rows[name], lat[name] = describe(name, est, info, Xtr, ytr, Xte, yte, C, prior_kernel)
        return est

    vgp, info = fit(VGPClassifier(likelihood="softmax", random_state=0), Xtr, ytr)
    prior_kernel = copy.deepcopy(vgp.kernel_)  # (the default priors, attached by the fit)
    rows["vgp"], lat["vgp"] = describe("vgp", vgp, info, Xtr, ytr, Xte, yte, C, prior_kernel)
    add("svgp", SVGPClassifier(random_state=0))
    zx = add("svgp_zx", SVGPClassifier(inducing_points=Xtr, train_inducing=False, random_state=0))
    at_vgp = FixedMeanSVGP(kernel=copy.deepcopy(vgp.kernel_), inducing_points=Xtr,
                           train_inducing=False, optimize_hyperparameters=False, priors=None,
                           random_state=0)
    at_vgp.fixed_mean = vgp.mean_.copy()
    add("svgp_zx_at_vgp", at_vgp)
    add("svgp_zx_at_vgp_mean0", SVGPClassifier(kernel=copy.deepcopy(vgp.kernel_), inducing_points=Xtr,
                                               train_inducing=False, optimize_hyperparameters=False,
                                               priors=None, random_state=0))
    add("vgp_at_exact", VGPClassifier(likelihood="softmax", kernel=copy.deepcopy(zx.kernel_),
                                      optimize_hyperparameters=False, priors=None, learn_mean=False,
                                      random_state=0))
    add("vgp_mean0", VGPClassifier(likelihood="softmax", learn_mean=False, random_state=0))
    add("vgp_from_exact", VGPClassifier(likelihood="softmax", kernel=copy.deepcopy(zx.kernel_),
                                        random_state=0))
    add("vgp_tight", VGPClassifier(likelihood="softmax", tol=1e-11, max_iter=1000, random_state=0))
    pred = {name: predictive(name, lat[name], yte, draws) for name in ("vgp", "svgp_zx")}
    return rows, pred


def summarize(runs, name):
    sel = [r for r in runs if r["dataset"] == name]
    med = lambda c, k: float(np.median([r["fits"][c][k] for r in sel]))  # noqa: E731
    out = []
    for c in CONFIGS:
        e = {"dataset": name, "config": c, "splits": len(sel)}
        for k in ("nlpd", "accuracy", "kernel_variance", "lengthscale_median", "test_var_mean",
                  "gap_total", "gap_median", "elbo_exact_per_row", "elbo_bound_per_row",
                  "map_exact_per_row", "map_bound_per_row", "fit_cpu_s"):
            e[k] = med(c, k)
        out.append(e)
    pred = {k: {q: float(np.median([r["predictive"][k][q] for r in sel]))
                for q in ("quadrature", "monte_carlo", "plug_in", "max_abs_diff")}
            for k in ("vgp", "svgp_zx")}
    return out, pred


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", default="glass,usps10")
    ap.add_argument("--splits", type=int, default=3)
    ap.add_argument("--usps-splits", type=int, default=1)
    ap.add_argument("--mc", type=int, default=20000)
    args = ap.parse_args()
    pygpfast.set_num_threads(1)
    t_start = time.perf_counter()
    runs, summary, predictive_summary = [], [], {}
    for name in args.datasets.split(","):
        n_splits = args.usps_splits if name == "usps10" else args.splits
        splits, how = defaults_table.load(name, n_splits, 1000, 300)
        for k, (Xtr, ytr, Xte, yte) in enumerate(splits):
            C = int(max(ytr.max(), yte.max())) + 1
            print(f"{name}[{k}] N {len(ytr)} D {Xtr.shape[1]} C {C}", flush=True)
            fits, pred = run_split(Xtr, ytr, Xte, yte, C, args.mc)
            runs.append({"dataset": name, "split": k, "splits_how": how, "N": len(ytr),
                         "n_test": len(yte), "D": Xtr.shape[1], "C": C, "fits": fits,
                         "predictive": pred})
        s, p = summarize(runs, name)
        summary += s
        predictive_summary[name] = p
    cols = ["dataset", "config", "splits", "nlpd", "accuracy", "kernel_variance",
            "lengthscale_median", "test_var_mean", "gap_total", "gap_median",
            "elbo_exact_per_row", "elbo_bound_per_row", "map_exact_per_row", "map_bound_per_row",
            "fit_cpu_s"]
    print("\nMedians over splits")
    print(common.table(summary, cols))
    print("\nPredictive integral (median NLPD over splits)")
    print(common.table([{"dataset": d, "fit": f, **v} for d, p in predictive_summary.items()
                        for f, v in p.items()],
                       ["dataset", "fit", "quadrature", "monte_carlo", "plug_in", "max_abs_diff"]))
    wall = time.perf_counter() - t_start
    print(f"wall {wall:.0f} s")
    print("wrote", common.write_json({
        "args": vars(args), "wall_s": wall, "runs": runs, "summary": summary, "predictive_summary": predictive_summary}, threads=1))


if __name__ == "__main__":
    main()
