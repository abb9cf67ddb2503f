#include "pygpfast/kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/linalg.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/vmath.hpp"
#include "pygpfast/workspace.hpp"

namespace pygpfast::kernels {
namespace {

// ---------------------------------------------------------------------------------------
// Loop and buffer helpers
// ---------------------------------------------------------------------------------------

// Elementwise loops split across threads only when each thread gets at least this many
// entries: below that, waking a second thread costs more than it saves (threads.hpp).
constexpr index_t kMinEntriesPerThread = 16384;

// A kernel description deeper than this is refused (parsing recurses once per level).
constexpr int kMaxDepth = 1000;

// Calls body(i, end) for every row i of an [n, m] matrix, where end = m, or end = i + 1
// (the row's part of the lower triangle) when `lower`, on threads when each gets at least
// kMinEntriesPerThread entries (parallel_for). Rows are independent, so results do not depend
// on the thread count. The triangular loop pairs row p with row n-1-p so that every item does
// the same work (n + 1 entries) under parallel_for's even split.
template <class Body>
void for_each_row(index_t n, index_t m, bool lower, const Body& body) {
  if (!lower) {
    parallel_for(n, std::max<index_t>(1, kMinEntriesPerThread / std::max<index_t>(m, 1)),
                 [&](index_t i) { body(i, m); });
    return;
  }
  parallel_for((n + 1) / 2, std::max<index_t>(1, kMinEntriesPerThread / (n + 1)), [&](index_t p) {
    body(p, p + 1);
    const index_t q = n - 1 - p;
    if (q != p) body(q, q + 1);
  });
}

// Sum of per-row partial sums in a fixed order (the same result for any thread count).
double ordered_sum(const std::vector<double>& partials) {
  double s = 0.0;
  for (double v : partials) s += v;
  return s;
}

double vector_sum(const double* v, index_t n) {
  double s = 0.0;
  for (index_t i = 0; i < n; ++i) s += v[i];
  return s;
}

// Owning row-major buffer for intermediates. Left uninitialised: every user overwrites it.
class Matrix {
 public:
  Matrix(index_t rows, index_t cols) : data_(rows * cols), rows_(rows), cols_(cols) {}
  MatrixView view() const { return MatrixView(data_.data(), rows_, cols_); }

