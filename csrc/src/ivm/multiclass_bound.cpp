// From-scratch representation of the joint multi-class IVM (notes/ivm-math.md section 2.8),
// prediction (section 2.7) and the seed section-4 bound with its gradient (section 2.8).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/ivm/multiclass.hpp"
#include "pygpfast/linalg.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/workspace.hpp"
#include "small_dense.hpp"

namespace pygpfast::ivm {

namespace {

using blas::Diag;
using blas::Side;
using blas::Trans;
using blas::Uplo;

// (from the workspace's cache: the bound is evaluated many times with the same shapes, and its
// d x n arrays, fresh from the system each time, were faulted in and zeroed page by page)
using Vec = workspace::Buffer;

Vec zeros(index_t n) { return Vec(static_cast<std::size_t>(n), 0.0); }

// The d x n stages of the bound run as C x kColumnParts tasks (class, column range): with C = 5
// classes on two threads, whole classes left one thread idle a sixth of the time.
constexpr index_t kColumnParts = 2;

// n d^2 from which the bound's (class, column part) tasks run on the core's threads, each with
// the BLAS on one thread; below, they run in turn on one thread. Measured on 2 cores, C = 5, one
// evaluation with gradient: at n = 800, d = 150, 31 ms on the threads against 58 ms with the
// classes in turn on the BLAS's two threads (its calls there too short to pay for them); at
// n = 4000, d = 400, 0.50 s against 0.70 s (0.58 s before the column parts). (The BLAS's threads
// also wait at every call's barrier for a thread the scheduler paused on a loaded machine: at
// n = 800, d = 150 they took 7 times as long as one thread there.)
constexpr index_t kBoundTasksThreadedFrom = index_t{1} << 20;

// Threads for `count` of the bound's tasks at n points, d active (for_each_blas_task).
int task_threads(index_t count, index_t n, index_t d) {
  return n * d * d >= kBoundTasksThreadedFrom ? threads_for_blas_calls(count, 1) : 1;
}

void potrf_or_throw(MatrixView A, const char* what) {
  const int info = blas::potrf_lower(A);
  if (info != 0)
    throw LinAlgError("dpotrf", info,
                      std::string(what) + " is not positive definite; the active inputs' kernel matrix is too "
                                          "ill-conditioned: add a White kernel or raise the lengthscale's lower bound");
  for (index_t i = 0; i < A.rows; ++i)
    for (index_t j = i + 1; j < A.cols; ++j) A(i, j) = 0.0;
}

// The small representation for sites (pi, b) on the active inputs X_I (note 2.2, 2.8).
struct Representation {
  int C = 0;
  index_t d = 0;
  std::vector<Vec> KI;  // per class [d, d] (copies when shared)
  std::vector<Vec> L, W;
  Vec sD;               // [C, d] sqrt(pi) class-major
  Vec R;                // [d, d] lower, R R^T = Gamma = sum_c W^(c)
  std::vector<Vec> xi;  // per class [d]
  double logdet_B = 0.0, logdet_Gamma = 0.0, sum_log_alpha = 0.0;

