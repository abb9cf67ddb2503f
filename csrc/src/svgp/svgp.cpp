#include "pygpfast/svgp/svgp.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/linalg.hpp"
#include "pygpfast/region_errors.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/workspace.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace pygpfast::svgp {
namespace {

using blas::Diag;
using blas::Side;
using blas::Trans;
using blas::Uplo;
using linalg::fixed_order_sum;
using linalg::mirror_lower;
using linalg::symmetrise;

using workspace::Buffer;
using workspace::Scratch;

void check_shapes(const kernels::Kernel& kernel, const Variational& q, ConstMatrixView X) {
  const index_t M = q.Z.rows, L = q.num_latent();
  require(M >= 1, "svgp: need at least one inducing point");
  require(L >= 1, "svgp: need at least one latent function (q_mu has no columns)");
  require(q.Z.cols == kernel.input_dim(), "svgp: Z has ", q.Z.cols, " columns but the kernel expects ",
          kernel.input_dim());
  require(X.cols == q.Z.cols, "svgp: X has ", X.cols, " columns but Z has ", q.Z.cols);
  require(q.q_mu.rows == M, "svgp: q_mu must have M = ", M, " rows");
  require(q.q_sqrt != nullptr, "svgp: q_sqrt is missing");
  for (index_t l = 0; l < L; ++l)
    for (index_t i = 0; i < M; ++i)
      if (q.q_sqrt[(l * M + i) * M + i] == 0.0)
        throw std::invalid_argument("svgp: q_sqrt[" + std::to_string(l) + "] has a zero on its diagonal (row " +
                                    std::to_string(i) + "); S = L L^T must be positive definite");
  if (q.mean != nullptr)
    for (index_t l = 0; l < L; ++l)
      require(std::isfinite(q.mean[l]), "svgp: prior_mean[", l, "] = ", q.mean[l], " must be finite");
}

// Lz with Lz Lz^T = K(Z, Z) + jitter mean(diag K(Z, Z)) I, and K(Z, Z) itself in `Kzz` when
// not null. Returns the extra jitter escalation needed.
double inducing_cholesky(const kernels::Kernel& kernel, ConstMatrixView Z, double jitter,
                         Scratch& Lz, Buffer* Kzz = nullptr) {
  const index_t M = Z.rows;
  Lz.resize(M * M);
  MatrixView L(Lz.data(), M, M);
  kernel.K(Z, Z, true, L);
  if (Kzz != nullptr) Kzz->assign(Lz.data(), Lz.data() + M * M);
  linalg::add_relative_jitter(L, jitter, "K(Z, Z)", "the inducing inputs Z");
  return linalg::cholesky_jitter(L).jitter;
}

// Whitened parameters: mw [M, L] and Lw [L, M, M] are (q_mu, tril q_sqrt) when whitened, else
// (Lz^-1 q_mu, Lz^-1 tril q_sqrt).
void whitened_parameters(const Variational& q, ConstMatrixView Lz, Buffer& mw, Scratch& Lw) {
  const index_t M = q.Z.rows, L = q.num_latent();
  mw.resize(static_cast<std::size_t>(M * L));
  for (index_t i = 0; i < M; ++i)
    for (index_t l = 0; l < L; ++l) mw[i * L + l] = q.q_mu(i, l);
  Lw.resize(L * M * M);
  for (index_t l = 0; l < L; ++l)
    for (index_t i = 0; i < M; ++i) {
      const double* from = q.q_sqrt + (l * M + i) * M;
      double* to = Lw.data() + (l * M + i) * M;
      std::copy(from, from + i + 1, to);
      std::fill(to + i + 1, to + M, 0.0);
    }
  if (!q.whiten) {
    linalg::solve_lower(Lz, MatrixView(mw.data(), M, L), false);
    for (index_t l = 0; l < L; ++l)
      linalg::solve_lower(Lz, MatrixView(Lw.data() + l * M * M, M, M), false);
  }
}

// out[n] = sum_m A[m, n]^2 (column sums of squares of an [M, B] block), row by row so the
// inner loop runs over contiguous memory.
void column_sums_of_squares(ConstMatrixView A, double* out) {
  std::fill(out, out + A.cols, 0.0);
  for (index_t m = 0; m < A.rows; ++m) {
    const double* a = A.row(m);
#pragma omp simd
    for (index_t n = 0; n < A.cols; ++n) out[n] += a[n] * a[n];
  }
}

// out[n] += sum_m A[m, n] B[m, n].
void add_column_dots(ConstMatrixView A, ConstMatrixView B, double* out) {
  for (index_t m = 0; m < A.rows; ++m) {
    const double* a = A.row(m);
    const double* b = B.row(m);
#pragma omp simd
    for (index_t n = 0; n < A.cols; ++n) out[n] += a[n] * b[n];
  }
}

// The lower triangle (with the diagonal) of C = alpha X Y^T + beta C for X, Y [M, K], in row
// blocks so that the GEMMs skip all but ~M nb / 2 of the M^2 / 2 entries above the diagonal.
// Entries above the diagonal are left as garbage: callers read the lower triangle.
void gemm_nt_lower(double alpha, ConstMatrixView X, ConstMatrixView Y, double beta, MatrixView C) {
  const index_t M = X.rows;
  const index_t nb = std::max<index_t>(32, (M + 7) / 8);
  for (index_t i0 = 0; i0 < M; i0 += nb) {
    const index_t rows = std::min(nb, M - i0), cols = i0 + rows;
    blas::gemm(Trans::No, Trans::Yes, alpha, ConstMatrixView(X.row(i0), rows, X.cols, X.ld),
               ConstMatrixView(Y.data, cols, Y.cols, Y.ld), beta, MatrixView(C.row(i0), rows, cols, C.ld));
  }
}

void zero_strict_upper(MatrixView A) {
  for (index_t i = 0; i < A.rows; ++i) std::fill(A.row(i) + i + 1, A.row(i) + A.cols, 0.0);
}

// [n] entries of latent function l of a [n, L] array.
void latent_column(const double* a, index_t n, index_t L, index_t l, double* out) {
  for (index_t i = 0; i < n; ++i) out[i] = a[i * L + l];
}

// ---- What the column blocks of a minibatch share: O(M^3), prepared before them ------------------

struct Shared {
  index_t M = 0, L = 0;
  Scratch Lz, Lw;
  Buffer Kzz, mw;
  // Path::Precomputed: Y = Lz^-1, Sigma_l = W_l W_l^T - Y^T Y (full) with W_l = Y^T L_w,l, and
  // beta = Y^T m_w.
  bool precomputed = false;
  Scratch Y, Sigma;
  Buffer beta;

