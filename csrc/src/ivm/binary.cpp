// Binary IVM (see ivm/binary.hpp and shared/notes/ivm-math.md, section 1).
#include "pygpfast/ivm/binary.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/likelihoods.hpp"
#include "pygpfast/linalg.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/vmath.hpp"

namespace pygpfast::ivm {
namespace {

using blas::Diag;
using blas::Side;
using blas::Trans;
using blas::Uplo;
using linalg::fixed_order_sum;
using workspace::Buffer;
using Clock = std::chrono::steady_clock;

constexpr double kLog2Pi = 1.83787706640934548356;  // log(2 pi)

// Per-point loops of O(1) work (the updates of h, a and the new stub row) go to several threads
// only from this many points per thread; the ADF scores (a log Phi each) from fewer. Each
// inclusion runs these loops once, so a region lasts well under a millisecond: on a shared
// 2-core machine (load 6, bench_ivm) splitting 8000 points over two threads made an inclusion
// 20x slower (15 ms against 0.7 ms on one thread) as the second thread waited to be scheduled.
constexpr index_t kMinUpdatesPerThread = 65536;
constexpr index_t kMinScoresPerThread = 16384;
// Loops over an [d, n] block (rows of M, the bound's adjoints): columns per task, and tasks of
// at least this many entries per thread.
constexpr index_t kColumnBlock = 512;
constexpr index_t kMinEntriesPerThread = 65536;
// Selections whose stub matrix has fewer entries (d x n, 2^20: n = 8000 at d = 131) run on one
// thread, BLAS included: their GEMVs and per-point loops are too short to pay for waking a second
// thread.
constexpr index_t kOneThreadBelowEntries = index_t{1} << 20;
// Kernel rows K(x_i, X) of fewer points are evaluated on one thread.
constexpr index_t kOneThreadKernelRowBelow = index_t{1} << 16;
// Test points per block of the predictions (the block's [d, T] kernel matrix and solve).
constexpr index_t kPredictBlock = 2048;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// body(j0, j1) for column blocks [j0, j1) of [0, n), on threads when rows x n is big enough.
template <class Body>
void for_column_blocks(index_t n, index_t rows, const Body& body) {
  const index_t blocks = (n + kColumnBlock - 1) / kColumnBlock;
  const index_t per_block = std::max<index_t>(1, rows) * kColumnBlock;
  parallel_for(blocks, std::max<index_t>(1, kMinEntriesPerThread / per_block), [&](index_t blk) {
    const index_t j0 = blk * kColumnBlock;
    body(j0, std::min(n, j0 + kColumnBlock));
  });
}

ConstMatrixView row_of(ConstMatrixView X, index_t i) { return ConstMatrixView(X.row(i), 1, X.cols, X.cols); }

void check_site(double b, double pi, index_t k) {
  require(std::isfinite(pi) && pi >= 0.0, "ivm: site_pi[", k, "] must be finite and >= 0, got ", pi);
  require(std::isfinite(b), "ivm: site_b[", k, "] must be finite, got ", b);
  require(pi > 0.0 || b == 0.0, "ivm: site ", k, " has pi = 0 but b = ", b,
          " (a site without precision must have b = 0)");
}

[[noreturn]] void throw_not_positive_definite(int info) {
  throw LinAlgError("dpotrf", info,
                    "B = I + Pi^1/2 K_I Pi^1/2 of the active points is not positive definite: the "
                    "kernel matrix of the active points is not positive semi-definite or not finite; "
                    "check the kernel's parameters or add a White kernel");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Likelihood and ADF update

void validate(const BinaryLikelihood& lik) {
  require(lik.kind == BinaryLikelihoodKind::Probit || lik.kind == BinaryLikelihoodKind::Gaussian,
          "ivm: likelihood must be probit (0) or Gaussian (1), got ", static_cast<int>(lik.kind));
  require(std::isfinite(lik.bias), "ivm: bias must be finite, got ", lik.bias);
  require(std::isfinite(lik.noise_variance) && lik.noise_variance > 0.0,
          "ivm: noise_variance must be finite and > 0, got ", lik.noise_variance);
  require(lik.n_gh >= 1 && lik.n_gh <= 100, "ivm: n_gh must be in [1, 100], got ", lik.n_gh);
  require(lik.label_noise >= 0.0 && lik.label_noise < 0.5, "ivm: label_noise must be in [0, 0.5), got ",
          lik.label_noise);
  require(lik.label_noise == 0.0 || lik.kind == BinaryLikelihoodKind::Probit,
          "ivm: label_noise needs the probit likelihood, got ", lik.label_noise, " with the Gaussian");
}

namespace {

// Label noise eps > 0 (Kim & Ghahramani 2008): P = eps + (1 - 2 eps) Phi(z). Given log Phi(z),
// r = phi(z) / Phi(z) and z + r, this makes log_z = log P and, with w = (1 - 2 eps) Phi(z) / P the
// share of the link's term, r <- w r and z_plus_r <- z + w r (LabelNoise::apply): then alpha = y r / sd and
// nu = r z_plus_r / s2 as for the plain probit (d log P / dz = w r, -d^2 log P / dz^2 =
// w r (z + w r)). nu < 0 where the tilted distribution is wider than the cavity (a point far on
// the wrong side, whose mass sits on the flat floor eps); such a point gets no site (alpha = nu =
// 0: the constrained projection, site_pi >= 0), and scores 0.
struct LabelNoise {
  double log_keep, log_eps;  // log(1 - 2 eps), log eps: once per likelihood, not per point
  explicit LabelNoise(double eps) : log_keep(std::log1p(-2.0 * eps)), log_eps(std::log(eps)) {}
  void apply(double& log_z, double& r, double& z_plus_r) const {
    const double log_clean = log_keep + log_z;
    const double hi = std::max(log_clean, log_eps), lo = std::min(log_clean, log_eps);
    log_z = hi + std::log1p(std::exp(lo - hi));
    const double wr = std::exp(log_clean - log_z) * r;
    z_plus_r -= r - wr;
    r = wr;
  }
};

}  // namespace

void check_labels(const BinaryLikelihood& lik, const double* y, index_t n) {
  for (index_t i = 0; i < n; ++i) {
    if (lik.kind == BinaryLikelihoodKind::Probit)
      require(y[i] == 1.0 || y[i] == -1.0, "ivm: probit labels must be -1 or +1, got y[", i, "] = ", y[i]);
    else
      require(std::isfinite(y[i]), "ivm: y[", i, "] must be finite, got ", y[i]);
  }
}

AdfUpdate adf_update(const BinaryLikelihood& lik, double y, double h, double a) {
  AdfUpdate u;
  const double s2 = lik.noise_variance + a;
  if (lik.kind == BinaryLikelihoodKind::Gaussian) {
    const double r = y - lik.bias - h;
    u.log_z = -0.5 * (kLog2Pi + std::log(s2) + r * r / s2);
    u.alpha = r / s2;
    u.nu = 1.0 / s2;
    // The site does not depend on the cavity: pi = 1 / sigma^2, b = (y - bias) / sigma^2.
    u.site_pi = 1.0 / lik.noise_variance;
    u.site_b = (y - lik.bias) / lik.noise_variance;
    return u;
  }
  const double sd = std::sqrt(s2);
  const double z = y * (h + lik.bias) / sd;
  // r = phi(z) / Phi(z) and z + r (> 0), the latter without cancellation in the lower tail.
  double r, z_plus_r;
  if (z < -vmath::kMillsFractionFrom) {
    double T1, T2;
    vmath::mills_fraction_tails(-z, T1, T2);
    double lambda;
    vmath::log_normal_cdf(z, u.log_z, lambda);
    r = T1 - z;
    z_plus_r = T1;
  } else {
    vmath::log_normal_cdf(z, u.log_z, r);
    z_plus_r = z + r;
  }
  if (lik.label_noise > 0.0) LabelNoise(lik.label_noise).apply(u.log_z, r, z_plus_r);
  u.alpha = y * r / sd;
  u.nu = r * z_plus_r / s2;
  if (u.nu < 0.0) u.alpha = u.nu = 0.0;  // (label noise only)
  // 1 - a nu = 1 - a r (z + r) / (sigma^2 + a) >= sigma^2 / (sigma^2 + a) > 0, since
  // 0 < r (z + r) < 1 (and w r (z + w r) < 1 for w in (0, 1] with label noise).
  const double keep = 1.0 - a * u.nu;
  u.site_pi = u.nu / keep;
  u.site_b = u.site_pi > 0.0 ? (u.alpha + h * u.nu) / keep : 0.0;
  return u;
}

double selection_score(Criterion criterion, const AdfUpdate& u, double a) {
  const double an = a * u.nu;
  const double entropy = -0.5 * vmath::log1p(-an);
  if (criterion == Criterion::Entropy) return entropy;
  return std::max(0.0, entropy + 0.5 * (a * u.alpha * u.alpha - an));
}

// ---------------------------------------------------------------------------------------------
// Random generator

std::uint64_t SplitMix64::next() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

std::uint64_t SplitMix64::below(std::uint64_t bound) {
  // Reject the lowest 2^64 mod bound values, so that every residue is equally likely.
  const std::uint64_t threshold = (0 - bound) % bound;
  std::uint64_t r;
  do r = next();
  while (r < threshold);
  return r % bound;
}

// ---------------------------------------------------------------------------------------------
// Incremental representation

namespace {

// Selection scores of the points [j0, j0 + m) (m <= vmath::kLogNormalCdfBlock) into ob; see
// BinaryIVM::scores.
PYGPFAST_SIMD_CLONES void score_block(bool probit, double eps, Criterion criterion, double s2, double bias,
                                      const double* hb, const double* ab, const double* yb,
                                      const unsigned char* actb, index_t m, double* ob) {
  constexpr index_t kBlock = vmath::kLogNormalCdfBlock;
  double z[kBlock], sd[kBlock], log_cdf[kBlock], r[kBlock], zr[kBlock];
  if (probit) {
    for (index_t i = 0; i < m; ++i) {
      sd[i] = std::sqrt(s2 + ab[i]);
      z[i] = yb[i] * (hb[i] + bias) / sd[i];
    }
    vmath::log_normal_cdf(z, log_cdf, r, static_cast<long>(m));
    for (index_t i = 0; i < m; ++i) zr[i] = z[i] + r[i];
    for (index_t i = 0; i < m; ++i) {
      if (z[i] < -vmath::kMillsFractionFrom) {
        double T1, T2;
        vmath::mills_fraction_tails(-z[i], T1, T2);
        r[i] = T1 - z[i];
        zr[i] = T1;
      }
    }
    if (eps > 0.0) {
      const LabelNoise noise(eps);
      for (index_t i = 0; i < m; ++i) noise.apply(log_cdf[i], r[i], zr[i]);
    }
    for (index_t i = 0; i < m; ++i) {
      const bool has_site = r[i] * zr[i] >= 0.0;  // (nu < 0 only with label noise: no site)
      const double nu = has_site ? r[i] * zr[i] / (s2 + ab[i]) : 0.0;
      const double an = ab[i] * nu;
      const double entropy = -0.5 * vmath::log1p(-an);
      const double alpha = has_site ? r[i] / sd[i] : 0.0;
      const double kl = std::max(0.0, entropy + 0.5 * (ab[i] * alpha * alpha - an));
      ob[i] = criterion == Criterion::Entropy ? entropy : kl;
    }
  } else {
    for (index_t i = 0; i < m; ++i) {
      const double v = s2 + ab[i];
      const double entropy = 0.5 * vmath::log1p(ab[i] / s2);
      const double alpha = (yb[i] - bias - hb[i]) / v;
      const double kl = std::max(0.0, entropy + 0.5 * (ab[i] * alpha * alpha - ab[i] / v));
      ob[i] = criterion == Criterion::Entropy ? entropy : kl;
    }
  }
  for (index_t i = 0; i < m; ++i)
    if (actb[i]) ob[i] = -std::numeric_limits<double>::infinity();
}

}  // namespace

BinaryIVM::BinaryIVM(const kernels::Kernel& kernel, ConstMatrixView X, const double* y,
                     const BinaryLikelihood& lik, index_t capacity)
    : kernel_(kernel), X_(X), y_(y), lik_(lik), n_(X.rows), capacity_(capacity) {
  validate(lik);
  require(X.rows >= 1, "ivm: X must have at least one row");
  require(X.cols == kernel.input_dim(), "ivm: X has ", X.cols, " columns but the kernel was built for ",
          kernel.input_dim());
  require(capacity >= 1 && capacity <= X.rows, "ivm: active_size must be in [1, n] = [1, ", X.rows, "], got ",
          capacity);
  for (index_t i = 0; i < n_; ++i)
    for (index_t c = 0; c < X.cols; ++c)
      require(std::isfinite(X(i, c)), "ivm: X[", i, ", ", c, "] is not finite");
  check_labels(lik, y, n_);
  M_.resize(static_cast<std::size_t>(capacity_ * n_));
  L_.resize(static_cast<std::size_t>(capacity_ * capacity_));
  h_.assign(static_cast<std::size_t>(n_), 0.0);
  a_.resize(static_cast<std::size_t>(n_));
  kdiag_.resize(static_cast<std::size_t>(n_));
  s_.resize(static_cast<std::size_t>(n_));
  m_i_.resize(static_cast<std::size_t>(capacity_));
  in_active_.assign(static_cast<std::size_t>(n_), 0);
  kernel.Kdiag(X, kdiag_.data());
  for (index_t i = 0; i < n_; ++i) {
    require(std::isfinite(kdiag_[i]) && kdiag_[i] >= 0.0, "ivm: the kernel's variance at X[", i,
            "] is ", kdiag_[i], "; it must be finite and >= 0");
    a_[i] = kdiag_[i];
  }
}

void BinaryIVM::scores(Criterion criterion, double* out) const {
  const auto t0 = Clock::now();
  const double* h = h_.data();
  const double* a = a_.data();
  const unsigned char* act = in_active_.data();
  const double s2 = lik_.noise_variance, bias = lik_.bias;
  const bool probit = lik_.kind == BinaryLikelihoodKind::Probit;
  // Blocks of points: the probit's log Phi and inverse Mills ratios of a block as one array
  // (vmath::log_normal_cdf's array form overlaps their long chains of operations), the rest as
  // loops that vectorise; the lower tail z < -4 (rare: confidently misclassified points) by
  // the continued fraction, one point at a time, as adf_update does.
  constexpr index_t kBlock = vmath::kLogNormalCdfBlock;
  const index_t blocks = (n_ + kBlock - 1) / kBlock;
  parallel_for(blocks, std::max<index_t>(1, kMinScoresPerThread / kBlock), [&](index_t blk) {
    const index_t j0 = blk * kBlock;
    score_block(probit, lik_.label_noise, criterion, s2, bias, h + j0, a + j0, y_ + j0, act + j0,
                std::min(kBlock, n_ - j0), out + j0);
  });
  stats_.score_seconds += seconds_since(t0);
}

AdfUpdate BinaryIVM::include(index_t j, Criterion criterion) {
  require(j >= 0 && j < n_, "ivm: point ", j, " is out of range [0, ", n_, ")");
  const AdfUpdate u = adf(j);
  grow(j, u.site_b, u.site_pi, u.log_z, selection_score(criterion, u, a_[j]));
  return u;
}

void BinaryIVM::include_site(index_t j, double b, double pi) {
  check_site(b, pi, d_);
  grow(j, b, pi, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::quiet_NaN());
}

void BinaryIVM::grow(index_t j, double b, double pi, double log_z, double score) {
  require(j >= 0 && j < n_, "ivm: point ", j, " is out of range [0, ", n_, ")");
  require(!is_active(j), "ivm: point ", j, " is already active");
  require(d_ < capacity_, "ivm: the active set is full (capacity ", capacity_, ")");
  const index_t n = n_, d = d_;
  double* s = s_.data();
  double* M = M_.data();

  // s = K_{.,j} - M^T M_{.,j}: column j of the posterior covariance (note, 1.3 step 1).
  auto t0 = Clock::now();
  {
    // (One row is too short for threads: the kernel would split its copy of X, n x D entries,
    // over them; at n = 8000 on a loaded 2-core machine that took 95% of an inclusion.)
    const SingleThreadScope one_row(n < kOneThreadKernelRowBelow);
    kernel_.K(row_of(X_, j), X_, false, MatrixView(s, 1, n));
  }
  s[j] = kdiag_[j];  // (K(x_j, x_j) with White's variance: the training matrix's diagonal)
  stats_.kernel_seconds += seconds_since(t0);
  t0 = Clock::now();
  for (index_t k = 0; k < d; ++k) m_i_[k] = M[k * n + j];
  blas::gemv(Trans::Yes, -1.0, ConstMatrixView(M, d, n, n), m_i_.data(), 1.0, s);
  stats_.stub_seconds += seconds_since(t0);
  stats_.stub_flops += 2.0 * static_cast<double>(n) * static_cast<double>(d);

  // Steps 2-6: the new rows of L and M, beta, and the marginals.
  t0 = Clock::now();
  const double a_j = std::max(s[j], 0.0);
  const double h_j = h_[j];
  const double lambda = std::sqrt(1.0 + pi * a_j);
  const double nu = pi / (lambda * lambda);
  const double sqrt_pi = std::sqrt(pi), sqrt_nu = std::sqrt(nu);
  double* Lrow = L_.data() + d * capacity_;
  for (index_t k = 0; k < d; ++k) Lrow[k] = sqrt_pi * m_i_[k];
  Lrow[d] = lambda;
  const double residual = b - pi * h_j;
  const double alpha = residual / (1.0 + pi * a_j);
  beta_.push_back(pi > 0.0 ? residual / (sqrt_pi * lambda) : 0.0);
  double* Mrow = M + d * n;
  double* h = h_.data();
  double* a = a_.data();
  parallel_for(n, kMinUpdatesPerThread, [&](index_t i) {
    const double si = s[i];
    Mrow[i] = sqrt_nu * si;
    h[i] += alpha * si;
    a[i] = std::max(a[i] - nu * si * si, 0.0);
  });
  active_.push_back(j);
  site_b_.push_back(b);
  site_pi_.push_back(pi);
  log_z_.push_back(log_z);
  scores_.push_back(score);
  in_active_[static_cast<std::size_t>(j)] = 1;
  ++d_;
  ++stats_.inclusions;
  stats_.update_seconds += seconds_since(t0);
}

void BinaryIVM::xi(double* out) const {
  std::copy(beta_.begin(), beta_.end(), out);
  blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, L(), out);
  for (index_t k = 0; k < d_; ++k) out[k] *= std::sqrt(site_pi_[k]);
}

void select(BinaryIVM& ivm, const SelectOptions& options) {
  const index_t n = ivm.num_points();
  require(options.active_size >= 1 && options.active_size <= ivm.capacity(), "ivm: active_size must be in [1, ",
          ivm.capacity(), "], got ", options.active_size);
  require(options.n_random >= 0, "ivm: n_random must be >= 0, got ", options.n_random);
  const SingleThreadScope small(n * options.active_size < kOneThreadBelowEntries);
  SplitMix64 rng(options.seed);
  Buffer score(static_cast<std::size_t>(n));
  std::vector<index_t> free_points;
  while (ivm.active_size() < options.active_size) {
    index_t pick = -1;
    if (ivm.active_size() < options.n_random) {
      free_points.clear();
      for (index_t j = 0; j < n; ++j)
        if (!ivm.is_active(j)) free_points.push_back(j);
      pick = free_points[static_cast<std::size_t>(rng.below(free_points.size()))];
    } else {
      ivm.scores(options.criterion, score.data());
      // The first maximum, replaced by each later equal one with probability 1 / (ties so far):
      // every tied point is equally likely, and the generator is drawn only on ties.
      double best = -std::numeric_limits<double>::infinity();
      std::uint64_t ties = 0;
      for (index_t j = 0; j < n; ++j) {
        if (ivm.is_active(j)) continue;
        const double v = score[j];
        if (std::isnan(v)) continue;
        if (pick < 0 || v > best) {
          best = v;
          pick = j;
          ties = 1;
        } else if (v == best) {
          ++ties;
          if (rng.below(ties) == 0) pick = j;
        }
      }
    }
    require(pick >= 0, "ivm: no candidate left to include");
    ivm.include(pick, options.criterion);
  }
}

// ---------------------------------------------------------------------------------------------
// Prediction

void predict(const kernels::Kernel& kernel, ConstMatrixView X_active, const double* site_pi,
             ConstMatrixView L, const double* beta, ConstMatrixView Xnew, double* mean, double* var) {
  const index_t d = X_active.rows, T = Xnew.rows;
  require(d >= 1, "ivm: the active set is empty");
  require(L.rows == d && L.cols == d, "ivm: L must be [", d, ", ", d, "], got [", L.rows, ", ", L.cols, "]");
  require(X_active.cols == kernel.input_dim() && Xnew.cols == kernel.input_dim(),
          "ivm: X_active and Xnew must have ", kernel.input_dim(), " columns, got ", X_active.cols, " and ",
          Xnew.cols);
  for (index_t k = 0; k < d; ++k) {
    require(std::isfinite(L(k, k)) && L(k, k) > 0.0, "ivm: L[", k, ", ", k, "] must be > 0, got ", L(k, k));
    require(std::isfinite(site_pi[k]) && site_pi[k] >= 0.0, "ivm: site_pi[", k, "] must be >= 0, got ",
            site_pi[k]);
  }
  if (T == 0) return;
  const SingleThreadScope small(d * std::min(T, kPredictBlock) < kOneThreadBelowEntries);
  std::vector<double> sq(static_cast<std::size_t>(d));
  for (index_t k = 0; k < d; ++k) sq[k] = std::sqrt(site_pi[k]);
  Buffer V(static_cast<std::size_t>(d * std::min(T, kPredictBlock)));
  for (index_t t0 = 0; t0 < T; t0 += kPredictBlock) {
    const index_t tb = std::min(kPredictBlock, T - t0);
    const ConstMatrixView Xb(Xnew.row(t0), tb, Xnew.cols, Xnew.ld);
    const MatrixView Vb(V.data(), d, tb);
    kernel.K(X_active, Xb, false, Vb);
    kernel.Kdiag(Xb, var + t0);
    for_column_blocks(tb, d, [&](index_t j0, index_t j1) {
      for (index_t k = 0; k < d; ++k)
        for (index_t j = j0; j < j1; ++j) Vb(k, j) *= sq[k];
    });
    linalg::solve_lower(L, Vb, false);
    blas::gemv(Trans::Yes, 1.0, Vb, beta, 0.0, mean + t0);
    for_column_blocks(tb, d, [&](index_t j0, index_t j1) {
      double* v = var + t0;
      for (index_t k = 0; k < d; ++k)
        for (index_t j = j0; j < j1; ++j) v[j] -= Vb(k, j) * Vb(k, j);
      for (index_t j = j0; j < j1; ++j) v[j] = std::max(v[j], 0.0);
    });
  }
}

void probit_probability(const BinaryLikelihood& lik, const double* mean, const double* var, index_t T,
                        double* out) {
  validate(lik);
  constexpr double kInvSqrt2 = 0.70710678118654752440;
  parallel_for(T, kMinScoresPerThread, [&](index_t t) {
    const double z = (mean[t] + lik.bias) / std::sqrt(lik.noise_variance + var[t]);
    out[t] = lik.label_noise + (1.0 - 2.0 * lik.label_noise) * 0.5 * std::erfc(-z * kInvSqrt2);
  });
}

// ---------------------------------------------------------------------------------------------
// Bound and gradient (note, 1.6)

BoundResult bound(const kernels::Kernel& kernel, const BinaryLikelihood& lik, ConstMatrixView X,
                  const double* y, const index_t* active, index_t d, const double* site_b,
                  const double* site_pi, BoundGradients* grad, double* mean_out, double* var_out,
                  const double* distances, double distances_max_norm) {
  validate(lik);
  const index_t n = X.rows, D = X.cols;
  require(n >= 1, "ivm: X must have at least one row");
  require(D == kernel.input_dim(), "ivm: X has ", D, " columns but the kernel was built for ", kernel.input_dim());
  require(d >= 1 && d <= n, "ivm: the active set must hold 1 to n = ", n, " points, got ", d);
  check_labels(lik, y, n);
  {
    std::vector<unsigned char> seen(static_cast<std::size_t>(n), 0);
    for (index_t k = 0; k < d; ++k) {
      require(active[k] >= 0 && active[k] < n, "ivm: active[", k, "] = ", active[k], " is out of range [0, ", n,
              ")");
      require(!seen[static_cast<std::size_t>(active[k])], "ivm: active[", k, "] = ", active[k], " occurs twice");
      seen[static_cast<std::size_t>(active[k])] = 1;
      check_site(site_b[k], site_pi[k], k);
    }
  }
  const SingleThreadScope small(n * d < kOneThreadBelowEntries);

  // Kernel blocks: K_{I,.} [d, n], K_I [d, d], diag K [n].
  Buffer XI_(static_cast<std::size_t>(d * D)), KIn_(static_cast<std::size_t>(d * n)),
      KI_(static_cast<std::size_t>(d * d)), kdiag(static_cast<std::size_t>(n));
  const MatrixView XI(XI_.data(), d, D), KIn(KIn_.data(), d, n), KI(KI_.data(), d, d);
  for (index_t k = 0; k < d; ++k) std::copy(X.row(active[k]), X.row(active[k]) + D, XI.row(k));
  // (the squared distances of X_I and X, given or computed once, for K(X_I, X) and its vjp)
  const kernels::SquaredDistances r2(XI, X, distances, distances_max_norm);
  kernel.K(XI, X, false, KIn, &r2);
  kernel.K(XI, XI, true, KI);
  kernel.Kdiag(X, kdiag.data());
  // (K(x_i, x_i) in the cross block is the training matrix's diagonal entry, White included.)
  for (index_t k = 0; k < d; ++k) KIn(k, active[k]) = kdiag[active[k]];

  // B = I + Pi^1/2 K_I Pi^1/2 = L L^T, M = L^-1 Pi^1/2 K_{I,.}, beta = L^-1 Pi^-1/2 b.
  std::vector<double> sq(static_cast<std::size_t>(d)), beta(static_cast<std::size_t>(d)),
      xi(static_cast<std::size_t>(d)), t(static_cast<std::size_t>(d));
  for (index_t k = 0; k < d; ++k) {
    sq[k] = std::sqrt(site_pi[k]);
    beta[k] = site_pi[k] > 0.0 ? site_b[k] / sq[k] : 0.0;
  }
  Buffer L_(static_cast<std::size_t>(d * d)), M_(static_cast<std::size_t>(d * n));
  const MatrixView L(L_.data(), d, d), M(M_.data(), d, n);
  for (index_t k = 0; k < d; ++k)
    for (index_t l = 0; l < d; ++l) L(k, l) = l <= k ? (k == l ? 1.0 : 0.0) + sq[k] * KI(k, l) * sq[l] : 0.0;
  const int info = blas::potrf_lower(L);
  if (info != 0) throw_not_positive_definite(info);
  for_column_blocks(n, d, [&](index_t j0, index_t j1) {
    for (index_t k = 0; k < d; ++k)
      for (index_t j = j0; j < j1; ++j) M(k, j) = sq[k] * KIn(k, j);
  });
  linalg::solve_lower(L, M, false);
  blas::trsv(Uplo::Lower, Trans::No, Diag::NonUnit, L, beta.data());

  // Marginals h = M^T beta, a = diag K - colsum(M o M); xi = Pi^1/2 L^-T beta.
  Buffer h(static_cast<std::size_t>(n)), a(static_cast<std::size_t>(n));
  blas::gemv(Trans::Yes, 1.0, M, beta.data(), 0.0, h.data());
  for_column_blocks(n, d, [&](index_t j0, index_t j1) {
    for (index_t j = j0; j < j1; ++j) a[j] = kdiag[j];
    for (index_t k = 0; k < d; ++k)
      for (index_t j = j0; j < j1; ++j) a[j] -= M(k, j) * M(k, j);
    for (index_t j = j0; j < j1; ++j) a[j] = std::max(a[j], 0.0);
  });
  xi = beta;
  blas::trsv(Uplo::Lower, Trans::Yes, Diag::NonUnit, L, xi.data());
  for (index_t k = 0; k < d; ++k) xi[k] *= sq[k];
  if (mean_out != nullptr) std::copy(h.begin(), h.end(), mean_out);
  if (var_out != nullptr) std::copy(a.begin(), a.end(), var_out);

  // Expected negative log-likelihoods G_j and g_h = dG/dh, g_a = dG/da (exact derivatives of
  // the quadrature that gives G), through the core's likelihoods.
  Buffer f(static_cast<std::size_t>(n)), gh(static_cast<std::size_t>(n)), ga(static_cast<std::size_t>(n)),
      dnoise(static_cast<std::size_t>(n));
  {
    Buffer yy(static_cast<std::size_t>(n)), mu(static_cast<std::size_t>(n)), vv(static_cast<std::size_t>(n)),
        dparam(static_cast<std::size_t>(n));
    likelihoods::Likelihood core;
    core.n_gh = lik.n_gh;
    const double s2 = lik.noise_variance, sd = std::sqrt(s2);
    if (lik.kind == BinaryLikelihoodKind::Gaussian) {
      core.type = likelihoods::LikelihoodType::Gaussian;
      core.variance = s2;
      for (index_t j = 0; j < n; ++j) yy[j] = y[j] - lik.bias;
      likelihoods::variational_expectations(core, yy.data(), h.data(), a.data(), n, f.data(), gh.data(),
                                            ga.data(), dparam.data());
      for (index_t j = 0; j < n; ++j) {
        f[j] = -f[j];
        gh[j] = -gh[j];
        ga[j] = -ga[j];
        dnoise[j] = -dparam[j];
      }
    } else {
      // Phi(y (u + bias) / sigma) = Phi(s f') with f' = (u + bias) / sigma ~ N(mu', var').
      core.type = likelihoods::LikelihoodType::BernoulliProbit;
      core.label_noise = lik.label_noise;
      for (index_t j = 0; j < n; ++j) {
        yy[j] = y[j] > 0.0 ? 1.0 : 0.0;
        mu[j] = (h[j] + lik.bias) / sd;
        vv[j] = a[j] / s2;
      }
      likelihoods::variational_expectations(core, yy.data(), mu.data(), vv.data(), n, f.data(), gh.data(),
                                            ga.data(), nullptr);
      for (index_t j = 0; j < n; ++j) {
        const double dmu = gh[j], dvar = ga[j];
        f[j] = -f[j];
        gh[j] = -dmu / sd;
        ga[j] = -dvar / s2;
        // d mu' / d sigma^2 = -mu' / (2 sigma^2), d var' / d sigma^2 = -var' / sigma^2.
        dnoise[j] = dmu * mu[j] / (2.0 * s2) + dvar * vv[j] / s2;
      }
    }
  }

  // KL = 1/2 [tr B^-1 + xi^T K_I xi - d + log|B|], tr B^-1 = ||L^-1||_F^2.
  Buffer Linv_(static_cast<std::size_t>(d * d));
  const MatrixView Linv(Linv_.data(), d, d);
  std::copy(L_.begin(), L_.end(), Linv_.begin());
  const int tinfo = blas::trtri_lower(Linv);
  if (tinfo != 0) throw LinAlgError("dtrtri", tinfo, "the Cholesky factor of B is singular (internal error)");
  double tr_Binv = 0.0;
  for (index_t k = 0; k < d; ++k)
    for (index_t l = 0; l <= k; ++l) tr_Binv += Linv(k, l) * Linv(k, l);
  blas::symv(Uplo::Lower, 1.0, KI, xi.data(), 0.0, t.data());  // t = K_I xi
  const double quad = blas::dot(d, xi.data(), t.data());
  const double logdet = linalg::logdet_from_cholesky(L);
  BoundResult r;
  r.kl = 0.5 * (tr_Binv + quad - static_cast<double>(d) + logdet);
  r.expected_neg_log_lik = fixed_order_sum(f.data(), n);
  r.value = r.expected_neg_log_lik + r.kl;
  if (grad == nullptr) return r;

  // V = W K_{I,.} = Pi^1/2 L^-T M [d, n]; W = (L^-1 Pi^1/2)^T (L^-1 Pi^1/2); c = V g_h;
  // zeta = W K_I xi.
  Buffer V_(M_);
  const MatrixView V(V_.data(), d, n);
  linalg::solve_lower(L, V, true);
  for_column_blocks(n, d, [&](index_t j0, index_t j1) {
    for (index_t k = 0; k < d; ++k)
      for (index_t j = j0; j < j1; ++j) V(k, j) *= sq[k];
  });
  for (index_t k = 0; k < d; ++k)
    for (index_t l = 0; l <= k; ++l) Linv(k, l) *= sq[l];  // P = L^-1 Pi^1/2
  Buffer W_(static_cast<std::size_t>(d * d)), T_(static_cast<std::size_t>(d * d)), E_(static_cast<std::size_t>(d * d));
  const MatrixView W(W_.data(), d, d), Tm(T_.data(), d, d), E(E_.data(), d, d);
  blas::syrk(Uplo::Lower, Trans::Yes, 1.0, Linv, 0.0, W);
  linalg::mirror_lower(W);
  std::vector<double> c(static_cast<std::size_t>(d)), zeta(static_cast<std::size_t>(d));
  blas::gemv(Trans::No, 1.0, V, gh.data(), 0.0, c.data());
  blas::symv(Uplo::Lower, 1.0, W, t.data(), 0.0, zeta.data());
  // E = -c xi^T + V diag(g_a) V^T + 1/2 [W K_I W + xi xi^T - zeta xi^T - xi zeta^T].
  {
    Buffer scratch(static_cast<std::size_t>(d * n));
    linalg::weighted_gram(V, ga.data(), scratch.data(), E, 0.0);
    linalg::mirror_lower(E);
  }
  blas::symm(Side::Left, Uplo::Lower, 1.0, KI, W, 0.0, Tm);  // K_I W
  blas::gemm(Trans::No, Trans::No, 0.5, W, Tm, 1.0, E);      // + W K_I W / 2
  for (index_t k = 0; k < d; ++k)
    for (index_t l = 0; l < d; ++l)
      E(k, l) += -c[k] * xi[l] + 0.5 * (xi[k] * xi[l] - zeta[k] * xi[l] - xi[k] * zeta[l]);

  // Adjoint of K_{I,.}: G = xi g_h^T - 2 V diag(g_a) [d, n] (the transpose of the note's Z).
  Buffer& G_ = V_;  // (V is no longer needed once G is formed in its place)
  const MatrixView G(G_.data(), d, n);
  for_column_blocks(n, d, [&](index_t j0, index_t j1) {
    for (index_t k = 0; k < d; ++k)
      for (index_t j = j0; j < j1; ++j) G(k, j) = xi[k] * gh[j] - 2.0 * V(k, j) * ga[j];
  });
  const index_t P = kernel.num_params();
  std::fill(grad->kernel, grad->kernel + P, 0.0);
  kernel.K_vjp(XI, X, false, G, grad->kernel, nullptr, nullptr, &r2);
  // The entries (k, i_k) of K_{I,.} are diagonal entries of the training matrix (set from Kdiag
  // above): their vjp is Kdiag's, not that of K(x, x) between distinct inputs (they differ by
  // a White kernel's variance).
  {
    std::vector<double> gdiag(static_cast<std::size_t>(d));
    for (index_t k = 0; k < d; ++k) gdiag[k] = G(k, active[k]);
    kernel.Kdiag_vjp(XI, gdiag.data(), grad->kernel);
    std::vector<double> minus(static_cast<std::size_t>(d * d), 0.0);
    for (index_t k = 0; k < d; ++k) minus[k * d + k] = -gdiag[k];
    kernel.K_vjp(XI, XI, false, ConstMatrixView(minus.data(), d, d), grad->kernel, nullptr, nullptr);
  }
  kernel.K_vjp(XI, XI, true, E, grad->kernel, nullptr, nullptr);
  kernel.Kdiag_vjp(X, ga.data(), grad->kernel);
  grad->bias = fixed_order_sum(gh.data(), n);
  grad->noise_variance = fixed_order_sum(dnoise.data(), n);
  return r;
}

}  // namespace pygpfast::ivm