  ConstMatrixView mat(const Vec& v) const { return ConstMatrixView(v.data(), d, d); }
};

void check_sites(int C, index_t d, const double* pi, const double* b) {
  for (index_t k = 0; k < d * C; ++k) {
    require(pi[k] > 0.0 && std::isfinite(pi[k]), "pi must be positive and finite, got pi[", k / C, ", ", k % C,
            "] = ", pi[k]);
    require(std::isfinite(b[k]), "b must be finite");
  }
}

// r2I: null, or the squared distances of X_I and itself, for kernels of one class each: K_I from
// them off the diagonal and diag K on it (the White kernel's variance there), where each class
// kernel scaled X_I and ran its own d x d x D product.
Representation build_representation(const ClassKernels& kernels, int C, ConstMatrixView XI, const double* pi,
                                    const double* b, const kernels::SquaredDistances* r2I = nullptr) {
  Representation rep;
  rep.C = C;
  const index_t d = XI.rows;
  rep.d = d;
  const std::size_t nk = kernels.size();
  rep.KI.assign(C, zeros(d * d));
  rep.sD = zeros(C * d);
  rep.L.assign(C, zeros(d * d));
  rep.W.assign(C, zeros(d * d));
  rep.R = zeros(d * d);
  if (nk == 1) kernels[0]->K(XI, XI, true, MatrixView(rep.KI[0].data(), d, d));
  Vec logdet_B = zeros(C);
  for_each_blas_task(C, task_threads(C, d, d), [&](index_t c) {
    if (nk > 1 && r2I != nullptr) {
      const MatrixView KI(rep.KI[c].data(), d, d);
      kernels[c]->K(XI, XI, false, KI, r2I);
      Vec diag = zeros(d);
      kernels[c]->Kdiag(XI, diag.data());
      for (index_t k = 0; k < d; ++k) KI(k, k) = diag[k];
    } else if (nk > 1) {
      kernels[c]->K(XI, XI, true, MatrixView(rep.KI[c].data(), d, d));
    } else if (c > 0) {
      rep.KI[c] = rep.KI[0];
    }
    double* sD = rep.sD.data() + c * d;
    for (index_t k = 0; k < d; ++k) sD[k] = std::sqrt(pi[k * C + c]);
    Vec& Lc = rep.L[c];
    for (index_t i = 0; i < d; ++i)
      for (index_t j = 0; j < d; ++j) Lc[i * d + j] = (i == j ? 1.0 : 0.0) + sD[i] * rep.KI[c][i * d + j] * sD[j];
    potrf_or_throw(MatrixView(Lc.data(), d, d), "B = I + D^1/2 K_I D^1/2");
    logdet_B[c] = linalg::logdet_from_cholesky(rep.mat(Lc));
    Vec X = zeros(d * d);
    for (index_t k = 0; k < d; ++k) X[k * d + k] = sD[k];
    linalg::solve_lower(rep.mat(Lc), MatrixView(X.data(), d, d), false);
    blas::gemm(Trans::Yes, Trans::No, 1.0, ConstMatrixView(X.data(), d, d), ConstMatrixView(X.data(), d, d), 0.0,
               MatrixView(rep.W[c].data(), d, d));
  });
  for (int c = 0; c < C; ++c) {
    rep.logdet_B += logdet_B[c];
    for (index_t k = 0; k < d * d; ++k) rep.R[k] += rep.W[c][k];
  }
  potrf_or_throw(MatrixView(rep.R.data(), d, d), "Gamma = sum_c W^(c)");
  rep.logdet_Gamma = linalg::logdet_from_cholesky(rep.mat(rep.R));
  for (index_t k = 0; k < d; ++k) {
    double alpha = 0.0;
    for (int c = 0; c < C; ++c) alpha += pi[k * C + c];
    rep.sum_log_alpha += std::log(alpha);
  }
  // xi = (I + Pi_I K_I)^{-1} b_I: z = K b, t = W z, w = Gamma^{-1} sum t, xi = b - t + W w.
  std::vector<Vec> t(C, zeros(d));
  Vec z = zeros(d), w = zeros(d), bc = zeros(d);
  for (int c = 0; c < C; ++c) {
    for (index_t k = 0; k < d; ++k) bc[k] = b[k * C + c];
    blas::gemv(Trans::No, 1.0, rep.mat(rep.KI[c]), bc.data(), 0.0, z.data());
    blas::gemv(Trans::No, 1.0, rep.mat(rep.W[c]), z.data(), 0.0, t[c].data());
    for (index_t k = 0; k < d; ++k) w[k] += t[c][k];
  }
  blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, rep.mat(rep.R), w.data());
  blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, rep.mat(rep.R), w.data());
  rep.xi.assign(C, zeros(d));
  for (int c = 0; c < C; ++c) {
    for (index_t k = 0; k < d; ++k) rep.xi[c][k] = b[k * C + c] - t[c][k];
    blas::gemv(Trans::No, 1.0, rep.mat(rep.W[c]), w.data(), 1.0, rep.xi[c].data());
  }
  return rep;
}

void check_kernels(const ClassKernels& kernels, int C, index_t D) {
  require(C >= 2, "num_classes must be >= 2, got ", C);
  require(kernels.size() == 1 || kernels.size() == static_cast<std::size_t>(C),
          "give one kernel shared by all classes or one per class (", C, "), got ", kernels.size());
  for (const auto* k : kernels) {
    require(k != nullptr, "null kernel");
    require(k->input_dim() == D, "the kernel expects ", k->input_dim(), " input columns, the inputs have ", D);
  }
}

}  // namespace