  ConstMatrixView LzV() const { return ConstMatrixView(Lz.data(), M, M); }
  ConstMatrixView Lw_of(index_t l) const { return ConstMatrixView(Lw.data() + l * M * M, M, M); }
  ConstMatrixView Sigma_of(index_t l) const { return ConstMatrixView(Sigma.data() + l * M * M, M, M); }

  void prepare_precomputed() {
    precomputed = true;
    Y.resize(M * M);
    const MatrixView YV(Y.data(), M, M);
    for (index_t i = 0; i < M; ++i) {
      std::copy(Lz.data() + i * M, Lz.data() + i * M + i + 1, YV.row(i));
      std::fill(YV.row(i) + i + 1, YV.row(i) + M, 0.0);
    }
    if (blas::trtri_lower(YV) != 0)  // (Lz has a positive diagonal: cannot happen)
      throw LinAlgError("trtri", 1, "the Cholesky factor of Kzz is singular");
    Scratch Q(M * M);
    std::copy(Y.data(), Y.data() + M * M, Q.data());
    const MatrixView QV(Q.data(), M, M);
    blas::lauum_lower(QV);  // Y^T Y (lower triangle)
    Scratch W(M * M);
    Sigma.resize(L * M * M);
    for (index_t l = 0; l < L; ++l) {
      const MatrixView Wl(W.data(), M, M), Sl(Sigma.data() + l * M * M, M, M);
      std::copy(Lw.data() + l * M * M, Lw.data() + (l + 1) * M * M, W.data());
      blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, YV, Wl);
      blas::syrk(Uplo::Lower, Trans::No, 1.0, Wl, 0.0, Sl);
      for (index_t i = 0; i < M; ++i)
        for (index_t j = 0; j <= i; ++j) Sl(i, j) -= QV(i, j);
      mirror_lower(Sl);
    }
    beta = mw;
    blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, YV, MatrixView(beta.data(), M, L));
  }
};

// One of the blocks' partial gradients. A block's first contribution overwrites it (BLAS
// beta = 0: no zeroing between blocks), later ones add to it; the total takes a block's share
// only where the block wrote one (`set`).
struct Part {
  Buffer v;
  bool set = false;

  // The array (of n doubles) for a contribution, and the BLAS beta that contribution takes.
  double* take(index_t n, double& beta) {
    beta = set ? 1.0 : 0.0;
    if (!set) v.resize(static_cast<std::size_t>(n));
    set = true;
    return v.data();
  }
  // The total's array, zero where no block wrote one (for code that adds to it).
  double* zeroed_if_unset(index_t n) {
    if (!set) v.assign(static_cast<std::size_t>(n), 0.0);
    set = true;
    return v.data();
  }
  void add(const Part& o) {
    if (!o.set) return;
    if (!set) {
      v = o.v;
      set = true;
    } else {
      for (std::size_t i = 0; i < v.size(); ++i) v[i] += o.v[i];
    }
  }
};

// What a block adds to the gradients (summed over the blocks in block order). All of the
// scaled expected log-likelihood alone, in whitened coordinates.
struct Partials {
  // Triangular-solve blocks: d/dm_w, d/dL_w (lower), d/dS_w (lower), d/dLz (lower).
  Part dmw, dLw, dSw, dLz;
  // Precomputed blocks: d/dSigma_l (lower) and d/dbeta.
  Part dSigma, dbeta;
  bool any_solve = false;
  // The constant means and the likelihood variance (the kernel's vjp has per-block slots).
  Buffer dmean;
  double dlik = 0.0;

  // Starts the next block.
  void reset() {
    for (Part* q : {&dmw, &dLw, &dSw, &dLz, &dSigma, &dbeta}) q->set = false;
    std::fill(dmean.begin(), dmean.end(), 0.0);
    dlik = 0.0;
    any_solve = false;
  }

  void add(const Partials& o) {
    dmw.add(o.dmw);
    dLw.add(o.dLw);
    dSw.add(o.dSw);
    dLz.add(o.dLz);
    dSigma.add(o.dSigma);
    dbeta.add(o.dbeta);
    if (dmean.empty())
      dmean = o.dmean;
    else
      for (std::size_t i = 0; i < dmean.size(); ++i) dmean[i] += o.dmean[i];
    dlik += o.dlik;
    any_solve = any_solve || o.any_solve;
  }
};

struct Wants {
  bool grads = false;  // any gradient
  bool dLw = false;    // d/dL_w (q_sqrt's gradient, or unwhitened)
  bool dSw = false;    // d/dS_w (natural gradients)
};

// Points per block whose precomputed variances are checked by triangular solves.
constexpr index_t kCheckedPoints = 2;

// Per-thread buffers of one column block, reused across the blocks a thread takes.
struct BlockWork {
  Scratch K, A, T, W;
  Buffer kdiag, a2, t2, k2, g, gsum;
};

// One column block [n0, n0 + nb) of the minibatch in three steps that elbo() schedules: its
// kernel block K = K(Z, X_b) (and diag K(X_b)); the marginals, the expectations and (when
// wanted) the block's share of every gradient but the kernel's, which leaves d/dK; the kernel's
// vjp. Precomputed blocks whose variances fail the accuracy check are redone by triangular
// solves (svgp.hpp), so blocks may take either path.
class BlockEvaluator {
 public:
  BlockEvaluator(const Shared& sh, const kernels::Kernel& kernel, const likelihoods::Likelihood& lik,
                 const Variational& q, const Batch& batch, const Wants& wants, double* mu, double* var,
                 double* f, double* gmu, double* gvar, double* gpar)
      : sh_(sh), kernel_(kernel), lik_(lik), q_(q), batch_(batch), wants_(wants), mu_(mu), var_(var), f_(f),
        gmu_(gmu), gvar_(gvar), gpar_(gpar) {}

  // K [M, nb] = K(Z, X_b), kdiag [nb] = diag K(X_b, X_b).
  void kernel(index_t n0, index_t nb, MatrixView K, double* kdiag) const {
    const ConstMatrixView Xb = rows(n0, nb);
    kernel_.K(q_.Z, Xb, false, K);
    kernel_.Kdiag(Xb, kdiag);
  }