 private:
  workspace::Scratch data_;
  index_t rows_, cols_;
};

// out = alpha * A B^T. When `same` (B is A) only the lower triangle is computed, by syrk:
// half the flops, and the caller mirrors it, which makes K(X, X) exactly symmetric.
void cross_product(ConstMatrixView A, ConstMatrixView B, bool same, double alpha, MatrixView out) {
  if (same)
    blas::syrk(blas::Uplo::Lower, blas::Trans::No, alpha, A, 0.0, out);
  else
    blas::gemm(blas::Trans::No, blas::Trans::Yes, alpha, A, B, 0.0, out);
}

// out[i, d] = (X[i, d] - shift[d]) * scale[d], an [N, D] copy.
Matrix scale_columns(ConstMatrixView X, const std::vector<double>& shift,
                     const std::vector<double>& scale) {
  Matrix out(X.rows, X.cols);
  const MatrixView o = out.view();
  for_each_row(X.rows, X.cols, false, [&](index_t i, index_t cols) {
    for (index_t d = 0; d < cols; ++d) o(i, d) = (X(i, d) - shift[d]) * scale[d];
  });
  return out;
}

std::vector<double> column_means(ConstMatrixView X) {
  std::vector<double> mean(static_cast<std::size_t>(X.cols), 0.0);
  for (index_t i = 0; i < X.rows; ++i)
    for (index_t d = 0; d < X.cols; ++d) mean[d] += X(i, d);
  for (double& v : mean) v /= static_cast<double>(std::max<index_t>(X.rows, 1));
  return mean;
}

// o[j] = sum_d (a[d] - bT[d, j])^2 for j < n: the squared distances from one point a to the
// columns of bT [D, M], summed over d in order (vectorised over j).
void squared_distances_row(const double* a, ConstMatrixView bT, index_t n, double* o) noexcept {
  std::fill(o, o + n, 0.0);
  for (index_t d = 0; d < bT.rows; ++d) {
    const double ad = a[d];
    const double* b = bT.row(d);
#pragma omp simd
    for (index_t j = 0; j < n; ++j) {
      const double diff = ad - b[j];
      o[j] += diff * diff;
    }
  }
}

// sum_d ((x[d] - z[d]) s[d])^2 in 16 interleaved partial sums (part k sums d = k mod 16, in
// order), combined in a fixed tree: SIMD-wide without -ffast-math, and the same digits from the
// AVX-512, AVX2 and baseline clones (a plain running sum is one add-latency chain per element).
PYGPFAST_SIMD_CLONES double scaled_squared_distance(index_t D, const double* x, const double* z,
                                                    const double* s) noexcept {
  constexpr int kParts = 16;
  double part[kParts] = {};
  index_t d = 0;
  for (; d + kParts <= D; d += kParts) {
#pragma omp simd
    for (int k = 0; k < kParts; ++k) {
      const double u = (x[d + k] - z[d + k]) * s[d + k];
      part[k] += u * u;
    }
  }
  for (int k = 0; d + k < D; ++k) {
    const double u = (x[d + k] - z[d + k]) * s[d + k];
    part[k] += u * u;
  }
  for (int w = kParts / 2; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) part[k] += part[k + w];
  return part[0];
}

// out[j] = sum_d ((x_jd - z_d) s_d)^2 between the one row z of one side of (X, X2) and every row
// x_j of the other (N = 1 or M = 1; [max(N, M)]): rows on threads, each in a fixed order.
void one_point_squared_distances(ConstMatrixView X, ConstMatrixView X2, const double* s, double* out) {
  const bool column = X2.rows == 1;
  const ConstMatrixView many = column ? X : X2;
  const double* z = column ? X2.row(0) : X.row(0);
  for_each_row(many.rows, many.cols, false,
               [&](index_t j, index_t) { out[j] = scaled_squared_distance(many.cols, many.row(j), z, s); });
}

std::vector<double> row_squared_norms(ConstMatrixView A) {
  std::vector<double> out(static_cast<std::size_t>(A.rows));
  for_each_row(A.rows, A.cols, false, [&](index_t i, index_t cols) {
    double s = 0.0;
    for (index_t d = 0; d < cols; ++d) s += A(i, d) * A(i, d);
    out[i] = s;
  });
  return out;
}

// ---------------------------------------------------------------------------------------
// Nodes of the expression tree
// ---------------------------------------------------------------------------------------

struct Inputs {
  ConstMatrixView X, X2;
  bool same;
  const SquaredDistances* distances = nullptr;  // of X and X2, when the caller has them
};

}  // namespace

// Every node writes (K, Kdiag) or accumulates (the vjps) for its whole subtree; its
// parameters' gradients go to dparams[offset ...] in the layout of kernels.hpp.
struct Node {
  virtual ~Node() = default;
  virtual void K(const Inputs& in, MatrixView out) const = 0;
  virtual void Kdiag(ConstMatrixView X, double* out) const = 0;
  virtual void K_vjp(const Inputs& in, ConstMatrixView G, double* dparams, MatrixView* dX,
                     MatrixView* dX2) const = 0;
  // The same vjp given this node's K(X, X2) (`values`), for nodes whose gradients follow from
  // their values without evaluating the kernel again. Returns false (and does nothing) for the
  // others.
  virtual bool K_vjp_from_values(const Inputs&, ConstMatrixView /*G*/, ConstMatrixView /*values*/,
                                 double* /*dparams*/, MatrixView* /*dX*/, MatrixView* /*dX2*/) const {
    return false;
  }
  virtual void Kdiag_vjp(ConstMatrixView X, const double* g, double* dparams) const = 0;
};

namespace {

// A leaf's parameters: its offset in the flat array and its values.
struct LeafParams {
  index_t offset;
  std::vector<double> values;
};

// Expands k = 1 (shared) or k = D per-dimension values to D values.
std::vector<double> per_dimension(const double* values, index_t k, index_t D) {
  std::vector<double> out(static_cast<std::size_t>(D));
  for (index_t d = 0; d < D; ++d) out[d] = values[k == 1 ? 0 : d];
  return out;
}

// ---- stationary kernels: k = variance * f(r^2), r^2 = sum_d (x_d - x2_d)^2 / l_d^2 ----

// f and df/d(r^2) of each stationary kernel, forced inline into the elementwise loops below: a
// call would keep a loop from vectorising, and whether the inliner took it decided the order of
// the vjp row's sums (`omp simd reduction`), so an unrelated change moved the kernel gradients.
template <KernelType T>
struct Profile;

template <>
struct Profile<KernelType::RBF> {
  [[gnu::always_inline]] static void value_and_slope(double r2, double& f, double& df) {
    f = vmath::exp(-0.5 * r2);
    df = -0.5 * f;
  }
};

template <>
struct Profile<KernelType::Matern12> {
  // df/dr^2 = -f / (2r) is unbounded at r = 0, where the kernel has a cusp. There its
  // product with every d(r^2)/dtheta (which vanishes like r^2) tends to 0, so 0 is the
  // right value for the parameter gradients and the symmetric subgradient for X.
  [[gnu::always_inline]] static void value_and_slope(double r2, double& f, double& df) {
    const double r = std::sqrt(r2);
    f = vmath::exp(-r);
    df = r > 0.0 ? -0.5 * f / r : 0.0;
  }
};

template <>
struct Profile<KernelType::Matern32> {
  [[gnu::always_inline]] static void value_and_slope(double r2, double& f, double& df) {
    constexpr double kSqrt3 = 1.7320508075688772;
    const double r = std::sqrt(r2), e = vmath::exp(-kSqrt3 * r);
    f = e > 0.0 ? (1.0 + kSqrt3 * r) * e : 0.0;  // (not inf * 0 at r = inf)
    df = -1.5 * e;
  }
};

template <>
struct Profile<KernelType::Matern52> {
  [[gnu::always_inline]] static void value_and_slope(double r2, double& f, double& df) {
    constexpr double kSqrt5 = 2.23606797749979;
    const double r = std::sqrt(r2), e = vmath::exp(-kSqrt5 * r);
    f = e > 0.0 ? (1.0 + kSqrt5 * r + (5.0 / 3.0) * r2) * e : 0.0;  // (not inf * 0 at r = inf)
    df = e > 0.0 ? -(5.0 / 6.0) * (1.0 + kSqrt5 * r) * e : 0.0;
  }
};

// One row of a stationary kernel matrix. On entry o[j] = -2 a_i.b_j (from the GEMM); then
// r^2_ij = max(0, o[j] + |a_i|^2 + |b_j|^2), except r^2 = 0 exactly at j = diag (the
// diagonal of K(X, X); diag < 0 when there is none). Rounding can make r^2 slightly
// negative, hence the clamp.
template <KernelType T>
[[gnu::always_inline]] inline void profile_row(double* o, const double* b_norms, double a_norm, index_t diag, double variance,
                        index_t n) {
#pragma omp simd
  for (index_t j = 0; j < n; ++j) {
    const double s = o[j] + (a_norm + b_norms[j]);
    const double r2 = (j == diag || s < 0.0) ? 0.0 : s;
    double f, df;
    Profile<T>::value_and_slope(r2, f, df);
    o[j] = variance * f;
  }
}

// The same row for the vector-Jacobian product: w[j] <- g[j] variance df/d(r^2), and the
// row sums of g o f, w and w o r^2 in sums[0..2].
template <KernelType T>
[[gnu::always_inline]] inline void profile_vjp_row(double* w, const double* g, const double* b_norms, double a_norm, index_t diag,
                            double variance, index_t n, double* sums) {
  double gf = 0.0, sw = 0.0, swr2 = 0.0;
#pragma omp simd reduction(+ : gf, sw, swr2)
  for (index_t j = 0; j < n; ++j) {
    const double s = w[j] + (a_norm + b_norms[j]);
    const double r2 = (j == diag || s < 0.0) ? 0.0 : s;
    double f, df;
    Profile<T>::value_and_slope(r2, f, df);
    const double wij = g[j] * variance * df;
    gf += g[j] * f;
    sw += wij;
    swr2 += wij == 0.0 ? 0.0 : wij * r2;  // (not 0 * inf where r^2 overflows)
    w[j] = wij;
  }
  sums[0] = gf;
  sums[1] = sw;
  sums[2] = swr2;
}

// Non-template entry points, compiled once per SIMD level (vmath.hpp); the rows above are
// forced inline so that each clone vectorises them for its own instruction set.
PYGPFAST_SIMD_CLONES void stationary_row(KernelType type, double* o, const double* b_norms, double a_norm,
                                         index_t diag, double variance, index_t n) {
  switch (type) {
    case KernelType::RBF: return profile_row<KernelType::RBF>(o, b_norms, a_norm, diag, variance, n);
    case KernelType::Matern12:
      return profile_row<KernelType::Matern12>(o, b_norms, a_norm, diag, variance, n);
    case KernelType::Matern32:
      return profile_row<KernelType::Matern32>(o, b_norms, a_norm, diag, variance, n);
    default: return profile_row<KernelType::Matern52>(o, b_norms, a_norm, diag, variance, n);
  }
}

PYGPFAST_SIMD_CLONES void stationary_vjp_row(KernelType type, double* w, const double* g,
                                             const double* b_norms, double a_norm, index_t diag,
                                             double variance, index_t n, double* sums) {
  switch (type) {
    case KernelType::RBF:
      return profile_vjp_row<KernelType::RBF>(w, g, b_norms, a_norm, diag, variance, n, sums);
    case KernelType::Matern12:
      return profile_vjp_row<KernelType::Matern12>(w, g, b_norms, a_norm, diag, variance, n, sums);
    case KernelType::Matern32:
      return profile_vjp_row<KernelType::Matern32>(w, g, b_norms, a_norm, diag, variance, n, sums);
    default: return profile_vjp_row<KernelType::Matern52>(w, g, b_norms, a_norm, diag, variance, n, sums);
  }
}

// Scaled inputs a = (X - c) / l, b = (X2 - c) / l and their squared norms, from which
// r^2_ij = |a_i|^2 + |b_j|^2 - 2 a_i.b_j with one GEMM. The kernel does not change under a
// common shift c; centring on the mean of X keeps the norms small, which limits the
// cancellation in that difference (and in the GEMM-shaped gradients built the same way) to
// about D eps (|a_i|^2 + |b_j|^2) absolute. Where the norms exceed kExpansionNormLimit (inputs
// more than ~1000 lengthscales from the mean, e.g. raw time stamps with a short lengthscale),
// that error would exceed ~1e-9, so the kernel and its vjp sum (a_id - b_jd)^2 directly instead
// (inputs spread over 1e6 lengthscales had errors of 1e-4 in K and 3e-5 in the lengthscale's
// gradient the other way).
constexpr double kExpansionNormLimit = 1e6;

struct ScaledPair {
  ScaledPair(const Inputs& in, const std::vector<double>& inv_lengthscale)
      : shift(column_means(in.X)),
        a_buf(scale_columns(in.X, shift, inv_lengthscale)),
        b_buf(in.same ? Matrix(0, 0) : scale_columns(in.X2, shift, inv_lengthscale)),
        a(a_buf.view()),
        b(in.same ? a : ConstMatrixView(b_buf.view())),
        a_norms(row_squared_norms(a)),
        b_norms(in.same ? a_norms : row_squared_norms(b)) {}

