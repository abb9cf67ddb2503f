"""Dense numpy prototype of the coupled mean steps, for the multinomial bound the core leaves out.

The core's fixed-point method (csrc/include/pygpfast/cvi.hpp, "Coupled mean steps") replaces,
from its second iteration on, Algorithm 1's Newton step for the means at fixed site precisions
by Newton's step for F~(m) = max_lambda F(m, lambda), followed by the sweep. It does so for the
separable bounds only (logit, Poisson, stick-breaking, ordinal), whose system is block diagonal
over latents. This script solves the joint system over all latents densely, so that it also
covers the multinomial bound, whose latents interact at each point:

  with W_l = V_l o V_l (so that dv_l = -W_l dlambda_l), r = lambda + 2 g^v and the local
  second derivatives F_mm, F_mv, F_vv (per point, L x L), solve for (dm, dv)
      (I - V (Lambda + F_mm)) dm - V F_mv dv = V g,           g = g^m - alpha
      -2 W F_vm dm + (I - 2 W F_vv) dv      = W r
  (V, W block diagonal over latents); then dalpha = g + F_mm dm + F_mv dv.

An iteration is "coupled step, then sweep" after Algorithm 1's own first iteration, with the
bound compared after the sweep (an iteration that lowers it is undone and run as Algorithm 1's).
The second derivatives come from central differences of the core's first derivatives; the sweep
is the literal rank-one algorithm with each scalar problem solved by bracketing; Algorithm 1's
mean step here is Newton's method with V fixed, joint over the latents, run to convergence. On
ionosphere the dense Algorithm 1 reproduces the core's iteration counts exactly.

Usage:
  python bench/python/cvi_coupled_step.py [--case ionosphere|glass-warm] [--settings=-1:3,3:3]
(glass-warm: the six-class multinomial fit converged at a kernel, then warm-started at 1.1 times
its variance, as in a hyperparameter search.)
"""

import argparse
import time

import numpy as np
from scipy.optimize import brentq

import common  # noqa: F401  (sets sys.path for pygpfast)
import cvi_figure1

from pygpfast import cvi
from pygpfast.kernels import RBF


class Dense:
    """Algorithm 1's state (alpha, lambda, V_l, log|I + Lambda_l Sigma|), dense."""

    def __init__(self, Sigma, y, lb, alpha=None, lam=None):
        self.Sigma, self.y, self.lb = Sigma, y, lb
        self.N, self.L = len(y), lb.num_latent
        N, L = self.N, self.L
        self.alpha = np.zeros((L, N)) if alpha is None else alpha.copy()
        self.lam = np.zeros((L, N)) if lam is None else np.maximum(lam, 0.0)
        self.V = np.empty((L, N, N))
        self.logdet = np.zeros(L)
        for l in range(L):  # V = (Sigma^-1 + Lambda)^-1 through B = I + Lambda^1/2 Sigma Lambda^1/2
            s = np.sqrt(self.lam[l])
            C = np.linalg.cholesky(np.eye(N) + s[:, None] * Sigma * s[None, :])
            T = np.linalg.solve(C, s[:, None] * Sigma)
            self.V[l] = Sigma - T.T @ T
            self.logdet[l] = 2 * np.log(np.diag(C)).sum()

    def m(self):
        return self.alpha @ self.Sigma

    def v(self):
        return np.array([np.diag(Vl) for Vl in self.V])

    def local(self, m, v):
        return self.lb(self.y, m, v)[:3]

    def bound(self, alpha=None):
        alpha = self.alpha if alpha is None else alpha
        m, v = alpha @ self.Sigma, self.v()
        return self.local(m, v)[0].sum() + 0.5 * (-self.logdet.sum() + (self.lam * v).sum()
                                                  - (alpha * m).sum())

    def save(self):
        return self.alpha.copy(), self.V.copy(), self.lam.copy(), self.logdet.copy()

    def restore(self, s):
        self.alpha, self.V, self.lam, self.logdet = (x.copy() for x in s)

    def sweep(self):
        m, y, lb = self.m(), self.y, self.lb
        for l in range(self.L):
            for i in range(self.N):
                vi = self.v()[:, i]
                v_old = vi[l]
                c = 1 / v_old - self.lam[l, i]

                def dphi(u):  # v d/dv [log v - c v + 2 f_b(v)] at v = e^u
                    vv = vi.copy()
                    vv[l] = np.exp(u)
                    dv = lb(y[i:i + 1], m[:, i:i + 1], vv[:, None])[2][l, 0]
                    return 1 - c * vv[l] + 2 * dv * vv[l]

                lo = hi = np.log(v_old)
                while dphi(lo) < 0:
                    lo -= 1
                while dphi(hi) > 0:
                    hi += 1
                v_new = np.exp(brentq(dphi, lo, hi, xtol=1e-15, rtol=1e-15)) if lo < hi else v_old
                self.lam[l, i] = 1 / v_new - c
                col = self.V[l, :, i].copy()
                self.V[l] += (v_new - v_old) / v_old**2 * np.outer(col, col)
                self.logdet[l] += np.log(v_old / v_new)

    def second_derivatives(self, m, v):
        """F_mm, F_mv, F_vv [L, L, N] by central differences of d f_b / dm and d f_b / dv."""
        L, N = self.L, self.N
        Fmm, Fmv, Fvv = (np.zeros((L, L, N)) for _ in range(3))
        for k in range(L):
            hm, hv = 1e-5 * np.maximum(1, np.abs(m[k])), 1e-4 * v[k]
            mp, mn, vp, vn = m.copy(), m.copy(), v.copy(), v.copy()
            mp[k] += hm
            mn[k] -= hm
            vp[k] += hv
            vn[k] -= hv
            Fmm[:, k] = (self.local(mp, v)[1] - self.local(mn, v)[1]) / (2 * hm)
            a, b = self.local(m, vp), self.local(m, vn)
            Fmv[:, k] = (a[1] - b[1]) / (2 * hv)
            Fvv[:, k] = (a[2] - b[2]) / (2 * hv)
        return Fmm, Fmv, Fvv

    def mean_step(self, coupled, max_steps=30):
        """Newton on the means with V fixed (to convergence), or one coupled step (whole)."""
        L, N = self.L, self.N
        I = np.eye(L * N)

        def points(F):  # [L, L, N] -> [LN, LN], latent-major
            out = np.zeros((L * N, L * N))
            for l in range(L):
                for k in range(L):
                    out[l * N:(l + 1) * N, k * N:(k + 1) * N] = np.diag(F[l, k])
            return out

        for _ in range(1 if coupled else max_steps):
            m, v = self.m(), self.v()
            _, gm, gv = self.local(m, v)
            Fmm, Fmv, Fvv = (points(F) for F in self.second_derivatives(m, v))
            g, r = (gm - self.alpha).ravel(), (self.lam + 2 * gv).ravel()
            BV, BW = np.zeros((L * N, L * N)), np.zeros((L * N, L * N))
            for l in range(L):
                BV[l * N:(l + 1) * N, l * N:(l + 1) * N] = self.V[l]
                BW[l * N:(l + 1) * N, l * N:(l + 1) * N] = self.V[l] ** 2
            H = Fmm + np.diag(self.lam.ravel())
            if coupled:
                A = np.block([[I - BV @ H, -BV @ Fmv], [-2 * BW @ Fmv.T, I - 2 * BW @ Fvv]])
                x = np.linalg.solve(A, np.concatenate([BV @ g, BW @ r]))
                dm, dv = x[:L * N], x[L * N:]
            else:
                dm, dv = np.linalg.solve(I - BV @ H, BV @ g), np.zeros(L * N)
            da = (g + Fmm @ dm + Fmv @ dv).reshape(L, N)
            if coupled:
                self.alpha = self.alpha + da
                return
            f0, t = self.bound(), 1.0
            while t > 1e-12 and not self.bound(self.alpha + t * da) >= f0:
                t *= 0.5
            if t <= 1e-12:
                return
            gained = self.bound(self.alpha + t * da) - f0
            self.alpha = self.alpha + t * da
            if gained < 1e-12 * abs(f0):
                return