  // The marginals and expectations of the block and, with gradients, its partials and
  // d/dK [M, nb], which it returns: written to dK, or where null to w.T's first M x nb entries.
  MatrixView forward_reverse(index_t n0, ConstMatrixView K, const double* kdiag, BlockWork& w, Partials& part,
                             double* dK) const {
    const index_t L = sh_.L, nb = K.cols;
    double* mu = mu_ + n0 * L;
    double* var = var_ + n0 * L;
    bool precomputed = sh_.precomputed;
    if (precomputed) {
      w.T.resize(L * sh_.M * nb);  // C_l = Sigma_l K
      precomputed_marginals(K, kdiag, w, mu, var);
      precomputed = variances_accurate(K, kdiag, var, w);
    }
    if (!precomputed) {
      w.A.resize(sh_.M * nb);
      w.T.resize(L * sh_.M * nb);
      solve_marginals(K, kdiag, w, mu, var);
      part.any_solve = true;
    }

    if (q_.mean != nullptr)
      for (index_t n = 0; n < nb; ++n)
        for (index_t l = 0; l < L; ++l) mu[n * L + l] += q_.mean[l];
    // Products of kernel values beyond ~1e154 overflow (K(X, Z) Kzz^-1 K(Z, X) at a kernel
    // variance of 1e300): the likelihood's check would name a NaN mean and not its cause.
    for (index_t k = 0; k < nb * L; ++k)
      if (!(std::isfinite(mu[k]) && std::isfinite(var[k])))
        throw LinAlgError("svgp", 1,
                          "the marginal of q(f) at row " + std::to_string(n0 + k / L) + " is not finite (mean " +
                              format_value(mu[k]) + ", variance " + format_value(var[k]) +
                              ", prior variance k(x, x) = " + format_value(kdiag[k / L]) +
                              "): the kernel's scale overflows float64 in the ELBO's products; use a "
                              "kernel of smaller variance (bounds or priors that keep it moderate) or "
                              "rescale the targets");
    likelihoods::variational_expectations(lik_, batch_.y + n0, mu, var, nb, f_ + n0, gmu_ + n0 * L,
                                          gvar_ + n0 * L, gpar_ + n0);
    if (!wants_.grads) return MatrixView();
    double* gmu = gmu_ + n0 * L;
    double* gvar = gvar_ + n0 * L;
    for (index_t i = 0; i < nb * L; ++i) {
      gmu[i] *= batch_.scale;
      gvar[i] *= batch_.scale;
    }
    if (q_.mean != nullptr) {  // (d/dmean_l = sum_n gmu_nl; no work without a prior mean)
      if (part.dmean.empty()) part.dmean.assign(static_cast<std::size_t>(L), 0.0);
      for (index_t n = 0; n < nb; ++n)
        for (index_t l = 0; l < L; ++l) part.dmean[l] += gmu[n * L + l];
    }
    part.dlik += batch_.scale * fixed_order_sum(gpar_ + n0, nb);
    const MatrixView dKV(dK != nullptr ? dK : w.T.data(), sh_.M, nb);
    if (precomputed)
      precomputed_reverse(K, w, gmu, gvar, part, dKV);
    else
      solve_reverse(w, gmu, gvar, part, dKV);
    return dKV;
  }

  // dkernel [P] += the block's share of the kernel parameters' gradient, dZ [M, D] += Z's
  // (through K), from K and dK.
  void vjp(index_t n0, ConstMatrixView K, ConstMatrixView dK, BlockWork& w, double* dkernel, MatrixView dZ) const {
    const index_t L = sh_.L, nb = K.cols;
    const ConstMatrixView Xb = rows(n0, nb);
    kernel_.K_vjp(q_.Z, Xb, false, dK, K, dkernel, &dZ, nullptr);
    const double* gvar = gvar_ + n0 * L;
    w.gsum.assign(static_cast<std::size_t>(nb), 0.0);
    for (index_t n = 0; n < nb; ++n)
      for (index_t l = 0; l < L; ++l) w.gsum[n] += gvar[n * L + l];
    kernel_.Kdiag_vjp(Xb, w.gsum.data(), dkernel);
  }

 private:
  // ---- Path::Precomputed: C_l = Sigma_l K; mu = K^T beta; var_l = kdiag + colsum(K o C_l).
  // One pass over K and C_0 gives var_0, w.k2 = colsum(K o K), which the accuracy check reads,
  // and, when L = 1, mu.
  void precomputed_marginals(ConstMatrixView K, const double* kdiag, BlockWork& w, double* mu, double* var) const {
    const index_t M = sh_.M, L = sh_.L, nb = K.cols;
    if (L > 1)
      blas::gemm(Trans::Yes, Trans::No, 1.0, K, ConstMatrixView(sh_.beta.data(), M, L), 0.0, MatrixView(mu, nb, L));
    else
      std::fill(mu, mu + nb, 0.0);
    w.a2.resize(nb);
    w.k2.assign(static_cast<std::size_t>(nb), 0.0);
    double* dots = w.a2.data();
    double* k2 = w.k2.data();
    for (index_t l = 0; l < L; ++l) {
      const MatrixView Cl(w.T.data() + l * M * nb, M, nb);
      blas::symm(Side::Left, Uplo::Lower, 1.0, sh_.Sigma_of(l), K, 0.0, Cl);
      std::copy(kdiag, kdiag + nb, dots);
      if (l > 0) {
        add_column_dots(K, Cl, dots);
      } else {
        for (index_t m = 0; m < M; ++m) {
          const double* k = K.row(m);
          const double* c = Cl.row(m);
          if (L == 1) {
            const double b = sh_.beta[m];
#pragma omp simd
            for (index_t n = 0; n < nb; ++n) {
              dots[n] += k[n] * c[n];
              k2[n] += k[n] * k[n];
              mu[n] += k[n] * b;
            }
          } else {
#pragma omp simd
            for (index_t n = 0; n < nb; ++n) {
              dots[n] += k[n] * c[n];
              k2[n] += k[n] * k[n];
            }
          }
        }
      }
      for (index_t n = 0; n < nb; ++n) var[n * L + l] = std::max(dots[n], 0.0);
    }
  }