  // Whether |a_i|^2 + |b_j|^2 - 2 a_i.b_j loses more than ~1e-9 (absolute) to cancellation,
  // or overflows (inf - inf, inputs beyond ~1e154 lengthscales from the mean).
  bool expansion_inexact() const {
    for (double v : a_norms)
      if (!(v <= kExpansionNormLimit)) return true;
    for (double v : b_norms)
      if (!(v <= kExpansionNormLimit)) return true;
    return false;
  }

  // b^T [D, M], for the direct distances (rows of b^T are contiguous over j).
  Matrix b_transposed() const {
    Matrix out(b.cols, b.rows);
    const MatrixView o = out.view();
    for (index_t j = 0; j < b.rows; ++j)
      for (index_t d = 0; d < b.cols; ++d) o(d, j) = b(j, d);
    return out;
  }

  std::vector<double> shift;
  Matrix a_buf, b_buf;  // b_buf is empty when `same` (b is a)
  ConstMatrixView a, b;
  std::vector<double> a_norms, b_norms;
};

}  // namespace

namespace {

// The order statistics of the differences |a_i - b_j| (as computed: fl(a_i - b_j), sign
// dropped) over all pairs of sorted finite a [R] and b [P], without forming the R P of them.
// Rounding is monotone, so for a fixed a_i the pairs with |a_i - b_j| <= t are one run
// [lo_i, hi_i) of the sorted b, and both ends move right as a_i grows: #{|a - b| <= t} in
// O(R + P). The k-th smallest difference is the least t with more than k of them <= t, found by
// bisection over the bit patterns of doubles >= 0 (ordered as their values): at most 64 counts.
class PairDifferences {
 public:
  PairDifferences(const std::vector<double>& a, const std::vector<double>& b) : a_(a), b_(b) {}

  std::size_t count_at_most(double t) const {
    const std::size_t P = b_.size();
    std::size_t count = 0, lo = 0, hi = 0;
    for (const double x : a_) {
      while (lo < P && b_[lo] <= x && x - b_[lo] > t) ++lo;
      hi = std::max(hi, lo);
      while (hi < P && (b_[hi] <= x || b_[hi] - x <= t)) ++hi;
      count += hi - lo;
    }
    return count;
  }

  // The k-th smallest difference (0-based).
  double kth(std::size_t k) const {
    const double largest = std::max(a_.back() - b_.front(), b_.back() - a_.front());
    std::uint64_t lo = 0, hi = bits(std::max(largest, 0.0));
    while (lo < hi) {
      const std::uint64_t mid = lo + (hi - lo) / 2;
      if (count_at_most(value(mid)) > k) hi = mid;
      else lo = mid + 1;
    }
    return value(lo);
  }

 private:
  static std::uint64_t bits(double v) {
    std::uint64_t u;
    std::memcpy(&u, &v, sizeof u);
    return u;
  }
  static double value(std::uint64_t u) {
    double v;
    std::memcpy(&v, &u, sizeof v);
    return v;
  }
  const std::vector<double>& a_;
  const std::vector<double>& b_;
};

}  // namespace

void dimension_spread(ConstMatrixView rows, ConstMatrixView others, double* out) {
  require(rows.cols == others.cols, "rows have ", rows.cols, " columns and others ", others.cols);
  const index_t R = rows.rows, P = others.rows, D = rows.cols;
  // (each dimension selects over R P differences: worth a thread from a few thousand)
  parallel_for(D, std::max<index_t>(1, kMinEntriesPerThread / std::max<index_t>(R * P, 1)), [&](index_t d) {
    thread_local std::vector<double> a, b, diff;
    a.resize(static_cast<std::size_t>(R));
    b.resize(static_cast<std::size_t>(P));
    bool finite = true;
    for (index_t i = 0; i < R; ++i) finite &= std::isfinite(a[i] = rows(i, d));
    for (index_t j = 0; j < P; ++j) finite &= std::isfinite(b[j] = others(j, d));
    double median = 1.0;
    // (PairDifferences' bisection takes up to 64 passes over R + P values: for fewer than
    // 64 (R + P) pairs, and with infinite entries, the differences are formed and selected)
    const bool by_counts = finite && R * P > 64 * (R + P);
    if (by_counts) {
      // (sorted columns, the differences' order statistics by PairDifferences' counts)
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      const PairDifferences pairs(a, b);
      const std::size_t zeros = pairs.count_at_most(0.0), total = static_cast<std::size_t>(R) * P;
      const std::size_t n = total - zeros, half = n / 2;
      if (n > 0) {
        median = pairs.kth(zeros + half);
        if (n % 2 == 0) median = (pairs.kth(zeros + half - 1) + median) / 2.0;
      }
    } else {  // (|inf - inf| is NaN: left out)
      diff.clear();
      for (index_t i = 0; i < R; ++i)
        for (index_t j = 0; j < P; ++j) {
          const double v = std::fabs(a[i] - b[j]);
          if (v > 0.0) diff.push_back(v);
        }
      if (!diff.empty()) {
        const std::size_t n = diff.size(), half = n / 2;
        std::nth_element(diff.begin(), diff.begin() + half, diff.end());
        median = diff[half];
        if (n % 2 == 0) median = (*std::max_element(diff.begin(), diff.begin() + half) + median) / 2.0;
      }
    }
    out[d] = std::isfinite(median) ? median : 1.0;
  });
}

SquaredDistances::SquaredDistances(ConstMatrixView X, ConstMatrixView X2) : X_(X), X2_(X2) {
  require(X.cols == X2.cols, "X has ", X.cols, " columns and X2 ", X2.cols);
}

SquaredDistances::SquaredDistances(ConstMatrixView X, ConstMatrixView X2, const double* values, double max_norm)
    : SquaredDistances(X, X2) {
  if (values == nullptr) return;
  require(max_norm >= 0.0, "the given distances' max_norm must be >= 0, got ", max_norm);
  max_norm_ = max_norm;
  values_ = values;
  std::call_once(computed_, [] {});
}

void SquaredDistances::compute() const {
  const index_t N = X_.rows, M = X2_.rows;
  r2_.assign(static_cast<std::size_t>(N * M), 0.0);
  values_ = r2_.data();
  if (N == 0 || M == 0) return;
  const std::vector<double> ones(static_cast<std::size_t>(X_.cols), 1.0);
  if (N == 1 || M == 1) return one_point_squared_distances(X_, X2_, ones.data(), r2_.data());
  const ScaledPair s(Inputs{X_, X2_, false}, ones);  // (centred on X's mean, unscaled)
  for (double v : s.a_norms) max_norm_ = std::max(max_norm_, v);
  for (double v : s.b_norms) max_norm_ = std::max(max_norm_, v);
  if (!std::isfinite(max_norm_)) max_norm_ = HUGE_VAL;
  const MatrixView out(r2_.data(), N, M);
  cross_product(s.a, s.b, false, -2.0, out);
  for_each_row(N, M, false, [&](index_t i, index_t end) {
    double* o = out.row(i);
    for (index_t j = 0; j < end; ++j) o[j] = std::max(0.0, o[j] + (s.a_norms[i] + s.b_norms[j]));
  });
}

bool SquaredDistances::usable(double inv_lengthscale_sq) const {
  return max_norm() * inv_lengthscale_sq <= kExpansionNormLimit;
}

const double* SquaredDistances::values() const {
  std::call_once(computed_, [this] { compute(); });
  return values_;
}

double SquaredDistances::max_norm() const {
  std::call_once(computed_, [this] { compute(); });
  return max_norm_;
}

namespace {

template <KernelType T>
class Stationary final : public Node {
 public:
  Stationary(const LeafParams& p, index_t D)
      : offset_(p.offset),
        variance_(p.values[0]),
        ard_(p.values.size() > 2),
        inv_lengthscale_(per_dimension(p.values.data() + 1,
                                       static_cast<index_t>(p.values.size()) - 1, D)) {
    for (double& v : inv_lengthscale_) v = 1.0 / v;
  }