def run(state, coupled, max_iter=300, rtol=1e-11):
    """Bounds after each outer iteration, and how many coupled iterations were undone."""
    hist = [state.bound()]
    state.sweep()
    state.mean_step(False)
    hist.append(state.bound())
    undone = 0
    while len(hist) <= max_iter and abs(hist[-1] - hist[-2]) > rtol * abs(hist[-1]):
        if coupled:
            saved = state.save()
            state.mean_step(True)
            state.sweep()
            if state.bound() < hist[-1]:
                undone += 1
                state.restore(saved)
                coupled_ok = False
            else:
                coupled_ok = True
        if not coupled or not coupled_ok:
            state.sweep()
            state.mean_step(False)
        hist.append(state.bound())
    return np.array(hist), undone


def summary(hist):
    inc = np.diff(hist)
    paper = np.flatnonzero(inc < cvi_figure1.PAPER_TOL)
    return {"iters_1e-3": int(paper[0]) + 1 if paper.size else None,
            "iters_1e-10": int(np.flatnonzero(np.abs(hist - hist[-1]) <= 1e-10 * abs(hist[-1]))[0]),
            "final": float(hist[-1])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="ionosphere", choices=("ionosphere", "glass-warm"))
    ap.add_argument("--settings", default="-1:-1,-1:1,-1:3,1:-1,1:1,1:3,3:-1,3:1,3:3")
    args = ap.parse_args()
    if args.case == "ionosphere":
        X, y, lb = cvi_figure1.load("ionosphere", "stick-breaking")
    else:
        X, y, lb = cvi_figure1.load("glass", "multinomial")
    print("| log s | log sigma | core: Algorithm 1, its to 1e-3 / 1e-10 | core: coupled | "
          "dense Algorithm 1 | dense coupled | undone | final bound | s (dense plain / coupled) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for setting in args.settings.split(","):
        log_s, log_sigma = (float(t) for t in setting.split(":"))
        kernel = RBF(variance=np.exp(2 * log_sigma), lengthscale=np.exp(0.5 * log_s))
        Sigma = kernel(X)
        start = (None, None)
        if args.case == "glass-warm":  # converged at this kernel, then warm at 1.1 x variance
            r0 = cvi.infer(Sigma, y, lb, tol=1e-12, max_iter=2000)
            start = (r0.alpha, r0.lambda_)
            Sigma = 1.1 * Sigma
        row = [summary(cvi.infer(Sigma, y, lb, tol=1e-12, max_iter=2000, block_size=1,
                                 alpha=start[0], lambda_=start[1],
                                 coupled_means=coupled).history[:, 0])
               for coupled in (False, True)]
        times = []
        for coupled in (False, True):
            t0 = time.perf_counter()
            hist, undone = run(Dense(Sigma, y, lb, *start), coupled)
            times.append(time.perf_counter() - t0)
            row.append(summary(hist))
        its = [f"{r['iters_1e-3']} / {r['iters_1e-10']}" for r in row]
        print(f"| {log_s:g} | {log_sigma:g} | {its[0]} | {its[1]} | {its[2]} | {its[3]} | {undone} | "
              f"{row[3]['final']:.9f} | {times[0]:.0f} / {times[1]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