  // The precomputed form loses about log10(cond(Kzz)) digits (svgp.hpp). Recompute the
  // variances of the kCheckedPoints points with the largest |k_n|^2 / var_n (|k_n|^2 in w.k2)
  // by triangular solves; true when all agree with `var` to 1e-8 relative (1e-12 of kxx_n
  // absolute).
  bool variances_accurate(ConstMatrixView K, const double* kdiag, const double* var, const BlockWork& w) const {
    const index_t M = sh_.M, L = sh_.L, nb = K.cols;
    const double* k2 = w.k2.data();
    std::vector<index_t> order(static_cast<std::size_t>(nb));
    std::iota(order.begin(), order.end(), index_t{0});
    auto exposure = [&](index_t n) {
      double v = var[n * L];
      for (index_t l = 1; l < L; ++l) v = std::min(v, var[n * L + l]);
      return k2[n] / std::max(v, 1e-300);
    };
    const index_t count = std::min(kCheckedPoints, nb);
    std::partial_sort(order.begin(), order.begin() + count, order.end(),
                      [&](index_t a, index_t b) { return exposure(a) > exposure(b); });
    Buffer a(M), t(M);
    for (index_t c = 0; c < count; ++c) {
      const index_t n = order[c];
      for (index_t m = 0; m < M; ++m) a[m] = K(m, n);
      blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, sh_.LzV(), a.data());
      double a2 = 0.0;
      for (index_t m = 0; m < M; ++m) a2 += a[m] * a[m];
      for (index_t l = 0; l < L; ++l) {
        const ConstMatrixView Ll = sh_.Lw_of(l);  // t = L_w,l^T a
        std::fill(t.begin(), t.end(), 0.0);
        for (index_t i = 0; i < M; ++i)
          for (index_t j = 0; j <= i; ++j) t[j] += Ll(i, j) * a[i];
        double t2 = 0.0;
        for (index_t m = 0; m < M; ++m) t2 += t[m] * t[m];
        const double exact = std::max(kdiag[n] - a2 + t2, 0.0);
        if (std::fabs(var[n * L + l] - exact) > 1e-8 * exact + 1e-12 * std::fabs(kdiag[n])) return false;
      }
    }
    return true;
  }

  // d/dSigma_l += K diag(g_l) K^T (lower); d/dbeta += K gmu; dK = sum_l 2 C_l diag(g_l) + beta gmu^T
  // (dK may be C_0). When L = 1, d/dbeta and beta gmu^T come with the pass that forms dK.
  void precomputed_reverse(ConstMatrixView K, BlockWork& w, const double* gmu, const double* gvar, Partials& part,
                           MatrixView dK) const {
    const index_t M = sh_.M, L = sh_.L, nb = K.cols;
    double beta_sigma, beta_b;
    double* dSigma = part.dSigma.take(L * M * M, beta_sigma);
    double* dbeta = part.dbeta.take(M * L, beta_b);
    w.W.resize(M * nb);
    w.g.resize(nb);
    for (index_t l = 0; l < L; ++l) {
      latent_column(gvar, nb, L, l, w.g.data());
      linalg::weighted_gram(K, w.g.data(), w.W.data(), MatrixView(dSigma + l * M * M, M, M), beta_sigma);
    }
    if (L > 1)
      blas::gemm(Trans::No, Trans::No, 1.0, K, ConstMatrixView(gmu, nb, L), beta_b, MatrixView(dbeta, M, L));
    for (index_t l = 0; l < L; ++l) {
      latent_column(gvar, nb, L, l, w.g.data());
      const MatrixView Cl(w.T.data() + l * M * nb, M, nb);
      const double* g = w.g.data();
      for (index_t m = 0; m < M; ++m) {
        const double* c = Cl.row(m);
        double* d = dK.row(m);
        if (L == 1) {
          const double* k = K.row(m);
          const double b = sh_.beta[m];
          double s = 0.0;
#pragma omp simd reduction(+ : s)
          for (index_t n = 0; n < nb; ++n) {
            d[n] = 2.0 * c[n] * g[n] + b * gmu[n];
            s += k[n] * gmu[n];
          }
          dbeta[m] = (beta_b == 0.0 ? 0.0 : dbeta[m]) + s;
        } else if (l == 0) {
#pragma omp simd
          for (index_t n = 0; n < nb; ++n) d[n] = 2.0 * c[n] * g[n];
        } else {
#pragma omp simd
          for (index_t n = 0; n < nb; ++n) d[n] += 2.0 * c[n] * g[n];
        }
      }
    }
    if (L > 1)
      blas::gemm(Trans::No, Trans::Yes, 1.0, ConstMatrixView(sh_.beta.data(), M, L), ConstMatrixView(gmu, nb, L), 1.0,
                 dK);
  }

  // ---- Path::Solve: A = Lz^-1 K, T_l = L_w,l^T A; mu = A^T m_w; var_l = kdiag - |A|^2 + |T_l|^2.
  void solve_marginals(ConstMatrixView K, const double* kdiag, BlockWork& w, double* mu, double* var) const {
    const index_t M = sh_.M, L = sh_.L, nb = K.cols;
    const MatrixView A(w.A.data(), M, nb);
    std::copy(K.data, K.data + M * nb, A.data);
    linalg::solve_lower(sh_.LzV(), A, false);
    if (L == 1)
      blas::gemv(Trans::Yes, 1.0, A, sh_.mw.data(), 0.0, mu);
    else
      blas::gemm(Trans::Yes, Trans::No, 1.0, A, ConstMatrixView(sh_.mw.data(), M, L), 0.0, MatrixView(mu, nb, L));
    w.a2.resize(nb);
    w.t2.resize(nb);
    column_sums_of_squares(A, w.a2.data());
    for (index_t l = 0; l < L; ++l) {
      const MatrixView Tl(w.T.data() + l * M * nb, M, nb);
      std::copy(A.data, A.data + M * nb, Tl.data);
      blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, sh_.Lw_of(l), Tl);
      column_sums_of_squares(Tl, w.t2.data());
      for (index_t n = 0; n < nb; ++n) var[n * L + l] = std::max(kdiag[n] - w.a2[n] + w.t2[n], 0.0);
    }
  }

  // d/dm_w += A gmu; d/dS_w,l += A diag(g_l) A^T; d/dL_w,l += 2 tril(A diag(g_l) T_l^T);
  // d/dA = sum_l 2 L_w,l T_l diag(g_l) - 2 A diag(sum_l g_l) + m_w gmu^T; dK = Lz^-T d/dA (dK may
  // be T_0), and d/dLz += -tril(dK A^T).
  void solve_reverse(BlockWork& w, const double* gmu, const double* gvar, Partials& part, MatrixView dK) const {
    const index_t M = sh_.M, L = sh_.L, nb = dK.cols;
    const MatrixView A(w.A.data(), M, nb);
    double beta_m, beta_z, beta_l = 0.0, beta_s = 0.0;
    double* dmw = part.dmw.take(M * L, beta_m);
    double* dLz = part.dLz.take(M * M, beta_z);
    double* dLw = wants_.dLw ? part.dLw.take(L * M * M, beta_l) : nullptr;
    double* dSw = wants_.dSw ? part.dSw.take(L * M * M, beta_s) : nullptr;
    if (L == 1)
      blas::gemv(Trans::No, 1.0, A, gmu, beta_m, dmw);
    else
      blas::gemm(Trans::No, Trans::No, 1.0, A, ConstMatrixView(gmu, nb, L), beta_m, MatrixView(dmw, M, L));
    w.g.resize(nb);
    w.gsum.assign(static_cast<std::size_t>(nb), 0.0);
    for (index_t l = 0; l < L; ++l) {
      latent_column(gvar, nb, L, l, w.g.data());
      for (index_t n = 0; n < nb; ++n) w.gsum[n] += w.g[n];
      if (wants_.dSw) {
        w.W.resize(M * nb);
        linalg::weighted_gram(A, w.g.data(), w.W.data(), MatrixView(dSw + l * M * M, M, M), beta_s);
      }
      const MatrixView Tl(w.T.data() + l * M * nb, M, nb);
      for (index_t m = 0; m < M; ++m) {
        double* t = Tl.row(m);
        const double* g = w.g.data();
#pragma omp simd
        for (index_t n = 0; n < nb; ++n) t[n] *= g[n];
      }
      if (wants_.dLw) gemm_nt_lower(2.0, A, Tl, beta_l, MatrixView(dLw + l * M * M, M, M));
      blas::trmm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 2.0, sh_.Lw_of(l), Tl);
      if (l > 0) blas::axpy(M * nb, 1.0, Tl.data, w.T.data());
    }
    const MatrixView T0(w.T.data(), M, nb);
    for (index_t m = 0; m < M; ++m) {
      const double* t = T0.row(m);
      double* d = dK.row(m);
      const double* a = A.row(m);
      const double* gs = w.gsum.data();
#pragma omp simd
      for (index_t n = 0; n < nb; ++n) d[n] = t[n] - 2.0 * a[n] * gs[n];
    }
    if (L == 1)
      blas::ger(1.0, sh_.mw.data(), gmu, dK);
    else
      blas::gemm(Trans::No, Trans::Yes, 1.0, ConstMatrixView(sh_.mw.data(), M, L), ConstMatrixView(gmu, nb, L), 1.0,
                 dK);
    linalg::solve_lower(sh_.LzV(), dK, true);
    gemm_nt_lower(-1.0, dK, A, beta_z, MatrixView(dLz, M, M));
  }

  ConstMatrixView rows(index_t n0, index_t nb) const {
    return ConstMatrixView(batch_.X.row(n0), nb, batch_.X.cols, batch_.X.ld);
  }

  const Shared& sh_;
  const kernels::Kernel& kernel_;
  const likelihoods::Likelihood& lik_;
  const Variational& q_;
  const Batch& batch_;
  const Wants& wants_;
  double *mu_, *var_, *f_, *gmu_, *gvar_, *gpar_;
};