  void K(const Inputs& in, MatrixView out) const override {
    if (reads(in.distances)) return K_from_distances(*in.distances, out);
    if (!in.same && (in.X.rows == 1 || in.X2.rows == 1)) return K_one_point(in, out);
    const ScaledPair s(in, inv_lengthscale_);
    if (s.expansion_inexact()) return K_direct(s, in.same, out);
    cross_product(s.a, s.b, in.same, -2.0, out);
    for_each_row(out.rows, out.cols, in.same, [&](index_t i, index_t end) {
      stationary_row(T, out.row(i), s.b_norms.data(), s.a_norms[i], in.same ? i : -1, variance_, end);
    });
    if (in.same) linalg::mirror_lower(out);
  }

  // Whether the caller's squared distances serve this leaf (SquaredDistances).
  bool reads(const SquaredDistances* r2) const {
    return r2 != nullptr && !ard_ && r2->usable(inv_lengthscale_[0] * inv_lengthscale_[0]);
  }

  // K from the squared distances: f(r^2 / l^2) per entry (the distances are of two different
  // inputs: no diagonal to pin).
  void K_from_distances(const SquaredDistances& r2, MatrixView out) const {
    const double s = inv_lengthscale_[0] * inv_lengthscale_[0];
    const std::vector<double> zeros(static_cast<std::size_t>(out.cols), 0.0);
    for_each_row(out.rows, out.cols, false, [&](index_t i, index_t end) {
      const double* r = r2.row(i);
      double* o = out.row(i);
      for (index_t j = 0; j < end; ++j) o[j] = r[j] * s;
      stationary_row(T, o, zeros.data(), 0.0, -1, variance_, end);
    });
  }

  // K between one point and the rows of a matrix (a kernel column, as an IVM inclusion needs),
  // from the squared distances sum_d ((x_jd - z_d) / l_d)^2 summed directly in one pass over the
  // matrix: the expansion's scaled copy, norms and GEMM (which packs the whole matrix for one
  // column) read it five times. (An IVM selection at n = 4000, D = 784, C = 5 kernels, d = 400:
  // 2000 columns.) Rows in parallel, each summed in a fixed order: the same for any thread count.
  void K_one_point(const Inputs& in, MatrixView out) const {
    const bool column = in.X2.rows == 1;  // out [N, 1]; else [1, M]
    const index_t n = column ? in.X.rows : in.X2.rows;
    workspace::Scratch r2(n);
    one_point_squared_distances(in.X, in.X2, inv_lengthscale_.data(), r2.data());
    const std::vector<double> zeros(static_cast<std::size_t>(n), 0.0);
    stationary_row(T, r2.data(), zeros.data(), 0.0, -1, variance_, n);
    for (index_t j = 0; j < n; ++j) (column ? out(j, 0) : out(0, j)) = r2.data()[j];
  }

  // K from the squared distances sum_d (a_id - b_jd)^2 summed directly (O(N M D), no GEMM), for
  // inputs far from their mean (ScaledPair::expansion_inexact); a distance that overflows gives
  // k = 0, its limit.
  void K_direct(const ScaledPair& s, bool same, MatrixView out) const {
    const Matrix bT_buf = s.b_transposed();
    const ConstMatrixView bT = bT_buf.view();
    const std::vector<double> zeros(static_cast<std::size_t>(out.cols), 0.0);
    for_each_row(out.rows, out.cols, same, [&](index_t i, index_t end) {
      squared_distances_row(s.a.row(i), bT, end, out.row(i));
      stationary_row(T, out.row(i), zeros.data(), 0.0, same ? i : -1, variance_, end);
    });
    if (same) linalg::mirror_lower(out);
  }

  void Kdiag(ConstMatrixView X, double* out) const override {
    std::fill(out, out + X.rows, variance_);
  }

  // With W = G o dk/d(r^2), every gradient is a contraction of W with d(r^2):
  //   d/dl_d:  -2/l_d sum_ij W_ij (a_id - b_jd)^2
  //          = -2/l_d sum_i [a_id^2 R_i - 2 a_id (W b)_id + (W (b o b))_id],  R = W 1
  //   dX_id:    2/l_d (a_id R_i - (W b)_id)
  //   dX2_jd:   2/l_d (b_jd C_j - (W^T a)_jd),                                C = W^T 1
  // so beyond one elementwise pass the work is two GEMMs, W [b, b o b] and W^T [a, 1].
  void K_vjp(const Inputs& in, ConstMatrixView G, double* dparams, MatrixView* dX,
             MatrixView* dX2) const override {
    const index_t N = in.X.rows, M = in.X2.rows;
    if (dX == nullptr && dX2 == nullptr && reads(in.distances)) return K_vjp_from_distances(*in.distances, G, dparams);
    const ScaledPair s(in, inv_lengthscale_);
    const bool direct = s.expansion_inexact();
    const Matrix bT_buf = direct ? s.b_transposed() : Matrix(0, 0);
    const ConstMatrixView bT = bT_buf.view();
    const std::vector<double> zeros(direct ? static_cast<std::size_t>(M) : 0, 0.0);
    Matrix W_buf(N, M);
    const MatrixView W = W_buf.view();
    if (!direct) {
      cross_product(s.a, s.b, in.same, -2.0, W);
      if (in.same) linalg::mirror_lower(W);
    }

    // Per-row partial sums of G o f (variance), W (R) and W o r^2 (isotropic lengthscale).
    std::vector<double> row_gf(N), row_w(N), row_wr2(N);
    for_each_row(N, M, false, [&](index_t i, index_t end) {
      double sums[3];
      if (direct) squared_distances_row(s.a.row(i), bT, end, W.row(i));
      stationary_vjp_row(T, W.row(i), G.row(i), direct ? zeros.data() : s.b_norms.data(),
                         direct ? 0.0 : s.a_norms[i], in.same ? i : -1, variance_, end, sums);
      row_gf[i] = sums[0];
      row_w[i] = sums[1];
      row_wr2[i] = sums[2];
    });
    dparams[offset_] += ordered_sum(row_gf);
    if (!ard_) dparams[offset_ + 1] += -2.0 * inv_lengthscale_[0] * ordered_sum(row_wr2);
    if (direct)
      contract_direct(s, bT, W, ard_, dparams, dX, dX2);
    else
      contract(s, W, row_w, ard_, dparams, dX, dX2);
  }