void multiclass_predict(const ClassKernels& kernels, int C, ConstMatrixView XI, const double* pi, const double* b,
                        const double* beta, ConstMatrixView Xnew, CubatureRule rule, double* mean, double* cov,
                        double* prob) {
  check_kernels(kernels, C, XI.cols);
  require(Xnew.cols == XI.cols, "Xnew has ", Xnew.cols, " columns, X_active has ", XI.cols);
  require(XI.rows >= 1, "the active set is empty");
  for (int c = 0; c < C; ++c) require(std::isfinite(beta[c]), "beta must be finite");
  const index_t d = XI.rows, T = Xnew.rows;
  check_sites(C, d, pi, b);
  const OneBlasThreadScope blas_on_one_thread;  // (as in multiclass_select: why there)
  const Representation rep = build_representation(kernels, C, XI, pi, b);
  // q2: where q has negative weights, the product rule for a point whose probabilities by q leave (0, 1).
  Cubature q, q2;
  if (prob != nullptr) q = make_cubature(rule, C);
  const bool with_fallback = prob != nullptr && q.has_negative_weights && C <= kMaxGaussHermite3Dim;
  if (with_fallback) q2 = make_cubature(CubatureRule::GaussHermite3, C);
  const std::size_t nk = kernels.size();
  const index_t CC = static_cast<index_t>(C) * C;
  constexpr index_t kBlock = 256;
  Vec Kc = zeros(d * kBlock), Qall = zeros(C * d * kBlock), var = zeros(C * kBlock), kss = zeros(kBlock), mtmp = zeros(kBlock);
  for (index_t t0 = 0; t0 < T; t0 += kBlock) {
    const index_t tb = std::min(kBlock, T - t0);
    const ConstMatrixView Xb(Xnew.row(t0), tb, Xnew.cols, Xnew.ld);
    const kernels::SquaredDistances r2(XI, Xb);  // (shared by the class kernels)
    for (int c = 0; c < C; ++c) {
      const kernels::Kernel& kern = *kernels[nk == 1 ? 0 : c];
      MatrixView Kv(Kc.data(), d, tb);
      kern.K(XI, Xb, false, Kv, nk > 1 ? &r2 : nullptr);
      kern.Kdiag(Xb, kss.data());
      blas::gemv(Trans::Yes, 1.0, Kv, rep.xi[c].data(), 0.0, mtmp.data());
      for (index_t t = 0; t < tb; ++t) mean[(t0 + t) * C + c] = mtmp[t];
      // V = L^-1 D^1/2 K;  var = k** - |V|^2;  Q = R^-1 D^1/2 L^-T V.
      MatrixView V(Qall.data() + c * d * tb, d, tb);
      const double* sD = rep.sD.data() + c * d;
      for (index_t k = 0; k < d; ++k)
        for (index_t t = 0; t < tb; ++t) V(k, t) = sD[k] * Kv(k, t);
      linalg::solve_lower(rep.mat(rep.L[c]), V, false);
      for (index_t t = 0; t < tb; ++t) var[c * tb + t] = kss[t];
      for (index_t k = 0; k < d; ++k)
        for (index_t t = 0; t < tb; ++t) var[c * tb + t] -= V(k, t) * V(k, t);
      linalg::solve_lower(rep.mat(rep.L[c]), V, true);
      for (index_t k = 0; k < d; ++k)
        for (index_t t = 0; t < tb; ++t) V(k, t) *= sD[k];
      linalg::solve_lower(rep.mat(rep.R), V, false);
    }
    parallel_for(tb, 16, [&](index_t t) {
      std::vector<double> At(static_cast<std::size_t>(CC)), Lt(static_cast<std::size_t>(CC));
      for (int c = 0; c < C; ++c)
        for (int e = 0; e <= c; ++e) {
          double s = c == e ? var[c * tb + t] : 0.0;
          const double* qc = Qall.data() + c * d * tb + t;
          const double* qe = Qall.data() + e * d * tb + t;
          for (index_t k = 0; k < d; ++k) s += qc[k * tb] * qe[k * tb];
          At[c * C + e] = At[e * C + c] = s;
        }
      if (cov != nullptr) std::copy(At.begin(), At.end(), cov + (t0 + t) * CC);
      if (prob != nullptr) {
        if (!small::cholesky(C, At.data(), Lt.data()))
          throw LinAlgError("ivm.multiclass_predict", 1, "the predictive covariance at Xnew row " +
                                                             std::to_string(t0 + t) + " is not positive definite");
        std::vector<double> work(static_cast<std::size_t>(
            std::max(cubature_work_size(q), with_fallback ? cubature_work_size(q2) : index_t{0})));
        double* pt = prob + (t0 + t) * C;
        softmax_expected_probabilities(q, mean + (t0 + t) * C, Lt.data(), beta, pt, work.data());
        if (with_fallback && !std::all_of(pt, pt + C, [](double v) { return v > 0.0 && v < 1.0; }))
          softmax_expected_probabilities(q2, mean + (t0 + t) * C, Lt.data(), beta, pt, work.data());
      }
    });
  }
}