// The precomputed blocks' d/dSigma_l and d/dbeta taken through Sigma_l = Y^T (S_w,l - I) Y
// (S_w,l = L_w,l L_w,l^T), beta = Y^T m_w and Y = Lz^-1, added to the solve-style gradients.
// With X_l = Y dSigma_l (so that d/dW_l = 2 dSigma_l W_l gives Y d/dW_l = 2 X_l W_l):
//   d/dS_w,l = X_l Y^T,  d/dL_w,l = 2 tril(d/dS_w,l L_w,l),  d/dm_w = Y dbeta,
//   d/dLz = -tril(Y^T dY Y^T) = -tril(sum_l 2 Sigma_l X_l^T + beta (Y dbeta)^T),
// the last because Y^T dY Y^T collects W_l W_l^T - Y^T Y = Sigma_l. About 4 M^3 flops per
// latent function (3 without d/dL_w).
void precomputed_to_whitened(const Shared& sh, const Wants& wants, Partials& p) {
  const index_t M = sh.M, L = sh.L;
  const ConstMatrixView Y(sh.Y.data(), M, M);
  double* dmw = p.dmw.zeroed_if_unset(M * L);
  const MatrixView dLz(p.dLz.zeroed_if_unset(M * M), M, M);
  double* dLw = wants.dLw ? p.dLw.zeroed_if_unset(L * M * M) : nullptr;
  double* dSw = wants.dSw ? p.dSw.zeroed_if_unset(L * M * M) : nullptr;
  Buffer Ydbeta(p.dbeta.v);
  const MatrixView YdbetaV(Ydbeta.data(), M, L);
  blas::trmm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, Y, YdbetaV);
  for (index_t i = 0; i < M * L; ++i) dmw[i] += Ydbeta[i];
  gemm_nt_lower(-1.0, ConstMatrixView(sh.beta.data(), M, L), YdbetaV, 1.0, dLz);

  Scratch X(M * M), dS(M * M);
  const MatrixView XV(X.data(), M, M), dSV(dS.data(), M, M);
  for (index_t l = 0; l < L; ++l) {
    std::copy(p.dSigma.v.data() + l * M * M, p.dSigma.v.data() + (l + 1) * M * M, X.data());
    mirror_lower(XV);  // (the blocks sum lower triangles)
    blas::trmm(Side::Left, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, Y, XV);
    gemm_nt_lower(-2.0, sh.Sigma_of(l), XV, 1.0, dLz);
    if (!wants.dSw && !wants.dLw) continue;
    std::copy(X.data(), X.data() + M * M, dS.data());
    blas::trmm(Side::Right, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0, Y, dSV);
    // Symmetrised even when only d/dL_w is wanted, so that every gradient is bitwise the same
    // whichever outputs are asked for (natural or plain, tested).
    symmetrise(dSV);
    if (wants.dSw) {
      double* out = dSw + l * M * M;
      for (index_t i = 0; i < M * M; ++i) out[i] += dSV.data[i];
    }
    if (wants.dLw) {
      blas::trmm(Side::Right, Uplo::Lower, Trans::No, Diag::NonUnit, 2.0, sh.Lw_of(l), dSV);
      const MatrixView out(dLw + l * M * M, M, M);
      for (index_t i = 0; i < M; ++i)
        for (index_t j = 0; j <= i; ++j) out(i, j) += dSV(i, j);
    }
  }
}

// Costs of the two paths in flop-equivalents (svgp.hpp): the B M^2 terms are the flop counts; the
// M^3 terms weight the small triangular BLAS-3 calls by their lower speed, and put the paths'
// crossover where one thread puts it: B of about 2 M at M = 64 and 2.2 M at M = 256 (timed
// around it), about 2.5 M at M = 1024 (from the times at B = 1, 256 and 1024).
double path_cost(Path path, index_t M, index_t B, index_t L) {
  const double bm2 = static_cast<double>(B) * M * M, m3 = static_cast<double>(M) * M * M;
  return path == Path::Solve ? (4.0 + 4.0 * L) * bm2 + 2.0 * m3 : 3.1 * L * bm2 + (5.0 + 7.3 * L) * m3;
}

Path cheaper_path(index_t M, index_t B, index_t L) {
  return path_cost(Path::Precomputed, M, B, L) < path_cost(Path::Solve, M, B, L) ? Path::Precomputed
                                                                                    : Path::Solve;
}

// KL[q(v_l) || N(0, I)] summed over the latent functions, from the whitened parameters.
double kl_divergence(const Shared& sh) {
  const index_t M = sh.M, L = sh.L;
  double kl = 0.0;
  for (index_t l = 0; l < L; ++l) {
    const ConstMatrixView Ll = sh.Lw_of(l);
    double trace = 0.0, logdet = 0.0, mm = 0.0;
    for (index_t i = 0; i < M; ++i) {
      for (index_t j = 0; j <= i; ++j) trace += Ll(i, j) * Ll(i, j);
      logdet += 2.0 * std::log(std::fabs(Ll(i, i)));
      mm += sh.mw[i * L + l] * sh.mw[i * L + l];
    }
    kl += 0.5 * (trace + mm - static_cast<double>(M) - logdet);
  }
  return kl;
}