  // RBF: dk/d(r^2) = -k / 2, so W = -G o K / 2 and the variance's gradient is sum G o K / variance,
  // with no distance or exp to evaluate. The isotropic lengthscale's gradient is then the sum of
  // the per-dimension ones (from the W (b o b) GEMM).
  bool K_vjp_from_values(const Inputs& in, ConstMatrixView G, ConstMatrixView values, double* dparams,
                         MatrixView* dX, MatrixView* dX2) const override {
    if constexpr (T != KernelType::RBF) {
      return false;
    } else {
      const index_t N = in.X.rows, M = in.X2.rows;
      const ScaledPair s(in, inv_lengthscale_);
      Matrix W_buf(N, M);
      const MatrixView W = W_buf.view();
      std::vector<double> row_gk(N), row_w(N);
      for_each_row(N, M, false, [&](index_t i, index_t end) {
        const double* g = G.row(i);
        const double* k = values.row(i);
        double* w = W.row(i);
        double gk = 0.0;
#pragma omp simd reduction(+ : gk)
        for (index_t j = 0; j < end; ++j) {
          gk += g[j] * k[j];
          w[j] = -0.5 * g[j] * k[j];
        }
        row_gk[i] = gk;
        row_w[i] = -0.5 * gk;
      });
      dparams[offset_] += ordered_sum(row_gk) / variance_;
      if (s.expansion_inexact())
        contract_direct(s, s.b_transposed().view(), W, true, dparams, dX, dX2);
      else
        contract(s, W, row_w, true, dparams, dX, dX2);
      return true;
    }
  }

  // The diagonal is the variance; the lengthscales do not enter it.
  void Kdiag_vjp(ConstMatrixView X, const double* g, double* dparams) const override {
    dparams[offset_] += vector_sum(g, X.rows);
  }

 private:
  // The vjp for the variance and the (isotropic) lengthscale from the squared distances.
  void K_vjp_from_distances(const SquaredDistances& r2, ConstMatrixView G, double* dparams) const {
    const index_t N = G.rows, M = G.cols;
    const double s = inv_lengthscale_[0] * inv_lengthscale_[0];
    const std::vector<double> zeros(static_cast<std::size_t>(M), 0.0);
    std::vector<double> row_gf(N), row_wr2(N);
    for_each_row(N, M, false, [&](index_t i, index_t end) {
      const double* r = r2.row(i);
      thread_local std::vector<double> w;
      w.resize(static_cast<std::size_t>(end));
      for (index_t j = 0; j < end; ++j) w[j] = r[j] * s;
      double sums[3];
      stationary_vjp_row(T, w.data(), G.row(i), zeros.data(), 0.0, -1, variance_, end, sums);
      row_gf[i] = sums[0];
      row_wr2[i] = sums[2];
    });
    dparams[offset_] += ordered_sum(row_gf);
    dparams[offset_ + 1] += -2.0 * inv_lengthscale_[0] * ordered_sum(row_wr2);
  }

  // The lengthscale (when `lengthscales`; per dimension, summed for an isotropic kernel), dX and
  // dX2 gradients from W and its row sums R (see K_vjp). The O((N + M) D) loops are too small to
  // be worth threads.
  void contract(const ScaledPair& s, ConstMatrixView W, const std::vector<double>& row_w, bool lengthscales,
                double* dparams, MatrixView* dX, MatrixView* dX2) const {
    const index_t N = W.rows, M = W.cols, D = s.a.cols;
    if (lengthscales || dX != nullptr) {
      // WB = W [b, b o b] (the b o b half only for the lengthscales).
      const index_t cols = lengthscales ? 2 * D : D;
      Matrix B_buf(M, cols), WB_buf(N, cols);
      const MatrixView B = B_buf.view(), WB = WB_buf.view();
      for (index_t j = 0; j < M; ++j)
        for (index_t d = 0; d < D; ++d) {
          B(j, d) = s.b(j, d);
          if (lengthscales) B(j, D + d) = s.b(j, d) * s.b(j, d);
        }
      blas::gemm(blas::Trans::No, blas::Trans::No, 1.0, W, B, 0.0, WB);
      if (lengthscales) {
        std::vector<double> total(D, 0.0);
        for (index_t i = 0; i < N; ++i)
          for (index_t d = 0; d < D; ++d) {
            const double a = s.a(i, d);
            total[d] += a * a * row_w[i] - 2.0 * a * WB(i, d) + WB(i, D + d);
          }
        for (index_t d = 0; d < D; ++d)
          dparams[offset_ + 1 + (ard_ ? d : 0)] += -2.0 * inv_lengthscale_[d] * total[d];
      }
      if (dX != nullptr)
        for (index_t i = 0; i < N; ++i)
          for (index_t d = 0; d < D; ++d)
            (*dX)(i, d) += 2.0 * inv_lengthscale_[d] * (s.a(i, d) * row_w[i] - WB(i, d));
    }
    if (dX2 != nullptr) {
      // WA = W^T [a, 1]; its last column holds the column sums C.
      Matrix A_buf(N, D + 1), WA_buf(M, D + 1);
      const MatrixView A = A_buf.view(), WA = WA_buf.view();
      for (index_t i = 0; i < N; ++i) {
        for (index_t d = 0; d < D; ++d) A(i, d) = s.a(i, d);
        A(i, D) = 1.0;
      }
      blas::gemm(blas::Trans::Yes, blas::Trans::No, 1.0, W, A, 0.0, WA);
      for (index_t j = 0; j < M; ++j)
        for (index_t d = 0; d < D; ++d)
          (*dX2)(j, d) += 2.0 * inv_lengthscale_[d] * (s.b(j, d) * WA(j, D) - WA(j, d));
    }
  }