MulticlassBoundResult multiclass_bound(const ClassKernels& kernels, int C, ConstMatrixView X, const double* y,
                             const index_t* active, index_t d, const double* pi, const double* b, const double* beta,
                             CubatureRule rule, const std::vector<double*>* d_kernel, double* d_beta,
                             const double* distances, double distances_max_norm) {
  check_kernels(kernels, C, X.cols);
  const index_t n = X.rows;
  require(d >= 1 && d <= n, "the active set must hold 1..n points, got ", d);
  for (index_t j = 0; j < n; ++j) {
    require(y[j] >= 0.0 && y[j] < C && y[j] == std::floor(y[j]), "y must hold class labels 0..", C - 1, ", got y[", j,
            "] = ", y[j]);
    const double* row = X.row(j);
    bool finite = true;
    for (index_t k = 0; k < X.cols; ++k) finite &= std::isfinite(row[k]);
    if (!finite)
      for (index_t k = 0; k < X.cols; ++k) require(std::isfinite(row[k]), "X has a non-finite entry at (", j, ", ", k, ")");
  }
  {
    std::vector<char> seen(static_cast<std::size_t>(n), 0);
    for (index_t k = 0; k < d; ++k) {
      require(active[k] >= 0 && active[k] < n, "active[", k, "] = ", active[k], " is not a row of X");
      require(!seen[active[k]], "active holds row ", active[k], " twice");
      seen[active[k]] = 1;
    }
  }
  for (int c = 0; c < C; ++c) require(std::isfinite(beta[c]), "beta must be finite");
  check_sites(C, d, pi, b);
  const std::size_t nk = kernels.size();
  if (d_kernel != nullptr) {
    require(d_kernel->size() == nk, "d_kernel must hold one pointer per kernel");
    for (std::size_t k = 0; k < nk; ++k) std::fill((*d_kernel)[k], (*d_kernel)[k] + kernels[k]->num_params(), 0.0);
  }
  const Cubature q = make_cubature(rule, C);
  const index_t D = X.cols, CC = static_cast<index_t>(C) * C;
  Vec XIv = zeros(d * D);
  for (index_t k = 0; k < d; ++k) std::copy(X.row(active[k]), X.row(active[k]) + D, XIv.data() + k * D);
  const ConstMatrixView XI(XIv.data(), d, D);
  std::vector<Vec> kdiag(nk, zeros(n));
  for (std::size_t k = 0; k < nk; ++k) kernels[k]->Kdiag(X, kdiag[k].data());
  // The squared distances of X_I and X, read by every class kernel with one lengthscale and by
  // their vjps: one d x n x D GEMM where each kernel call ran its own (2 C of them with the
  // gradient), or none when the caller gives them. Class 0's kernel (or the shared one) is
  // evaluated first, on the BLAS's threads (one GEMM, long enough to pay for them at every
  // size), which computes them when a leaf reads them.
  const kernels::SquaredDistances r2(XI, X, distances, distances_max_norm);
  // K_{I,.} of kernel k into out, with entries (k, I_k) = diag K (a White kernel's variance)
  auto kernel_columns = [&](std::size_t k, double* out) {
    kernels[k]->K(XI, X, false, MatrixView(out, d, n), &r2);
    for (index_t i = 0; i < d; ++i) out[i * n + active[i]] = kdiag[k][active[i]];
  };
  Vec K0 = zeros(d * n);
  kernel_columns(0, K0.data());

  // The rest with the BLAS on one thread, the (class, column part) tasks on the core's threads
  // (task_threads): the largest products are d x n x d GEMMs and triangular solves, ~4 per
  // class.
  const OneBlasThreadScope blas_on_one_thread;
  const kernels::SquaredDistances r2I(XI, XI);
  const Representation rep = build_representation(kernels, C, XI, pi, b, &r2I);
  auto dd = [&](const Vec& v) { return rep.mat(v); };

  // Stubs from scratch, per class: M = L^-1 D^1/2 K_{I,.}, a0 = diag K - |M|^2, Y = D^1/2 L^-T M,
  // Q = R^-1 Y, h = K_{.,I} xi. The other class kernels' K_{I,.} into their Y first (a task per
  // class), then (class, column part) tasks.
  std::vector<Vec> Y(C, zeros(d * n)), Q(C, zeros(d * n));
  Vec a0 = zeros(C * n), h = zeros(C * n);
  if (nk > 1) for_each_blas_task(C - 1, task_threads(C - 1, n, d), [&](index_t t) { kernel_columns(t + 1, Y[t + 1].data()); });
  // Columns [j0, j1) of part p of kColumnParts.
  auto part_columns = [&](index_t p) { return std::pair<index_t, index_t>{p * n / kColumnParts, (p + 1) * n / kColumnParts}; };
  auto columns = [&](Vec& v, index_t j0, index_t j1) { return MatrixView(v.data() + j0, d, j1 - j0, n); };
  for_each_blas_task(C * kColumnParts, task_threads(C * kColumnParts, n, d), [&](index_t task) {
    const int c = static_cast<int>(task / kColumnParts);
    const auto [j0, j1] = part_columns(task % kColumnParts);
    const std::size_t kc = nk == 1 ? 0 : c;
    const MatrixView Yc = columns(Y[c], j0, j1), Qc = columns(Q[c], j0, j1);
    const double* sD = rep.sD.data() + c * d;
    if (kc == 0)
      for (index_t k = 0; k < d; ++k) std::copy(K0.data() + k * n + j0, K0.data() + k * n + j1, Yc.row(k));
    blas::gemv(Trans::Yes, 1.0, Yc, rep.xi[c].data(), 0.0, h.data() + c * n + j0);
    for (index_t k = 0; k < d; ++k)
      for (index_t j = 0; j < Yc.cols; ++j) Yc(k, j) *= sD[k];
    linalg::solve_lower(dd(rep.L[c]), Yc, false);
    double* a = a0.data() + c * n;
    for (index_t j = j0; j < j1; ++j) a[j] = kdiag[kc][j];
    for (index_t k = 0; k < d; ++k)
      for (index_t j = 0; j < Yc.cols; ++j) a[j0 + j] -= Yc(k, j) * Yc(k, j);
    linalg::solve_lower(dd(rep.L[c]), Yc, true);
    for (index_t k = 0; k < d; ++k)
      for (index_t j = 0; j < Yc.cols; ++j) Qc(k, j) = Yc(k, j) *= sD[k];
    linalg::solve_lower(dd(rep.R), Qc, false);
  });
  K0 = Vec();

  // Data term per point, with g_h [n, C] and G_A [n, C, C].
  // The marginal covariances A_j = diag a0_j + sum_k q_kj q_kj^T of a block of kPointBlock points
  // at a time, the sums over k along Q's rows (contiguous in j; per point they were d cache
  // lines apart), each pair (c, e <= c) from a0 (c = e) or 0 in k order.
  constexpr index_t kPointBlock = 64;
  const index_t pairs = static_cast<index_t>(C) * (C + 1) / 2;
  Vec val = zeros(n), gh = zeros(n * C), GA = zeros(n * CC);
  parallel_for((n + kPointBlock - 1) / kPointBlock, 1, [&](index_t block) {
    const index_t j0 = block * kPointBlock, nb = std::min(kPointBlock, n - j0);
    std::vector<double> G(static_cast<std::size_t>(pairs * kPointBlock)), hj(C), Aj(CC), Lj(CC),
        work(static_cast<std::size_t>(cubature_work_size(q)));
    for (int c = 0, p = 0; c < C; ++c)
      for (int e = 0; e <= c; ++e, ++p)
        for (index_t t = 0; t < nb; ++t) G[p * kPointBlock + t] = c == e ? a0[c * n + j0 + t] : 0.0;
    for (index_t k = 0; k < d; ++k)
      for (int c = 0, p = 0; c < C; ++c) {
        const double* qc = Q[c].data() + k * n + j0;
        for (int e = 0; e <= c; ++e, ++p) {
          const double* qe = Q[e].data() + k * n + j0;
          double* g = G.data() + p * kPointBlock;
#pragma omp simd
          for (index_t t = 0; t < nb; ++t) g[t] += qc[t] * qe[t];
        }
      }
    for (index_t t = 0; t < nb; ++t) {
      const index_t j = j0 + t;
      for (int c = 0, p = 0; c < C; ++c) {
        hj[c] = h[c * n + j];
        for (int e = 0; e <= c; ++e, ++p) Aj[c * C + e] = Aj[e * C + c] = G[p * kPointBlock + t];
      }
      if (!small::cholesky(C, Aj.data(), Lj.data()))
        throw LinAlgError("ivm.multiclass_bound", 1,
                          "the marginal covariance of point " + std::to_string(j) + " is not positive definite");
      softmax_expected_nll(q, static_cast<int>(y[j]), hj.data(), Lj.data(), beta, &val[j], gh.data() + j * C,
                           GA.data() + j * CC, work.data());
    }
  });
  MulticlassBoundResult res;
  res.expected_nll = linalg::fixed_order_sum(val.data(), n);
  // KL = [sum_c (xi^T K xi - tr(W^(c,c) K)) + log|I + K Pi|] / 2, tr(W^(c,c) K) = tr(W K) - tr(Gamma^-1 W K W).
  Vec Ginv = rep.R;
  {
    const int info = blas::potri_lower(MatrixView(Ginv.data(), d, d));
    if (info != 0) throw LinAlgError("dpotri", info, "Gamma could not be inverted");
    linalg::mirror_lower(MatrixView(Ginv.data(), d, d));
  }
  std::vector<Vec> P(C, zeros(d * d)), WK(C, zeros(d * d));
  Vec kl_class = zeros(C);
  for_each_blas_task(C, task_threads(C, n, d), [&](index_t c) {
    blas::gemm(Trans::No, Trans::No, 1.0, dd(rep.W[c]), dd(rep.KI[c]), 0.0, MatrixView(WK[c].data(), d, d));
    blas::gemm(Trans::No, Trans::No, 1.0, dd(WK[c]), dd(rep.W[c]), 0.0, MatrixView(P[c].data(), d, d));
    Vec Kxi = zeros(d);
    blas::gemv(Trans::No, 1.0, dd(rep.KI[c]), rep.xi[c].data(), 0.0, Kxi.data());
    double trWK = 0.0, trGP = 0.0, xKx = 0.0;
    for (index_t k = 0; k < d; ++k) {
      trWK += WK[c][k * d + k];
      xKx += rep.xi[c][k] * Kxi[k];
      for (index_t l = 0; l < d; ++l) trGP += Ginv[k * d + l] * P[c][l * d + k];
    }
    kl_class[c] = xKx - (trWK - trGP);
  });
  double kl2 = rep.logdet_B + rep.logdet_Gamma - rep.sum_log_alpha;
  for (int c = 0; c < C; ++c) kl2 += kl_class[c];
  res.kl = 0.5 * kl2;
  res.value = res.expected_nll + res.kl;

  if (d_beta != nullptr)
    for (int c = 0; c < C; ++c) {
      double s = 0.0;
      for (index_t j = 0; j < n; ++j) s += gh[j * C + c];
      d_beta[c] = s;
    }
  if (d_kernel == nullptr) return res;

  // ---- Gradient (note 2.8). ----
  // Per (class, column part): U^(c) = sum_e Q^(e) diag(G_A[c, e]), the part's share of
  // YU^(c) = Y^(c) U^(c)T and of Q^(c) g_h^(c) (the parts' shares summed in part order); then
  // rg = R^-T sum_c Q^(c) g_h^(c) and S_Q = R^-1 sum_c YU^(c) (Q^(c) = R^-1 Y^(c): C products of
  // d x n x d, each used twice, where S_Q from Q took C more). And GW^(c) = R^-1 W^(c).
  // U row by row, every class's from each row of every Q^(e) while it is in cache (G_A's (c, e)
  // entries first gathered into rows of n).
  std::vector<Vec> U(C, zeros(d * n)), YU_part(C * kColumnParts, zeros(d * d)), Qg_part(C * kColumnParts, zeros(d)),
      GW(C);
  {
    Vec G_rows = zeros(CC * n);
    for (index_t j = 0; j < n; ++j)
      for (index_t ce = 0; ce < CC; ++ce) G_rows[ce * n + j] = GA[j * CC + ce];
    parallel_for(d, 8, [&](index_t k) {
      for (int c = 0; c < C; ++c) {
        double* u = U[c].data() + k * n;
        for (int e = 0; e < C; ++e) {
          const double* qe = Q[e].data() + k * n;
          const double* g = G_rows.data() + (c * C + e) * n;
#pragma omp simd
          for (index_t j = 0; j < n; ++j) u[j] += qe[j] * g[j];
        }
      }
    });
  }
  for_each_blas_task(C * kColumnParts, task_threads(C * kColumnParts, n, d), [&](index_t task) {
    const int c = static_cast<int>(task / kColumnParts);
    const auto [j0, j1] = part_columns(task % kColumnParts);
    const index_t w = j1 - j0;
    blas::gemm(Trans::No, Trans::Yes, 1.0, columns(Y[c], j0, j1), columns(U[c], j0, j1), 0.0,
               MatrixView(YU_part[task].data(), d, d));
    Vec g = zeros(w);
    for (index_t j = 0; j < w; ++j) g[j] = gh[(j0 + j) * C + c];
    blas::gemv(Trans::No, 1.0, columns(Q[c], j0, j1), g.data(), 0.0, Qg_part[task].data());
    if (task % kColumnParts == 0) {
      GW[c] = rep.W[c];  // (W symmetric: W R^-T = GW^T)
      linalg::solve_lower(dd(rep.R), MatrixView(GW[c].data(), d, d), false);
    }
  });
  std::vector<Vec> YU(C, zeros(d * d));
  Vec rg = zeros(d), S = zeros(d * d);
  for (int c = 0; c < C; ++c)
    for (index_t p = 0; p < kColumnParts; ++p) {
      const Vec &yu = YU_part[c * kColumnParts + p], &qg = Qg_part[c * kColumnParts + p];
      for (index_t k = 0; k < d * d; ++k) YU[c][k] += yu[k];
      for (index_t k = 0; k < d; ++k) rg[k] += qg[k];
    }
  for (int c = 0; c < C; ++c)
    for (index_t k = 0; k < d * d; ++k) S[k] += YU[c][k];
  blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, dd(rep.R), rg.data());
  linalg::solve_lower(dd(rep.R), MatrixView(S.data(), d, d), false);
  // sum_e P^(e) and zeta's coupling term w = Gamma^-1 sum_e W^(e) K^(e) xi^(e).
  Vec sumP = zeros(d * d), wz = zeros(d);
  for (int e = 0; e < C; ++e) {
    for (index_t k = 0; k < d * d; ++k) sumP[k] += P[e][k];
    blas::gemv(Trans::No, 1.0, dd(WK[e]), rep.xi[e].data(), 1.0, wz.data());
  }
  // E's two sandwiches in one: W R^-T S_Q R^-1 W + (G^-1 W)^T sumP G^-1 W / 2 = GW^T S GW with
  // S = S_Q + R^-1 sumP R^-T / 2 (G^-1 W = R^-T GW; sumP symmetric: R^-1 sumP R^-T =
  // R^-1 (R^-1 sumP)^T).
  {
    Vec T1 = sumP, T2 = zeros(d * d);
    linalg::solve_lower(dd(rep.R), MatrixView(T1.data(), d, d), false);
    for (index_t k = 0; k < d; ++k)
      for (index_t l = 0; l < d; ++l) T2[k * d + l] = T1[l * d + k];
    linalg::solve_lower(dd(rep.R), MatrixView(T2.data(), d, d), false);
    for (index_t k = 0; k < d * d; ++k) S[k] += 0.5 * T2[k];
  }
  {
    Vec t2 = wz;
    blas::gemv(Trans::No, 1.0, dd(Ginv), t2.data(), 0.0, wz.data());
  }
  // Per class, two tasks: d/dK_{I,.} (Z) and d/dK_I (E). With a kernel per class their vjps run
  // in the tasks, each into its own slot (summed into the class's kernel in task order); with one
  // shared kernel, Z and E are summed over the classes in class order and taken once (the vjp is
  // linear in them).
  const bool shared = nk == 1;
  std::vector<Vec> Zs(shared ? C : 0), Es(shared ? C : 0), gccs(shared ? C : 0), slots(shared ? 0 : 2 * C);
  // d/dtheta <Z, K_{I,.}> into dpar (Z's entries (k, I_k) taken out, through Kdiag)
  auto vjp_columns = [&](const kernels::Kernel& kernel, Vec& Z, double* dpar) {
    Vec zdiag = zeros(d);
    for (index_t k = 0; k < d; ++k) {
      zdiag[k] = Z[k * n + active[k]];
      Z[k * n + active[k]] = 0.0;
    }
    kernel.K_vjp(XI, X, false, ConstMatrixView(Z.data(), d, n), dpar, nullptr, nullptr, &r2);
    kernel.Kdiag_vjp(XI, zdiag.data(), dpar);
  };
  // d/dtheta (<E, K_I> + <g, diag K>) into dpar (E's diagonal through Kdiag)
  auto vjp_active = [&](const kernels::Kernel& kernel, Vec& E, const Vec& g, double* dpar) {
    Vec ediag = zeros(d);
    for (index_t k = 0; k < d; ++k) {
      ediag[k] = E[k * d + k];
      E[k * d + k] = 0.0;
    }
    kernel.K_vjp(XI, XI, false, dd(E), dpar, nullptr, nullptr, &r2I);
    kernel.Kdiag_vjp(XI, ediag.data(), dpar);
    kernel.Kdiag_vjp(X, g.data(), dpar);
  };
  for_each_blas_task(2 * C, task_threads(2 * C, n, d), [&](index_t task) {
    const int c = static_cast<int>(task / 2);
    const Vec& xi = rep.xi[c];
    const Vec& Yc = Y[c];
    const Vec& GWc = GW[c];
    if (!shared) slots[task] = zeros(kernels[c]->num_params());
    Vec ghc = zeros(n), gcc = zeros(n);
    for (index_t j = 0; j < n; ++j) {
      ghc[j] = gh[j * C + c];
      gcc[j] = GA[j * CC + c * C + c];
    }
    if (task % 2 == 0) {  // Z = xi g_h^T - 2 [Y diag(G_cc) - W R^-T U] (W R^-T U = GW^T U: no d x n solve)
      Vec Z = zeros(d * n);
      for (index_t k = 0; k < d; ++k)
        for (index_t j = 0; j < n; ++j) Z[k * n + j] = xi[k] * ghc[j] - 2.0 * (Yc[k * n + j] * gcc[j]);
      blas::gemm(Trans::Yes, Trans::No, 2.0, dd(GWc), ConstMatrixView(U[c].data(), d, n), 1.0,
                 MatrixView(Z.data(), d, n));
      if (shared) Zs[c] = std::move(Z);
      else vjp_columns(*kernels[c], Z, slots[task].data());
      return;
    }
    const Vec& Wc = rep.W[c];
    Vec E = zeros(d * d), A1 = zeros(d * d), A2 = zeros(d * d), zeta = zeros(d), cvec = zeros(d),
        scratch = zeros(d * n);
    // c-vector = Y g_h^(c) - W rg
    blas::gemv(Trans::No, 1.0, ConstMatrixView(Yc.data(), d, n), ghc.data(), 0.0, cvec.data());
    blas::gemv(Trans::No, -1.0, dd(Wc), rg.data(), 1.0, cvec.data());
    // E = -c xi^T + Y diag(G_cc) Y^T - T - T^T + W R^-T S_Q R^-1 W + KL part, T = Y U^T R^-1 W.
    // Y diag(G_cc) Y^T by SYRKs (half a GEMM's flops; G_cc >= 0 at most points, the expected
    // Hessian of a convex loss).
    linalg::weighted_gram(ConstMatrixView(Yc.data(), d, n), gcc.data(), scratch.data(), MatrixView(E.data(), d, d));
    linalg::mirror_lower(MatrixView(E.data(), d, d));
    for (index_t k = 0; k < d; ++k)
      for (index_t l = 0; l < d; ++l) E[k * d + l] -= cvec[k] * xi[l];
    // T = (Y U^T) R^-1 W = YU GW
    blas::gemm(Trans::No, Trans::No, 1.0, dd(YU[c]), dd(GWc), 0.0, MatrixView(A2.data(), d, d));  // T
    for (index_t k = 0; k < d; ++k)
      for (index_t l = 0; l < d; ++l) E[k * d + l] -= A2[k * d + l] + A2[l * d + k];
    // + GW^T S GW: the S_Q term and the KL part's W G^-1 sumP G^-1 W / 2 (S above)
    blas::gemm(Trans::No, Trans::No, 1.0, dd(S), dd(GWc), 0.0, MatrixView(A1.data(), d, d));
    blas::gemm(Trans::Yes, Trans::No, 1.0, dd(GWc), dd(A1), 1.0, MatrixView(E.data(), d, d));
    // The rest of the KL part: (WKW)^(c,c) = P - P G^-1 W - W G^-1 P + W G^-1 sumP G^-1 W;
    // zeta = W K xi - W wz.
    const Vec& Pc = P[c];
    A1 = GWc;
    linalg::solve_lower(dd(rep.R), MatrixView(A1.data(), d, d), true);                        // G^-1 W = R^-T GW
    blas::gemm(Trans::No, Trans::No, 1.0, dd(Pc), dd(A1), 0.0, MatrixView(A2.data(), d, d));  // P G^-1 W
    for (index_t k = 0; k < d; ++k)
      for (index_t l = 0; l < d; ++l) E[k * d + l] += 0.5 * (Pc[k * d + l] - A2[k * d + l] - A2[l * d + k]);
    blas::gemv(Trans::No, 1.0, dd(WK[c]), xi.data(), 0.0, zeta.data());
    blas::gemv(Trans::No, -1.0, dd(Wc), wz.data(), 1.0, zeta.data());
    for (index_t k = 0; k < d; ++k)
      for (index_t l = 0; l < d; ++l)
        E[k * d + l] += 0.5 * (xi[k] * xi[l] - zeta[k] * xi[l] - xi[k] * zeta[l]);
    if (shared) {
      Es[c] = std::move(E);
      gccs[c] = std::move(gcc);
    } else {
      vjp_active(*kernels[c], E, gcc, slots[task].data());
    }
  });
  if (shared) {
    Vec& Z = Zs[0];
    Vec& E = Es[0];
    for (int c = 1; c < C; ++c) {
      parallel_for(d, 8, [&](index_t k) {
        for (index_t j = 0; j < n; ++j) Z[k * n + j] += Zs[c][k * n + j];
      });
      for (index_t k = 0; k < d * d; ++k) E[k] += Es[c][k];
      for (index_t j = 0; j < n; ++j) gccs[0][j] += gccs[c][j];
    }
    vjp_columns(*kernels[0], Z, (*d_kernel)[0]);
    vjp_active(*kernels[0], E, gccs[0], (*d_kernel)[0]);
  } else {
    for (int c = 0; c < C; ++c)
      for (index_t t = 2 * c; t < 2 * c + 2; ++t)
        for (std::size_t p = 0; p < slots[t].size(); ++p) (*d_kernel)[c][p] += slots[t][p];
  }
  return res;
}

}  // namespace pygpfast::ivm