// Every gradient but the blocks' kernel vjps, from the blocks' summed partials p: q's (with the
// KL's, and the natural-gradient outputs), the likelihood's and the means', and K(Z, Z)'s share
// of the kernel's and of Z's, which go to grads.kernel (overwritten) and dZzz [M, D].
void gradients_through_q(const kernels::Kernel& kernel, const Variational& q, const Shared& sh, const Wants& wants,
                         double jitter, Partials& p, const Gradients* grads, Buffer& dZzz) {
  const index_t M = sh.M, L = sh.L, D = q.Z.cols;
  const ConstMatrixView LzV = sh.LzV();
  if (p.dSigma.set) precomputed_to_whitened(sh, wants, p);
  // (Every block writes d/dm_w and d/dLz, and d/dL_w, d/dS_w when wanted.)
  if (wants.dSw)
    for (index_t l = 0; l < L; ++l) mirror_lower(MatrixView(p.dSw.v.data() + l * M * M, M, M));
  MatrixView dLzV(p.dLz.v.data(), M, M);

  // Natural-gradient outputs: d ELL / d m_w and d ELL / d S_w per latent function; in u-space
  // (u = Lz v) they are Lz^-T (.) and Lz^-T (.) Lz^-1.
  if (grads->ell_q_mu != nullptr) {
    const MatrixView out(grads->ell_q_mu, M, L);
    std::copy(p.dmw.v.begin(), p.dmw.v.end(), out.data);
    if (!q.whiten) linalg::solve_lower(LzV, out, true);
  }
  if (grads->ell_q_cov != nullptr) {
    for (index_t l = 0; l < L; ++l) {
      const MatrixView G(grads->ell_q_cov + l * M * M, M, M);
      std::copy(p.dSw.v.data() + l * M * M, p.dSw.v.data() + (l + 1) * M * M, G.data);
      if (!q.whiten) {
        linalg::solve_lower(LzV, G, true);
        blas::trsm(Side::Right, Uplo::Lower, Trans::No, Diag::NonUnit, 1.0, LzV, G);
        symmetrise(G);
      }
    }
  }

  // The KL's gradients: d/dm_w = -m_w, d/dL_w = -L_w + diag(1 / L_w,ii) (lower).
  Buffer& dmw = p.dmw.v;
  for (std::size_t i = 0; i < dmw.size(); ++i) dmw[i] -= sh.mw[i];
  const MatrixView dmwV(dmw.data(), M, L);
  if (wants.dLw)
    for (index_t l = 0; l < L; ++l) {
      const ConstMatrixView Ll = sh.Lw_of(l);
      const MatrixView dLl(p.dLw.v.data() + l * M * M, M, M);
      zero_strict_upper(dLl);
      for (index_t i = 0; i < M; ++i) {
        for (index_t j = 0; j < i; ++j) dLl(i, j) -= Ll(i, j);
        dLl(i, i) += 1.0 / Ll(i, i) - Ll(i, i);
      }
    }

  if (q.whiten) {
    if (grads->q_mu.data != nullptr)
      for (index_t i = 0; i < M; ++i)
        for (index_t l = 0; l < L; ++l) grads->q_mu(i, l) = dmwV(i, l);
    if (grads->q_sqrt != nullptr) std::copy(p.dLw.v.begin(), p.dLw.v.end(), grads->q_sqrt);
  } else {
    // m_w = Lz^-1 m:  dm = Lz^-T dm_w,  dLz -= dm m_w^T
    linalg::solve_lower(LzV, dmwV, true);
    if (grads->q_mu.data != nullptr)
      for (index_t i = 0; i < M; ++i)
        for (index_t l = 0; l < L; ++l) grads->q_mu(i, l) = dmwV(i, l);
    blas::gemm(Trans::No, Trans::Yes, -1.0, dmwV, ConstMatrixView(sh.mw.data(), M, L), 1.0, dLzV);
    // L_w = Lz^-1 L:  W = Lz^-T tril(dL_w),  dL = tril(W),  dLz -= W L_w^T
    for (index_t l = 0; l < L; ++l) {
      const MatrixView W(p.dLw.v.data() + l * M * M, M, M);
      linalg::solve_lower(LzV, W, true);
      blas::gemm(Trans::No, Trans::Yes, -1.0, W, sh.Lw_of(l), 1.0, dLzV);
      if (grads->q_sqrt == nullptr) continue;
      double* out = grads->q_sqrt + l * M * M;
      for (index_t i = 0; i < M; ++i)
        for (index_t j = 0; j < M; ++j) out[i * M + j] = j <= i ? W(i, j) : 0.0;
    }
  }
  linalg::cholesky_reverse(LzV, dLzV);  // (reads the lower triangle) now d/dKzz
  linalg::add_relative_jitter_reverse(dLzV, jitter);

  std::fill(grads->kernel, grads->kernel + kernel.num_params(), 0.0);
  dZzz.assign(static_cast<std::size_t>(M * D), 0.0);
  MatrixView dZzzV(dZzz.data(), M, D);
  kernel.K_vjp(q.Z, q.Z, true, dLzV, ConstMatrixView(sh.Kzz.data(), M, M), grads->kernel, &dZzzV, &dZzzV);
  if (grads->likelihood_param != nullptr) *grads->likelihood_param = p.dlik;
  if (grads->mean != nullptr)
    for (index_t l = 0; l < L; ++l) grads->mean[l] = p.dmean.empty() ? 0.0 : p.dmean[l];
}