  // contract's gradients from the differences a_id - b_jd themselves, for inputs far from their
  // mean (ScaledPair::expansion_inexact), with bT = b^T. Entries with W_ij = 0 add nothing, also
  // where a_id - b_jd overflows. One thread: only such inputs come here.
  void contract_direct(const ScaledPair& s, ConstMatrixView bT, ConstMatrixView W, bool lengthscales,
                       double* dparams, MatrixView* dX, MatrixView* dX2) const {
    const index_t N = W.rows, M = W.cols, D = s.a.cols;
    std::vector<double> wd2(static_cast<std::size_t>(D), 0.0);  // sum_ij W_ij (a_id - b_jd)^2
    Matrix dX2T_buf(dX2 != nullptr ? D : 0, M);                 // sum_i W_ij (a_id - b_jd)
    const MatrixView dX2T = dX2T_buf.view();
    if (dX2 != nullptr) std::fill(dX2T.data, dX2T.data + D * M, 0.0);
    for (index_t i = 0; i < N; ++i) {
      const double* w = W.row(i);
      for (index_t d = 0; d < D; ++d) {
        const double a = s.a(i, d);
        const double* b = bT.row(d);
        double* col = dX2 != nullptr ? dX2T.row(d) : nullptr;
        double sum = 0.0, sum2 = 0.0;
#pragma omp simd reduction(+ : sum, sum2)
        for (index_t j = 0; j < M; ++j) {
          const double diff = a - b[j];
          const double t = w[j] == 0.0 ? 0.0 : w[j] * diff;
          sum += t;
          sum2 += w[j] == 0.0 ? 0.0 : t * diff;
          if (col != nullptr) col[j] += t;
        }
        wd2[d] += sum2;
        if (dX != nullptr) (*dX)(i, d) += 2.0 * inv_lengthscale_[d] * sum;
      }
    }
    if (lengthscales)
      for (index_t d = 0; d < D; ++d)
        dparams[offset_ + 1 + (ard_ ? d : 0)] += -2.0 * inv_lengthscale_[d] * wd2[d];
    if (dX2 != nullptr)
      for (index_t j = 0; j < M; ++j)
        for (index_t d = 0; d < D; ++d) (*dX2)(j, d) -= 2.0 * inv_lengthscale_[d] * dX2T(d, j);
  }

  index_t offset_;
  double variance_;
  bool ard_;                             // one lengthscale per dimension (else one shared)
  std::vector<double> inv_lengthscale_;  // [D], 1 / l_d
};


// ---- Linear: k = sum_d v_d x_d x2_d = a.b with a = x o sqrt(v), b = x2 o sqrt(v) ----

class Linear final : public Node {
 public:
  Linear(const LeafParams& p, index_t D)
      : offset_(p.offset),
        ard_(p.values.size() > 1),
        variance_(per_dimension(p.values.data(), static_cast<index_t>(p.values.size()), D)),
        no_shift_(static_cast<std::size_t>(D), 0.0) {
    for (double v : variance_) sqrt_variance_.push_back(std::sqrt(v));
  }

  void K(const Inputs& in, MatrixView out) const override {
    const Matrix a = scale_columns(in.X, no_shift_, sqrt_variance_);
    if (in.same) {
      cross_product(a.view(), a.view(), true, 1.0, out);
      linalg::mirror_lower(out);
    } else {
      const Matrix b = scale_columns(in.X2, no_shift_, sqrt_variance_);
      cross_product(a.view(), b.view(), false, 1.0, out);
    }
  }

  void Kdiag(ConstMatrixView X, double* out) const override {
    for_each_row(X.rows, X.cols, false, [&](index_t i, index_t D) {
      double s = 0.0;
      for (index_t d = 0; d < D; ++d) s += variance_[d] * X(i, d) * X(i, d);
      out[i] = s;
    });
  }

  // With GX2 = G X2 [N, D]: dv_d = sum_i X_id GX2_id, dX = GX2 o v, dX2 = (G^T X) o v.
  // The O((N + M) D) loops are too small to be worth threads.
  void K_vjp(const Inputs& in, ConstMatrixView G, double* dparams, MatrixView* dX,
             MatrixView* dX2) const override {
    const index_t N = in.X.rows, M = in.X2.rows, D = in.X.cols;
    Matrix GX2_buf(N, D);
    const MatrixView GX2 = GX2_buf.view();
    blas::gemm(blas::Trans::No, blas::Trans::No, 1.0, G, in.X2, 0.0, GX2);
    std::vector<double> total(static_cast<std::size_t>(D), 0.0);
    for (index_t i = 0; i < N; ++i)
      for (index_t d = 0; d < D; ++d) total[d] += in.X(i, d) * GX2(i, d);
    accumulate_variance_gradient(total, dparams);
    if (dX != nullptr)
      for (index_t i = 0; i < N; ++i)
        for (index_t d = 0; d < D; ++d) (*dX)(i, d) += variance_[d] * GX2(i, d);
    if (dX2 != nullptr) {
      Matrix GtX_buf(M, D);
      const MatrixView GtX = GtX_buf.view();
      blas::gemm(blas::Trans::Yes, blas::Trans::No, 1.0, G, in.X, 0.0, GtX);
      for (index_t j = 0; j < M; ++j)
        for (index_t d = 0; d < D; ++d) (*dX2)(j, d) += variance_[d] * GtX(j, d);
    }
  }

  void Kdiag_vjp(ConstMatrixView X, const double* g, double* dparams) const override {
    std::vector<double> total(static_cast<std::size_t>(X.cols), 0.0);
    for (index_t i = 0; i < X.rows; ++i)
      for (index_t d = 0; d < X.cols; ++d) total[d] += g[i] * X(i, d) * X(i, d);
    accumulate_variance_gradient(total, dparams);
  }

 private:
  // total[d] = sum G o dK/dv_d; a shared variance gets the sum over d.
  void accumulate_variance_gradient(const std::vector<double>& total, double* dparams) const {
    if (ard_)
      for (std::size_t d = 0; d < total.size(); ++d) dparams[offset_ + d] += total[d];
    else
      dparams[offset_] += ordered_sum(total);
  }

  index_t offset_;
  bool ard_;
  std::vector<double> variance_;  // [D]
  std::vector<double> sqrt_variance_;
  std::vector<double> no_shift_;  // zeros: the linear kernel is not shift invariant
};

// Fills out with `value`, then sets its diagonal to `diagonal` when `with_diagonal`.
void fill(MatrixView out, double value, bool with_diagonal, double diagonal) {
  for_each_row(out.rows, out.cols, false, [&](index_t i, index_t end) {
    double* o = out.row(i);
    std::fill(o, o + end, value);
    if (with_diagonal && i < end) o[i] = diagonal;
  });
}

// ---- Constant: k = variance ----

class Constant final : public Node {
 public:
  explicit Constant(const LeafParams& p) : offset_(p.offset), variance_(p.values[0]) {}

  void K(const Inputs&, MatrixView out) const override { fill(out, variance_, false, 0.0); }
  void Kdiag(ConstMatrixView X, double* out) const override {
    std::fill(out, out + X.rows, variance_);
  }
  void K_vjp(const Inputs&, ConstMatrixView G, double* dparams, MatrixView*,
             MatrixView*) const override {
    std::vector<double> row_sum(static_cast<std::size_t>(G.rows));
    for_each_row(G.rows, G.cols, false, [&](index_t i, index_t end) {
      row_sum[i] = vector_sum(G.row(i), end);
    });
    dparams[offset_] += ordered_sum(row_sum);
  }
  void Kdiag_vjp(ConstMatrixView X, const double* g, double* dparams) const override {
    dparams[offset_] += vector_sum(g, X.rows);
  }

