"""Full GP classification: pygpfast's VGPClassifier against scikit-learn's
GaussianProcessClassifier (Laplace), in one run, on the peers' binary task.

Data: ``binary_data()`` of shared/peers/gpc_full.py (x ~ N(0, I_8), p(y = 1 | x) = Phi(2.5 g(x)),
nested training prefixes N = 500..4000 of one draw, a fixed test set of 2000 points).
Kernels start where the peers' did: scikit-learn ConstantKernel(4) * RBF([2] * 8) (ARD) and
pygpfast RBF(variance=4, lengthscale=[2] * 8).

* fixed: the kernel held fixed (scikit-learn ``optimizer=None``; pygpfast
  ``optimize_hyperparameters=False``).
* opt: the hyperparameters learned, by L-BFGS-B on each method's objective (scikit-learn: the
  Laplace approximation of log p(y); pygpfast: the variational lower bound), from the same start.
  As in the peers' run, scikit-learn's optimiser is capped at ``--cap-opt-maxfun`` evaluations for
  N >= ``--cap-opt-n`` (its row is then marked CAPPED and gives seconds per evaluation).

The two libraries alternate task by task in one process, with the same BLAS and thread count,
and the load average is recorded around every fit (the machine is shared). Metrics: fit and
predict time, hold-out accuracy and NLPD (mean -log p(y* | x*)).

``--data-seeds`` repeats everything on other draws of the same task (``binary_data(seed)``; the
peers' draw is seed 0), to tell a difference in NLPD between the methods from the draw's noise.

Usage: nice python bench/python/cvi_vs_sklearn.py [--ns 500,1000,2000,4000] [--modes fixed,opt]
       [--threads 2] [--cap-opt-n 4000] [--cap-opt-maxfun 8] [--data-seeds 0,1,2]
Writes bench/results/cvi_vs_sklearn.json.
"""

import argparse
import importlib.util
import os
import time

import numpy as np
import scipy.optimize

import common

def peers_script():
    return common.data_dir().parent / "peers" / "gpc_full.py"


def peers_module():
    spec = importlib.util.spec_from_file_location("peers_gpc_full", peers_script())
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def nlpd(p1, y):
    p1 = np.clip(p1, 1e-12, 1 - 1e-12)
    return float(-np.mean(np.where(y == 1, np.log(p1), np.log1p(-p1))))


def timed_fit(clf, X, y, Xte):
    """Fit and predict with their wall times; p1 = p(y = 1) on the test set."""
    t0 = time.perf_counter()
    clf.fit(X, y)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    p1 = clf.predict_proba(Xte)[:, 1]
    return {"fit_s": fit_s, "predict_s": time.perf_counter() - t0, "p1": p1}


def fit_sklearn(X, y, Xte, mode, D, capped, maxfun):
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    kernel = ConstantKernel(4.0, (1e-3, 1e4)) * RBF(np.full(D, 2.0), (1e-2, 1e3))
    log = {}

    def lbfgs(obj_func, initial_theta, bounds):  # scikit-learn's default path, recording nfev
        options = {"maxfun": maxfun} if capped else {}
        r = scipy.optimize.minimize(obj_func, initial_theta, method="L-BFGS-B", jac=True,
                                    bounds=bounds, options=options)
        log.update(nit=int(r.nit), nfev=int(r.nfev))
        return r.x, r.fun

    clf = GaussianProcessClassifier(kernel=kernel, optimizer=None if mode == "fixed" else lbfgs,
                                    n_restarts_optimizer=0)
    row = timed_fit(clf, X, y, Xte)
    row.update(kernel=str(clf.kernel_), evaluations=log.get("nfev"), iterations=log.get("nit"),
               objective=float(clf.log_marginal_likelihood_value_))
    return row


def fit_pygpfast(X, y, Xte, mode, D):
    import pygpfast
    from pygpfast.kernels import RBF

    clf = pygpfast.VGPClassifier(kernel=RBF(variance=4.0, lengthscale=np.full(D, 2.0)),
                                 optimize_hyperparameters=mode == "opt", random_state=0)
    row = timed_fit(clf, X, y, Xte)
    row.update(kernel=repr(clf.kernel_), evaluations=clf.n_evaluations_, iterations=clf.n_iter_,
               objective=clf.objective_,
               inference={k: clf.inference_info_[k] for k in ("iterations", "flops", "converged")})
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="500,1000,2000,4000")
    ap.add_argument("--modes", default="fixed,opt")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cap-opt-n", type=int, default=4000)
    ap.add_argument("--cap-opt-maxfun", type=int, default=8)
    ap.add_argument("--backends", default="sklearn,pygpfast")
    ap.add_argument("--data-seeds", default="0")
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits

    import pygpfast

    if not peers_script().exists():
        print(f"{peers_script()} not available; nothing to do")
        return
    pygpfast.set_num_threads(args.threads)
    peers = peers_module()
    out = {"context": common.context(args.threads), "bayes_optimal_test": {}, "rows": []}
    rows = []
    for seed in (int(v) for v in args.data_seeds.split(",")):
        Xtr_all, ytr_all, Xte, yte, pte = peers.binary_data(seed)
        D = Xtr_all.shape[1]
        bayes = {"acc": float(np.mean((pte > 0.5) == (yte == 1))), "nlpd": nlpd(pte, yte)}
        out["bayes_optimal_test"][seed] = bayes
        print(f"data seed {seed}: Bayes-optimal test acc {bayes['acc']:.4f}, NLPD {bayes['nlpd']:.4f}",
              flush=True)
        with threadpool_limits(args.threads, user_api="blas"):
            for mode in args.modes.split(","):
                for N in (int(n) for n in args.ns.split(",")):
                    X, y = Xtr_all[:N], ytr_all[:N]
                    for backend in args.backends.split(","):
                        capped = backend == "sklearn" and mode == "opt" and N >= args.cap_opt_n
                        load0 = os.getloadavg()[0]
                        if backend == "sklearn":
                            r = fit_sklearn(X, y, Xte, mode, D, capped, args.cap_opt_maxfun)
                        else:
                            r = fit_pygpfast(X, y, Xte, mode, D)
                        p1 = r.pop("p1")
                        r.update(backend=backend, data_seed=seed, N=N, mode=mode, capped=capped,
                                 acc=float(np.mean((p1 > 0.5) == (yte == 1))), nlpd=nlpd(p1, yte),
                                 load_before=load0, load_after=os.getloadavg()[0])
                        if r["evaluations"]:
                            r["s_per_eval"] = r["fit_s"] / r["evaluations"]
                        rows.append(r)
                        print(f"{backend:9s} {mode:5s} N={N:5d} fit {r['fit_s']:8.2f} s  predict "
                              f"{r['predict_s']:6.2f} s  acc {r['acc']:.4f}  NLPD {r['nlpd']:.4f}  "
                              f"evals {r['evaluations']}{' CAPPED' if capped else ''}  "
                              f"load {load0:.1f}->{r['load_after']:.1f}", flush=True)
    out["rows"] = rows
    cols = ["backend", "data_seed", "mode", "N", "fit_s", "predict_s", "acc", "nlpd", "evaluations",
            "s_per_eval", "capped", "load_before", "load_after"]
    print(f"\nthreads={args.threads}\n")
    print(common.table(rows, cols))
    print("wrote", common.write_json(out))


if __name__ == "__main__":
    main()