// Threads (threads.hpp). An evaluation below kSingleThreadWork flop-equivalents (~0.7 ms on
// one core) runs on one thread as one block: waking a second costs more than it saves, and on
// a shared machine every barrier waits for a thread the scheduler may have paused. Above it,
// the minibatch is cut into kBlocksPerEvaluation column blocks (of at least kMinBlockColumns)
// that the threads take dynamically in one parallel region, each with single-threaded BLAS,
// their partials summed in block order. For kOverlapM <= M < kThreadedM the region has three
// phases:
//   A. the O(M^3) work before the blocks (K(Z, Z), its Cholesky, the precomputed Sigma) on one
//      thread, beside it the kernel blocks K(Z, X_b) of the kept blocks (below) on the others;
//   B. the blocks' marginals, expectations and reverse passes;
//   C. the O(M^3) work after them (the KL, the precomputed path's reverse, the Cholesky's
//      reverse, K(Z, Z)'s vjp) on one thread, beside it the kept blocks' kernel vjps.
// At M = 256 that work took 1.4 ms on one core beside the blocks' 3.7 ms at B = 256, and had
// run on BLAS threads, whose wake-ups made it slower on two threads than on one (2.4 against
// 1.4 ms at B = 1). Below kOverlapM it is short against the two barriers the phases add (with
// another process on one core they cost more than they saved at M = 64), and from kThreadedM
// on its calls are long enough to use BLAS threads well: there it runs before and after the
// region (on one BLAS thread below kThreadedM). Blocks [0, kept) keep K(Z, X_b) and d/dK for
// the phases A and C (at most kKeptEntries entries each); the others evaluate their kernel and
// its vjp with the block. Blocks and `kept` depend on M and B alone, and every block's kernel
// gradients are summed in block order after the region, so the result does not depend on the
// thread count.
constexpr double kSingleThreadWork = 3e7;
constexpr index_t kMinBlockColumns = 64;
constexpr index_t kBlocksPerEvaluation = 8;
constexpr index_t kOverlapM = 128;
constexpr index_t kThreadedM = 512;
// Bounds a block's [M, columns] buffers (about (3 + 2 L) of them) at ~8 MB each.
constexpr index_t kMaxBlockEntries = index_t{1} << 20;
// Bounds the kept blocks' K and d/dK at 16 MB each.
constexpr index_t kKeptEntries = index_t{1} << 21;

// Runs body(t) on `threads` OpenMP threads (t = 0 .. threads - 1), or body(0) alone.
template <class Body>
void run_threads(int threads, const Body& body) {
  if (threads == 1) {
    body(0);
    return;
  }
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  {
    const SingleThreadScope block_scope(true);
    body(omp_get_thread_num());
  }
#endif
}

}  // namespace

Result elbo(const kernels::Kernel& kernel, const likelihoods::Likelihood& lik, const Variational& q,
            const Batch& batch, double jitter, Gradients* grads, Path path) {
  check_shapes(kernel, q, batch.X);
  require(batch.X.rows >= 1, "svgp: empty minibatch");
  require(std::isfinite(batch.scale) && batch.scale > 0, "svgp: scale (N/B) must be positive");
  require(jitter >= 0 && std::isfinite(jitter), "svgp: jitter must be >= 0");
  likelihoods::validate(lik);
  const index_t M = q.Z.rows, B = batch.X.rows, D = q.Z.cols, L = q.num_latent();
  require(likelihoods::latent_dim(lik) == L,
          "svgp: the likelihood needs ", likelihoods::latent_dim(lik), " latent functions but q_mu has ", L,
          " columns");
  if (path == Path::Auto) path = cheaper_path(M, B, L);
  const double work = path_cost(path, M, B, L) + 30.0 * M * B + 50.0 * B * L * lik.n_gh;
  const bool one_thread = work < kSingleThreadWork;
  // Column blocks, and the threads that take them (decided before the scope below, which makes
  // threads_for answer 1).
  const index_t nb_wanted =
      one_thread ? B : std::max(kMinBlockColumns, (B + kBlocksPerEvaluation - 1) / kBlocksPerEvaluation);
  const index_t nb = std::max<index_t>(1, std::min(nb_wanted, kMaxBlockEntries / std::max<index_t>(M * L, 1)));
  const index_t blocks = (B + nb - 1) / nb;
  const int threads = one_thread ? 1 : threads_for_blas_calls(blocks, 1);
  // The O(M^3) parts in the region for kOverlapM <= M < kThreadedM, else outside it (on one
  // BLAS thread below kThreadedM).
  const bool serial_inside = !one_thread && M >= kOverlapM && M < kThreadedM;
  const index_t kept = serial_inside ? std::min(blocks, kKeptEntries / (M * nb)) : 0;
  const SingleThreadScope serial_scope(one_thread || M < kThreadedM);

  Wants wants;
  wants.grads = grads != nullptr;
  // d/dL_w is needed for q_sqrt's gradient and, unwhitened, for Lz's (through L_w = Lz^-1 L).
  wants.dLw = wants.grads && (grads->q_sqrt != nullptr || !q.whiten);
  wants.dSw = wants.grads && grads->ell_q_cov != nullptr;

  Result res;
  Shared sh;
  sh.M = M;
  sh.L = L;
  Buffer mu(static_cast<std::size_t>(B * L)), var(static_cast<std::size_t>(B * L)), f(B),
      gmu(static_cast<std::size_t>(B * L)), gvar(static_cast<std::size_t>(B * L)), gpar(B);
  const BlockEvaluator evaluator(sh, kernel, lik, q, batch, wants, mu.data(), var.data(), f.data(), gmu.data(),
                                 gvar.data(), gpar.data());
  auto block_columns = [&](index_t b) { return std::min(nb, B - b * nb); };
  // The kept blocks' K(Z, X_b), diag K(X_b) and d/dK, and every block's kernel gradients
  // (parameters, then Z), summed in block order at the end.
  Scratch K_kept(kept * M * nb), dK_kept(wants.grads ? kept * M * nb : 0);
  Buffer kdiag_kept(static_cast<std::size_t>(kept * nb));
  const index_t P = kernel.num_params(), vjp_size = P + M * D;
  Buffer vjp(wants.grads ? static_cast<std::size_t>(blocks * vjp_size) : 0, 0.0);
  auto kept_K = [&](index_t b) { return MatrixView(K_kept.data() + b * M * nb, M, block_columns(b)); };
  auto kept_dK = [&](index_t b) { return MatrixView(dK_kept.data() + b * M * nb, M, block_columns(b)); };
  // Block b's kernel gradients into its slot.
  auto block_vjp = [&](index_t b, ConstMatrixView K, ConstMatrixView dK, BlockWork& work) {
    double* slot = vjp.data() + b * vjp_size;
    evaluator.vjp(b * nb, K, dK, work, slot, MatrixView(slot + P, M, D));
  };

  // The O(M^3) work before the blocks.
  auto before_blocks = [&] {
    res.jitter = inducing_cholesky(kernel, q.Z, jitter, sh.Lz, wants.grads ? &sh.Kzz : nullptr);
    whitened_parameters(q, sh.LzV(), sh.mw, sh.Lw);
    if (path == Path::Precomputed) sh.prepare_precomputed();
  };
  // After the blocks: the KL and the gradients through q and K(Z, Z); K(Z, Z)'s vjp goes to
  // grads->kernel (zeroed first) and dZzz, to which the blocks' vjps are added after the region.
  Partials p;
  Buffer dZzz;
  auto after_blocks = [&] {
    res.path = sh.precomputed && !p.any_solve ? Path::Precomputed : Path::Solve;
    res.expected_log_lik = batch.scale * fixed_order_sum(f.data(), B);
    res.kl = kl_divergence(sh);
    res.elbo = res.expected_log_lik - res.kl;
    if (wants.grads) gradients_through_q(kernel, q, sh, wants, jitter, p, grads, dZzz);
  };

  // Failures inside the region are rethrown after it (region_errors.hpp), ranked in the order
  // of the work on one thread: before the blocks, the kept blocks' kernels, the blocks, after
  // them, the kept blocks' vjps; a block's partials are added in block order under its rank.
  RegionErrors errors;
  const index_t rank_kernel = 1, rank_block = rank_kernel + kept, rank_after = rank_block + blocks,
                rank_vjp = rank_after + 1;

  if (!serial_inside) errors.run(0, before_blocks);
  std::vector<Partials> scratch(static_cast<std::size_t>(threads));
  std::atomic<index_t> next_kernel{0}, next_vjp{0};
  // The O(M^3) work of each phase goes to the first thread that reaches it: with another process
  // on one core, that is more often the thread on the free core.
  std::atomic<bool> before_taken{false}, after_taken{false};
  run_threads(threads, [&](int t) {
    BlockWork work;
    // A. Before the blocks, and the kept blocks' kernels.
    if (serial_inside && !before_taken.exchange(true)) errors.run(0, before_blocks);
    for (index_t b; (b = next_kernel.fetch_add(1)) < kept;)
      errors.run(rank_kernel + b,
                 [&] { evaluator.kernel(b * nb, block_columns(b), kept_K(b), kdiag_kept.data() + b * nb); });
    // (Only in the region: an orphaned barrier on one thread would bind to an enclosing team of
    // the caller's, if it called from one.)
    if (threads > 1) {
#ifdef _OPENMP
#pragma omp barrier
#endif
    }
    // B. The blocks, their partials summed in block order.
    auto block = [&](index_t b) {
      errors.run(rank_block + b, [&] {
        const index_t n0 = b * nb, cols = block_columns(b);
        scratch[t].reset();
        MatrixView K;
        const double* kdiag;
        if (b < kept) {
          K = kept_K(b);
          kdiag = kdiag_kept.data() + n0;
        } else {
          work.K.resize(M * cols);
          work.kdiag.resize(cols);
          K = MatrixView(work.K.data(), M, cols);
          kdiag = work.kdiag.data();
          evaluator.kernel(n0, cols, K, work.kdiag.data());
        }
        const MatrixView dK = evaluator.forward_reverse(n0, K, kdiag, work, scratch[t],
                                                        b < kept && wants.grads ? kept_dK(b).data : nullptr);
        if (wants.grads && b >= kept) block_vjp(b, K, dK, work);
      });
    };
    if (threads == 1) {
      for (index_t b = 0; b < blocks; ++b) {
        block(b);
        errors.run(rank_block + b, [&] { p.add(scratch[0]); });
      }
    } else {
#ifdef _OPENMP
#pragma omp for ordered schedule(dynamic, 1)
      for (index_t b = 0; b < blocks; ++b) {
        block(b);
#pragma omp ordered
        errors.run(rank_block + b, [&] { p.add(scratch[t]); });
      }
#endif
    }
    // C. After the blocks, and the kept blocks' kernel vjps.
    if (serial_inside && !after_taken.exchange(true)) errors.run(rank_after, after_blocks);
    if (wants.grads)
      for (index_t b; (b = next_vjp.fetch_add(1)) < kept;)
        errors.run(rank_vjp + b, [&] { block_vjp(b, kept_K(b), kept_dK(b), work); });
  });
  if (!serial_inside) errors.run(rank_after, after_blocks);
  errors.rethrow();
  if (!wants.grads) return res;

  // The blocks' kernel gradients, in block order.
  for (index_t b = 0; b < blocks; ++b) {
    const double* v = vjp.data() + b * vjp_size;
    for (index_t i = 0; i < P; ++i) grads->kernel[i] += v[i];
  }
  for (index_t i = 0; i < M; ++i)
    for (index_t d = 0; d < D; ++d) {
      double sum = 0.0;
      for (index_t b = 0; b < blocks; ++b) sum += vjp[b * vjp_size + P + i * D + d];
      grads->Z(i, d) = sum + dZzz[i * D + d];
    }
  return res;
}