 private:
  index_t offset_;
  double variance_;
};

// ---- White: k = variance * [same and i == j] ----

class White final : public Node {
 public:
  explicit White(const LeafParams& p) : offset_(p.offset), variance_(p.values[0]) {}

  void K(const Inputs& in, MatrixView out) const override { fill(out, 0.0, in.same, variance_); }
  void Kdiag(ConstMatrixView X, double* out) const override {
    std::fill(out, out + X.rows, variance_);
  }
  void K_vjp(const Inputs& in, ConstMatrixView G, double* dparams, MatrixView*,
             MatrixView*) const override {
    if (!in.same) return;
    double trace = 0.0;
    for (index_t i = 0; i < G.rows; ++i) trace += G(i, i);
    dparams[offset_] += trace;
  }
  void Kdiag_vjp(ConstMatrixView X, const double* g, double* dparams) const override {
    dparams[offset_] += vector_sum(g, X.rows);
  }

 private:
  index_t offset_;
  double variance_;
};

// ---- Sum and Product of children ----

using Children = std::vector<std::unique_ptr<Node>>;

// out = out + other (Sum) or out o other (Product), elementwise.
template <bool kMultiply>
void combine(MatrixView out, ConstMatrixView other) {
  for_each_row(out.rows, out.cols, false, [&](index_t i, index_t end) {
    double* o = out.row(i);
    const double* x = other.row(i);
    for (index_t j = 0; j < end; ++j) o[j] = kMultiply ? o[j] * x[j] : o[j] + x[j];
  });
}

template <bool kMultiply>
void combine(double* out, const double* other, index_t n) {
  for (index_t i = 0; i < n; ++i) out[i] = kMultiply ? out[i] * other[i] : out[i] + other[i];
}

// K and Kdiag of a Sum or Product: the first child writes, the others are combined in.
template <bool kMultiply>
void combined_K(const Children& children, const Inputs& in, MatrixView out) {
  children[0]->K(in, out);
  if (children.size() == 1) return;
  Matrix other(out.rows, out.cols);
  for (std::size_t c = 1; c < children.size(); ++c) {
    children[c]->K(in, other.view());
    combine<kMultiply>(out, other.view());
  }
}

template <bool kMultiply>
void combined_Kdiag(const Children& children, ConstMatrixView X, double* out) {
  children[0]->Kdiag(X, out);
  std::vector<double> other(static_cast<std::size_t>(X.rows));
  for (std::size_t c = 1; c < children.size(); ++c) {
    children[c]->Kdiag(X, other.data());
    combine<kMultiply>(out, other.data(), X.rows);
  }
}

class Sum final : public Node {
 public:
  explicit Sum(Children children) : children_(std::move(children)) {}

  void K(const Inputs& in, MatrixView out) const override { combined_K<false>(children_, in, out); }
  void Kdiag(ConstMatrixView X, double* out) const override {
    combined_Kdiag<false>(children_, X, out);
  }
  void K_vjp(const Inputs& in, ConstMatrixView G, double* dparams, MatrixView* dX,
             MatrixView* dX2) const override {
    for (const auto& child : children_) child->K_vjp(in, G, dparams, dX, dX2);
  }
  void Kdiag_vjp(ConstMatrixView X, const double* g, double* dparams) const override {
    for (const auto& child : children_) child->Kdiag_vjp(X, g, dparams);
  }

 private:
  Children children_;
};

// The adjoint of child c is G o (product of the other children's K), with every child's K
// evaluated once.
class Product final : public Node {
 public:
  explicit Product(Children children) : children_(std::move(children)) {}

  void K(const Inputs& in, MatrixView out) const override { combined_K<true>(children_, in, out); }
  void Kdiag(ConstMatrixView X, double* out) const override {
    combined_Kdiag<true>(children_, X, out);
  }

  void K_vjp(const Inputs& in, ConstMatrixView G, double* dparams, MatrixView* dX,
             MatrixView* dX2) const override {
    const index_t N = G.rows, M = G.cols;
    std::vector<Matrix> Ks;
    Ks.reserve(children_.size());
    for (const auto& child : children_) {
      Ks.emplace_back(N, M);
      child->K(in, Ks.back().view());
    }
    Matrix Gc_buf(N, M);
    const MatrixView Gc = Gc_buf.view();
    for (std::size_t c = 0; c < children_.size(); ++c) {
      for_each_row(N, M, false, [&](index_t i, index_t end) {
        double* out = Gc.row(i);
        std::copy(G.row(i), G.row(i) + end, out);
        for (std::size_t o = 0; o < Ks.size(); ++o) {
          if (o == c) continue;
          const double* k = Ks[o].view().row(i);
          for (index_t j = 0; j < end; ++j) out[j] *= k[j];
        }
      });
      children_[c]->K_vjp(in, Gc, dparams, dX, dX2);
    }
  }

  void Kdiag_vjp(ConstMatrixView X, const double* g, double* dparams) const override {
    const index_t N = X.rows;
    std::vector<std::vector<double>> diags;
    for (const auto& child : children_) {
      diags.emplace_back(static_cast<std::size_t>(N));
      child->Kdiag(X, diags.back().data());
    }
    std::vector<double> gc(static_cast<std::size_t>(N));
    for (std::size_t c = 0; c < children_.size(); ++c) {
      std::copy(g, g + N, gc.begin());
      for (std::size_t o = 0; o < diags.size(); ++o)
        if (o != c) combine<true>(gc.data(), diags[o].data(), N);
      children_[c]->Kdiag_vjp(X, gc.data(), dparams);
    }
  }

 private:
  Children children_;
};

// ---------------------------------------------------------------------------------------
// Parsing the description (layout in kernels.hpp)
// ---------------------------------------------------------------------------------------

const char* type_name(std::int32_t type) {
  static const char* const names[] = {"RBF",      "Matern12", "Matern32", "Matern52", "Linear",
                                      "Constant", "White",    "Sum",      "Product"};
  return names[type];
}

// "kernel codes[at]: ", the prefix of the parser's error messages.
struct Where {
  index_t at;
};
std::ostream& operator<<(std::ostream& os, Where w) { return os << "kernel codes[" << w.at << "]: "; }

class Parser {
 public:
  Parser(const std::int32_t* codes, index_t n_codes, const double* params, index_t n_params,
         index_t input_dim)
      : codes_(codes), n_codes_(n_codes), params_(params), n_params_(n_params), D_(input_dim) {}

  std::unique_ptr<Node> parse() {
    auto root = node(0);
    require(pos_ == n_codes_, "kernel codes: ", n_codes_ - pos_,
            " entries are left after the kernel ends at codes[", pos_, "]");
    require(param_pos_ == n_params_, "kernel params: got ", n_params_, " values but the kernel uses ",
            param_pos_);
    return root;
  }