double predict_f(const kernels::Kernel& kernel, const Variational& q, ConstMatrixView Xnew,
                 double jitter, MatrixView mean, MatrixView var) {
  check_shapes(kernel, q, Xnew);
  const index_t M = q.Z.rows, T = Xnew.rows, L = q.num_latent();
  require(mean.rows == T && mean.cols == L && var.rows == T && var.cols == L,
          "svgp: predict_f outputs must be [T, L]");
  Scratch Lz;
  const double extra = inducing_cholesky(kernel, q.Z, jitter, Lz);
  ConstMatrixView LzV(Lz.data(), M, M);
  Buffer mw;
  Scratch Lw;
  whitened_parameters(q, LzV, mw, Lw);
  // Chunks of test points bound the memory at 2 M x chunk doubles.
  const index_t chunk = std::max<index_t>(1, std::min<index_t>(T, (1 << 22) / std::max<index_t>(M, 1)));
  Buffer kdiag, a2, t2;
  for (index_t start = 0; start < T; start += chunk) {
    const index_t n = std::min(chunk, T - start);
    ConstMatrixView Xc(Xnew.row(start), n, Xnew.cols, Xnew.ld);
    Scratch A(M * n), Tm(M * n);
    kdiag.resize(n);
    a2.resize(n);
    t2.resize(n);
    MatrixView AV(A.data(), M, n), TV(Tm.data(), M, n);
    kernel.K(q.Z, Xc, false, AV);
    kernel.Kdiag(Xc, kdiag.data());
    linalg::solve_lower(LzV, AV, false);
    if (L == 1)
      blas::gemv(Trans::Yes, 1.0, AV, mw.data(), 0.0, mean.row(start));
    else
      blas::gemm(Trans::Yes, Trans::No, 1.0, AV, ConstMatrixView(mw.data(), M, L), 0.0,
                 MatrixView(mean.row(start), n, L, mean.ld));
    column_sums_of_squares(AV, a2.data());
    for (index_t l = 0; l < L; ++l) {
      std::copy(A.data(), A.data() + M * n, Tm.data());
      blas::trmm(Side::Left, Uplo::Lower, Trans::Yes, Diag::NonUnit, 1.0,
                 ConstMatrixView(Lw.data() + l * M * M, M, M), TV);
      column_sums_of_squares(TV, t2.data());
      for (index_t i = 0; i < n; ++i) var(start + i, l) = std::max(kdiag[i] - a2[i] + t2[i], 0.0);
    }
    if (q.mean != nullptr)
      for (index_t i = 0; i < n; ++i)
        for (index_t l = 0; l < L; ++l) mean(start + i, l) += q.mean[l];
  }
  return extra;
}

}  // namespace pygpfast::svgp