 private:
  std::unique_ptr<Node> node(int depth) {
    require(depth <= kMaxDepth,
            "kernel codes: nesting deeper than ", kMaxDepth, " levels");
    require(pos_ + 2 <= n_codes_, "kernel codes: node at codes[", pos_,
            "] is cut off (each node takes two entries: type, count)");
    const index_t at = pos_;
    const std::int32_t type = codes_[pos_], count = codes_[pos_ + 1];
    pos_ += 2;
    const Where where{at};
    require(type >= 0 && type <= static_cast<std::int32_t>(KernelType::Product),
            where, "unknown kernel type ", type, " (expected 0..", static_cast<int>(KernelType::Product),
            ")");
    const char* name = type_name(type);
    switch (static_cast<KernelType>(type)) {
      case KernelType::Sum:
      case KernelType::Product: {
        require(count >= 1,
                where, name, " needs at least one child, got ", count);
        Children children;
        for (std::int32_t c = 0; c < count; ++c) children.push_back(node(depth + 1));
        if (static_cast<KernelType>(type) == KernelType::Sum)
          return std::make_unique<Sum>(std::move(children));
        return std::make_unique<Product>(std::move(children));
      }
      case KernelType::RBF:
        return stationary<KernelType::RBF>(where, name, count);
      case KernelType::Matern12:
        return stationary<KernelType::Matern12>(where, name, count);
      case KernelType::Matern32:
        return stationary<KernelType::Matern32>(where, name, count);
      case KernelType::Matern52:
        return stationary<KernelType::Matern52>(where, name, count);
      case KernelType::Linear:
        require(count == 1 || count == D_,
                where, "Linear takes 1 variance or one per dimension (", D_, "), got ", count, " parameters");
        return std::make_unique<Linear>(take(where, name, count), D_);
      case KernelType::Constant:
        return std::make_unique<Constant>(variance_only(where, name, count));
      case KernelType::White:
        return std::make_unique<White>(variance_only(where, name, count));
    }
    throw std::invalid_argument("kernel codes: unknown kernel type");  // unreachable: type checked above
  }

  template <KernelType T>
  std::unique_ptr<Node> stationary(Where where, const char* name, std::int32_t count) {
    require(count == 2 || count == 1 + D_,
            where, name, " takes a variance and 1 lengthscale or one per dimension (", D_, "), i.e. 2 or ",
            1 + D_, " parameters; got ", count);
    return std::make_unique<Stationary<T>>(take(where, name, count), D_);
  }

  LeafParams variance_only(Where where, const char* name, std::int32_t count) {
    require(count == 1,
            where, name, " takes 1 parameter (variance), got ", count);
    return take(where, name, count);
  }

  // The next `count` parameters, each finite and > 0.
  LeafParams take(Where where, const char* name, std::int32_t count) {
    require(param_pos_ + count <= n_params_,
            where, name, " needs params[", param_pos_, "..", param_pos_ + count - 1, "] but params has only ",
            n_params_, " values");
    const double* first = params_ + param_pos_;
    LeafParams p{param_pos_, std::vector<double>(first, first + count)};
    for (index_t k = 0; k < count; ++k)
      require(std::isfinite(p.values[k]) && p.values[k] > 0.0,
              "kernel params[", param_pos_ + k, "] (", name, ") must be finite and > 0, got ", p.values[k]);
    param_pos_ += count;
    return p;
  }

  const std::int32_t* codes_;
  index_t n_codes_;
  const double* params_;
  index_t n_params_;
  index_t D_;
  index_t pos_ = 0;
  index_t param_pos_ = 0;
};

void check_inputs(const Inputs& in, index_t D) {
  require(in.X.cols == D, "X has ", in.X.cols, " columns but the kernel was built for input_dim ", D);
  require(in.X2.cols == D, "X2 has ", in.X2.cols, " columns but the kernel was built for input_dim ", D);
  require(!in.same || in.X2.rows == in.X.rows, "same=true needs X2 to be X");
  if (in.distances != nullptr) {
    require(!in.same, "squared distances are for two different inputs, not K(X, X)");
    require(in.distances->rows() == in.X.rows && in.distances->cols() == in.X2.rows, "the squared distances are [",
            in.distances->rows(), ", ", in.distances->cols(), "] for inputs of ", in.X.rows, " and ", in.X2.rows,
            " rows");
  }
}

// "[rows, cols]" in error messages.
struct Shape {
  index_t rows, cols;
};
std::ostream& operator<<(std::ostream& os, Shape s) { return os << "[" << s.rows << ", " << s.cols << "]"; }

void check_shape(const char* name, index_t rows, index_t cols, index_t want_rows,
                 index_t want_cols) {
  require(rows == want_rows && cols == want_cols, name, " has shape ", Shape{rows, cols}, ", expected ",
          Shape{want_rows, want_cols});
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Kernel
// ---------------------------------------------------------------------------------------

Kernel::Kernel(const std::int32_t* codes, index_t n_codes, const double* params, index_t n_params,
               index_t input_dim)
    : num_params_(n_params), input_dim_(input_dim) {
  require(input_dim >= 1, "kernel input_dim must be >= 1, got ", input_dim);
  root_ = Parser(codes, n_codes, params, n_params, input_dim).parse();
}

Kernel::~Kernel() = default;
Kernel::Kernel(Kernel&&) noexcept = default;
Kernel& Kernel::operator=(Kernel&&) noexcept = default;

index_t Kernel::num_params() const { return num_params_; }
index_t Kernel::input_dim() const { return input_dim_; }

void Kernel::K(ConstMatrixView X, ConstMatrixView X2, bool same, MatrixView out,
               const SquaredDistances* distances) const {
  const Inputs in{X, X2, same, distances};
  check_inputs(in, input_dim_);
  check_shape("K output", out.rows, out.cols, X.rows, X2.rows);
  if (X.rows == 0 || X2.rows == 0) return;
  root_->K(in, out);
}

void Kernel::Kdiag(ConstMatrixView X, double* out) const {
  check_inputs(Inputs{X, X, true}, input_dim_);
  if (X.rows == 0) return;
  root_->Kdiag(X, out);
}

void Kernel::K_vjp(ConstMatrixView X, ConstMatrixView X2, bool same, ConstMatrixView G,
                   double* dparams, MatrixView* dX, MatrixView* dX2, const SquaredDistances* distances) const {
  K_vjp(X, X2, same, G, ConstMatrixView(), dparams, dX, dX2, distances);
}

void Kernel::K_vjp(ConstMatrixView X, ConstMatrixView X2, bool same, ConstMatrixView G,
                   ConstMatrixView values, double* dparams, MatrixView* dX, MatrixView* dX2,
                   const SquaredDistances* distances) const {
  const Inputs in{X, X2, same, distances};
  const bool have_values = values.data != nullptr;
  check_inputs(in, input_dim_);
  check_shape("G", G.rows, G.cols, X.rows, X2.rows);
  if (have_values) check_shape("K values", values.rows, values.cols, X.rows, X2.rows);
  if (dX != nullptr) check_shape("dX", dX->rows, dX->cols, X.rows, X.cols);
  if (dX2 != nullptr) check_shape("dX2", dX2->rows, dX2->cols, X2.rows, X2.cols);
  if (X.rows == 0 || X2.rows == 0) return;
  if (!(have_values && root_->K_vjp_from_values(in, G, values, dparams, dX, dX2)))
    root_->K_vjp(in, G, dparams, dX, dX2);
}

void Kernel::Kdiag_vjp(ConstMatrixView X, const double* g, double* dparams) const {
  check_inputs(Inputs{X, X, true}, input_dim_);
  if (X.rows == 0) return;
  root_->Kdiag_vjp(X, g, dparams);
}

}  // namespace pygpfast::kernels
