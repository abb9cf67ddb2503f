// Greedy selection of the joint multi-class IVM: the stub buffers M^(c), Q^(c), their update
// per inclusion (notes/ivm-math.md section 2.3), scoring by information gain (section 2.6) and
// the selection index J of seed Algorithm 1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "pygpfast/blas.hpp"
#include "pygpfast/errors.hpp"
#include "pygpfast/ivm/multiclass.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/vmath.hpp"
#include "small_dense.hpp"

namespace pygpfast::ivm {

namespace {

// xoshiro256** seeded through splitmix64: the same stream on every platform.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    for (auto& s : s_) {
      seed += 0x9E3779B97F4A7C15ULL;
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
      s = z ^ (z >> 31);
    }
  }
  std::uint64_t next() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform on [0, n) without modulo bias (rejection).
  index_t below(index_t n) {
    const std::uint64_t un = static_cast<std::uint64_t>(n);
    const std::uint64_t limit = std::numeric_limits<std::uint64_t>::max() - std::numeric_limits<std::uint64_t>::max() % un;
    std::uint64_t r;
    do r = next();
    while (r >= limit);
    return static_cast<index_t>(r % un);
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Columns per task of the stub pass: the task's accumulators, C (C + 2) + C (C + 1) / 2 rows of
// kColumnBlock doubles (25 KB at C = 5), stay in a core's L1.
constexpr index_t kColumnBlock = 64;

// out[t] -= sum_k x[k] rows[k ld + t] for t < nb (k < dd): one column block of M^T x, each
// column summed over k in order whatever the block and thread.
PYGPFAST_SIMD_CLONES void stub_rows_times(index_t dd, index_t nb, const double* rows, index_t ld, const double* x,
                                          double* out) {
  for (index_t k = 0; k < dd; ++k) {
    const double xk = x[k];
    const double* row = rows + k * ld;
#pragma omp simd
    for (index_t t = 0; t < nb; ++t) out[t] -= xk * row[t];
  }
}

// What the stub pass of one inclusion reads and writes (Stubs::include, steps 4 and 5b).
struct StubPass {
  int C;
  index_t n, dmax, dd;
  double* const* Q;      // [C] -> buffers in column blocks (Stubs::Q)
  const double* s;       // [C, n] s_c = K^(c)_{.,i} - M^(c)T m_c
  const double* nuv;     // [C, dd] nu_c v_c
  const double* u;       // [dd] the mean step's coefficients
  const double* r;       // [dd] the new row's coefficients
  const double* w;       // [C, dd] the factors Lambda_k: w_k,
  const double* inv_delta;  //    1 / delta_k,
  const double* gamma;      //    gamma_k
  const double* nu;      // [C]
  double inv_rho;
  double* h;             // [C, n] means
  double* a0;            // [C, n] uncoupled variances
  double* A;             // [n, C, C] marginal covariances
};

// Eight doubles, one AVX-512 register (two AVX2 ones, four SSE2 ones in the baseline clone):
// GCC's vector extension, elementwise IEEE arithmetic. (GCC notes that passing such a vector by
// value has another ABI without AVX-512: these helpers are inlined into this file's functions
// and never cross a call boundary; the note is silenced down to stub_pass_block.)
using Lanes = double __attribute__((vector_size(64)));
constexpr index_t kLanes = 8;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
[[gnu::always_inline]] inline Lanes load_lanes(const double* p) {
  Lanes v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline void store_lanes(double* p, const Lanes& v) { __builtin_memcpy(p, &v, sizeof v); }

// stub_pass_block's arithmetic for a compile-time C, eight columns at a time with every
// accumulator in a register: the class's row runs through its C factors, the means' and the new
// row's sums and the marginal covariances' pair sums (pairs (c, e <= c), from the rows of the
// classes e < c updated earlier in the same step j) without a store between. The same operations
// in the same order per column as the general loop below (bitwise the same results); nb a
// multiple of kLanes.
template <int C>
[[gnu::always_inline]] inline void stub_pass_lanes(const StubPass& a, index_t j0, index_t nb) {
  constexpr int kPairs = C * (C + 1) / 2;
  const index_t n = a.n, dd = a.dd, base = j0 * a.dmax;
  for (index_t t0 = 0; t0 < nb; t0 += kLanes) {
    Lanes G[kPairs];
    for (auto& g : G) g = Lanes{};
    for (int c = 0; c < C; ++c) {
      const Lanes sc = load_lanes(a.s + c * n + j0 + t0);
      Lanes acc[C];
      for (auto& v : acc) v = Lanes{};
      Lanes hc{}, rc{};
      double* qc = a.Q[c] + base + t0;
      const double* nuv = a.nuv + c * dd;
      const int p0 = c * (c + 1) / 2;
      for (index_t j = 0; j < dd; ++j) {
        double* row = qc + j * kColumnBlock;
        Lanes x = load_lanes(row);
        hc += a.u[j] * x;
        x -= nuv[j] * sc;
        for (int k = 0; k < C; ++k) {
          const index_t kj = k * dd + j;
          x = (x - a.w[kj] * acc[k]) * a.inv_delta[kj];
          acc[k] += a.gamma[kj] * x;
        }
        rc += a.r[j] * x;
        store_lanes(row, x);
        for (int e = 0; e < c; ++e) G[p0 + e] += x * load_lanes(a.Q[e] + base + t0 + j * kColumnBlock);
        G[p0 + c] += x * x;
      }
      const double nuc = a.nu[c];
      store_lanes(qc + dd * kColumnBlock, (nuc * sc - rc) * a.inv_rho);
      double* h = a.h + c * n + j0 + t0;
      store_lanes(h, load_lanes(h) + hc);
      double* a0 = a.a0 + c * n + j0 + t0;
      store_lanes(a0, load_lanes(a0) - nuc * sc * sc);
    }
    // A_j = diag a0_j + sum over the old rows (G) + the new row's outer product
    constexpr index_t CC = static_cast<index_t>(C) * C;
    double* Aj = a.A + (j0 + t0) * CC;
    for (int c = 0; c < C; ++c) {
      const Lanes qc = load_lanes(a.Q[c] + base + t0 + dd * kColumnBlock);
      const Lanes a0 = load_lanes(a.a0 + c * n + j0 + t0);
      for (int e = 0; e <= c; ++e) {
        const Lanes qe = load_lanes(a.Q[e] + base + t0 + dd * kColumnBlock);
        const Lanes v = (c == e ? a0 : Lanes{}) + (G[c * (c + 1) / 2 + e] + qc * qe);
        for (index_t t = 0; t < kLanes; ++t) Aj[t * CC + c * C + e] = Aj[t * CC + e * C + c] = v[t];
      }
    }
  }
}

// The pass over columns j0..j0 + nb of every class's Q (note 2.3, steps 4 and 5b): the old
// rows become Lambda^-1 (Q^(c) - nu_c v_c s_c^T), the new row (nu_c s_c - Q'^(c)T r) / rho, and
// the same pass reads Q^(c)T u (old rows) for the means and sums the marginal covariances
// A_j = diag a0_j + sum_k q_kj q_kj^T from the new rows while they are in cache, so that the
// scoring reads A_j instead of gathering C d strided stub entries per candidate. Each column's
// arithmetic is the same whatever the block and the thread: the result does not depend on the
// thread count. Compiled per instruction set; for 3 to 8 classes (and blocks of whole lanes) by
// stub_pass_lanes, otherwise by the loops below (the loops over t are the vector loops: each
// accumulator a row of nb doubles in the scratch, loaded and stored once per factor).
PYGPFAST_SIMD_CLONES void stub_pass_block(const StubPass& a, index_t j0, index_t nb, double* scratch) {
  if (nb % kLanes == 0) switch (a.C) {
      case 3: return stub_pass_lanes<3>(a, j0, nb);
      case 4: return stub_pass_lanes<4>(a, j0, nb);
      case 5: return stub_pass_lanes<5>(a, j0, nb);
      case 6: return stub_pass_lanes<6>(a, j0, nb);
      case 7: return stub_pass_lanes<7>(a, j0, nb);
      case 8: return stub_pass_lanes<8>(a, j0, nb);
      default: break;
    }
  const int C = a.C;
  const index_t n = a.n, dd = a.dd, pairs = static_cast<index_t>(C) * (C + 1) / 2;
  double* acc = scratch;          // [C, C, nb]: class c, factor k
  double* hacc = acc + C * C * nb;  // [C, nb]
  double* racc = hacc + C * nb;   // [C, nb]
  double* G = racc + C * nb;      // [pairs, nb]: (c, e <= c) in row order
  std::fill(scratch, G + pairs * nb, 0.0);
  for (index_t j = 0; j < dd; ++j) {
    const double uj = a.u[j], rj = a.r[j];
    for (int c = 0; c < C; ++c) {
      double* row = a.Q[c] + (j0 * a.dmax + j * kColumnBlock);
      const double* sc = a.s + c * n + j0;
      const double vj = a.nuv[c * dd + j];
      double* hc = hacc + c * nb;
#pragma omp simd
      for (index_t t = 0; t < nb; ++t) {
        hc[t] += uj * row[t];
        row[t] -= vj * sc[t];
      }
      for (int k = 0; k < C; ++k) {
        const double wkj = a.w[k * dd + j], inv = a.inv_delta[k * dd + j], gkj = a.gamma[k * dd + j];
        double* ak = acc + (c * C + k) * nb;
#pragma omp simd
        for (index_t t = 0; t < nb; ++t) {
          const double x = (row[t] - wkj * ak[t]) * inv;
          row[t] = x;
          ak[t] += gkj * x;
        }
      }
      double* rc = racc + c * nb;
#pragma omp simd
      for (index_t t = 0; t < nb; ++t) rc[t] += rj * row[t];
    }
    double* g = G;
    for (int c = 0; c < C; ++c) {
      const double* qc = a.Q[c] + (j0 * a.dmax + j * kColumnBlock);
      for (int e = 0; e <= c; ++e, g += nb) {
        const double* qe = a.Q[e] + (j0 * a.dmax + j * kColumnBlock);
#pragma omp simd
        for (index_t t = 0; t < nb; ++t) g[t] += qc[t] * qe[t];
      }
    }
  }
  for (int c = 0; c < C; ++c) {
    double* qrow = a.Q[c] + (j0 * a.dmax + dd * kColumnBlock);
    const double* sc = a.s + c * n + j0;
    const double* rc = racc + c * nb;
    const double* hc = hacc + c * nb;
    double* h = a.h + c * n + j0;
    double* a0 = a.a0 + c * n + j0;
    const double nuc = a.nu[c];
#pragma omp simd
    for (index_t t = 0; t < nb; ++t) {
      h[t] += hc[t];
      qrow[t] = (nuc * sc[t] - rc[t]) * a.inv_rho;
      a0[t] -= nuc * sc[t] * sc[t];
    }
  }
  const index_t CC = static_cast<index_t>(C) * C;
  double* g = G;
  for (int c = 0; c < C; ++c) {
    const double* qc = a.Q[c] + (j0 * a.dmax + dd * kColumnBlock);
    for (int e = 0; e <= c; ++e, g += nb) {
      const double* qe = a.Q[e] + (j0 * a.dmax + dd * kColumnBlock);
      const double* a0 = a.a0 + c * n + j0;
      double* Aj = a.A + j0 * CC;
      for (index_t t = 0; t < nb; ++t) {
        const double v = (c == e ? a0[t] : 0.0) + (g[t] + qc[t] * qe[t]);
        Aj[t * CC + c * C + e] = v;
        Aj[t * CC + e * C + c] = v;
      }
    }
  }
}

#pragma GCC diagnostic pop

// The representation and the stub buffers of the selection (note 2.2): M and Q in column blocks
// (below), the rest row-major.
struct Stubs {
  index_t n, dmax;
  int C;
  index_t d = 0;
  // Per class: L [dmax, dmax]; M and Q [dmax, n] stored in column blocks, each block's rows
  // contiguous (row k of block b, columns b nb..b nb + nb - 1, at (b dmax + k) nb with nb =
  // kColumnBlock; at(k, j)): the passes over them stream through one block at a time, where
  // rows n doubles apart cost a cache miss per row.
  std::vector<std::vector<double>> M, Q, L;
  std::vector<double> R;                     // [dmax, dmax] lower, R R^T = Gamma
  std::vector<double> a0, h;                 // [C, n]: diag A^(c) (uncoupled part), means
  std::vector<double> A;                     // [n, C, C]: marginal covariances, kept by the pass
  std::vector<double> pi;                    // [dmax, C]
  std::vector<index_t> active;

  Stubs(index_t n_, index_t dmax_, int C_) : n(n_), dmax(dmax_), C(C_) {
    const std::size_t blocked = static_cast<std::size_t>(dmax * ((n + kColumnBlock - 1) / kColumnBlock) * kColumnBlock);
    M.assign(C, std::vector<double>(blocked));
    Q.assign(C, std::vector<double>(blocked));
    L.assign(C, std::vector<double>(static_cast<std::size_t>(dmax * dmax), 0.0));
    R.assign(static_cast<std::size_t>(dmax * dmax), 0.0);
    a0.assign(static_cast<std::size_t>(C * n), 0.0);
    h.assign(static_cast<std::size_t>(C * n), 0.0);
    A.assign(static_cast<std::size_t>(n * C * C), 0.0);
    pi.assign(static_cast<std::size_t>(dmax * C), 0.0);
  }

  // Offset of entry (k, j) of a blocked stub buffer.
  index_t at(index_t k, index_t j) const { return ((j / kColumnBlock) * dmax + k) * kColumnBlock + j % kColumnBlock; }

  // Sets the marginals of the empty representation from a0 (the kernels' diagonals).
  void start(const std::vector<std::vector<double>>& kdiag) {
    const std::size_t nk = kdiag.size();
    for (int c = 0; c < C; ++c) {
      const auto& kd = kdiag[nk == 1 ? 0 : c];
      std::copy(kd.begin(), kd.end(), a0.begin() + c * n);
      for (index_t j = 0; j < n; ++j) A[(j * C + c) * C + c] = kd[j];
    }
  }

  // h_j [C], A_j [C, C].
  void marginal(index_t j, double* hj, double* Aj) const {
    for (int c = 0; c < C; ++c) hj[c] = h[c * n + j];
    std::copy(A.begin() + j * C * C, A.begin() + (j + 1) * C * C, Aj);
  }

  // Inclusion of point i with site pi_i [C] and mean step kappa [C] (kappa = g after the
  // projection), given the kernel columns kcol[c] = K^(c)(X, x_i) [n] (note 2.3).
  void include(index_t i, const double* pi_i, const double* kappa, const std::vector<const double*>& kcol) {
    const index_t dd = d;
    std::vector<double> s(static_cast<std::size_t>(C * n)), m(static_cast<std::size_t>(C * dd)),
        v(static_cast<std::size_t>(C * dd)), w(static_cast<std::size_t>(C * dd)),
        delta(static_cast<std::size_t>(C * dd)), gamma(static_cast<std::size_t>(C * dd)), nu(C), lam(C),
        u(static_cast<std::size_t>(dd));
    // 1. Binary quantities per class: s_c = K^(c)_{.,i} - M^(c)T M^(c)_{.,i}, the product in
    //    column blocks on the OpenMP threads (a memory-bound GEMV over the C d n stubs of M, which
    //    the BLAS ran on one thread here; stub_rows_times).
    for (int c = 0; c < C; ++c)
      for (index_t k = 0; k < dd; ++k) {
        m[c * dd + k] = M[c][at(k, i)];
        v[c * dd + k] = Q[c][at(k, i)];
      }
    const index_t nblocks = (n + kColumnBlock - 1) / kColumnBlock;
    parallel_for(nblocks * C, 1, [&](index_t task) {
      const int c = static_cast<int>(task / nblocks);
      const index_t j0 = (task % nblocks) * kColumnBlock;
      const index_t nb = std::min(n, j0 + kColumnBlock) - j0;
      double* sc = s.data() + c * n + j0;
      std::copy(kcol[c] + j0, kcol[c] + j0 + nb, sc);
      stub_rows_times(dd, nb, M[c].data() + j0 * dmax, kColumnBlock, m.data() + c * dd, sc);
    });
    for (int c = 0; c < C; ++c) {
      const double a = s[c * n + i];
      lam[c] = std::sqrt(1.0 + pi_i[c] * a);
      nu[c] = pi_i[c] / (lam[c] * lam[c]);
    }
    // 2. Means with the old Q: h^(c) += kappa_c s_c + Q^(c)T u, u = sum_e kappa_e v_e (the product
    //    in step 4's pass over Q, before its rows change).
    std::fill(u.begin(), u.end(), 0.0);
    for (int e = 0; e < C; ++e)
      for (index_t k = 0; k < dd; ++k) u[k] += kappa[e] * v[e * dd + k];
    for (int c = 0; c < C; ++c) {
      double* hc = h.data() + c * n;
      const double* sc = s.data() + c * n;
      for (index_t j = 0; j < n; ++j) hc[j] += kappa[c] * sc[j];
    }
    // 3. Factors Lambda_k (Lambda_k Lambda_k^T = I + w_k w_k^T, w_k = sqrt(nu_k) (Lambda_1..Lambda_{k-1})^{-1} v_k)
    //    with Lambda_jj = delta_j, Lambda_jl = w_j gamma_l (j > l).
    auto apply_inverse = [&](int k, double* x) {  // x <- Lambda_k^{-1} x
      const double* wk = w.data() + k * dd;
      const double* dk = delta.data() + k * dd;
      const double* gk = gamma.data() + k * dd;
      double acc = 0.0;
      for (index_t j = 0; j < dd; ++j) {
        x[j] = (x[j] - wk[j] * acc) / dk[j];
        acc += gk[j] * x[j];
      }
    };
    for (int k = 0; k < C; ++k) {
      double* wk = w.data() + k * dd;
      const double sn = std::sqrt(nu[k]);
      for (index_t j = 0; j < dd; ++j) wk[j] = sn * v[k * dd + j];
      for (int l = 0; l < k; ++l) apply_inverse(l, wk);
      double sigma = 1.0;
      for (index_t j = 0; j < dd; ++j) {
        const double dj = std::sqrt(1.0 + sigma * wk[j] * wk[j]);
        delta[k * dd + j] = dj;
        gamma[k * dd + j] = sigma * wk[j] / dj;
        sigma /= dj * dj;
      }
    }
    //    R'_11 = R Lambda_1 ... Lambda_C, row by row: (x^T Lambda)_l = x_l delta_l + gamma_l sum_{j>l} x_j w_j.
    for (index_t r = 0; r < dd; ++r) {
      double* x = R.data() + r * dmax;
      for (int k = 0; k < C; ++k) {
        const double* wk = w.data() + k * dd;
        const double* dk = delta.data() + k * dd;
        const double* gk = gamma.data() + k * dd;
        double suffix = 0.0;
        for (index_t l = r; l >= 0; --l) {
          const double xl = x[l];
          x[l] = xl * dk[l] + gk[l] * suffix;
          suffix += xl * wk[l];
        }
      }
    }
    // 5a. The new row's coefficients (they need R'_11, not Q): r = R'_11^{-1} (-sum_c nu_c y_c),
    //     y_c = D^(c)_I s_c[I]; rho^2 = sum nu - r^T r.
    std::vector<double> r(static_cast<std::size_t>(dd), 0.0);
    double sum_nu = 0.0;
    for (int c = 0; c < C; ++c) {
      sum_nu += nu[c];
      for (index_t k = 0; k < dd; ++k) r[k] -= nu[c] * pi[k * C + c] * s[c * n + active[k]];
    }
    if (dd > 0)
      blas::trsv(blas::Uplo::Lower, blas::Trans::No, blas::Diag::NonUnit, ConstMatrixView(R.data(), dd, dd, dmax),
                 r.data());
    double rho2 = sum_nu;
    for (index_t k = 0; k < dd; ++k) rho2 -= r[k] * r[k];
    if (!(rho2 > 0.0) || !std::isfinite(rho2))
      throw LinAlgError("ivm.multiclass_select", static_cast<int>(dd + 1),
                        "the coupling factor R lost positive definiteness at inclusion " + std::to_string(dd + 1) +
                            " (rho^2 = " + format_value(rho2) +
                            "); the kernel matrix is too ill-conditioned: add a White kernel or raise the lengthscale's lower bound");
    const double rho = std::sqrt(rho2), inv_rho = 1.0 / rho;
    for (index_t k = 0; k < dd; ++k) R[dd * dmax + k] = r[k];
    R[dd * dmax + dd] = rho;
    // 4. Old rows of Q: Q^(c) <- Lambda^{-1} (Q^(c) - nu_c v_c s_c^T); 5b. new row: q^(c) =
    //    (nu_c s_c - Q'^(c)T r) / rho; with the means' Q^(c)T u (step 2) and the marginal
    //    covariances, in one pass over the buffers in column blocks (stub_pass_block): one read
    //    and one write of them per inclusion (C d n doubles: 64 MB at n = 4000, d = 400, C = 5).
    std::vector<double> nuv(static_cast<std::size_t>(C * dd)), inv_delta(static_cast<std::size_t>(C * dd));
    std::vector<double*> Qp(C);
    for (int c = 0; c < C; ++c) {
      Qp[c] = Q[c].data();
      for (index_t k = 0; k < dd; ++k) nuv[c * dd + k] = nu[c] * v[c * dd + k];
    }
    for (index_t k = 0; k < C * dd; ++k) inv_delta[k] = 1.0 / delta[k];
    const StubPass pass{C, n, dmax, dd, Qp.data(), s.data(), nuv.data(), u.data(), r.data(), w.data(), inv_delta.data(),
                        gamma.data(), nu.data(), inv_rho, h.data(), a0.data(), A.data()};
    const std::size_t scratch_size =
        static_cast<std::size_t>((static_cast<index_t>(C) * (C + 2) + static_cast<index_t>(C) * (C + 1) / 2) * kColumnBlock);
    parallel_for(nblocks, 1, [&](index_t task) {
      thread_local std::vector<double> scratch;
      scratch.resize(scratch_size);
      const index_t j0 = task * kColumnBlock;
      stub_pass_block(pass, j0, std::min(n, j0 + kColumnBlock) - j0, scratch.data());
    });
    // 6. Binary parts: rows of L^(c) and M^(c) (the uncoupled variances a0 are the pass's).
    for (int c = 0; c < C; ++c) {
      double* lrow = L[c].data() + dd * dmax;
      const double sp = std::sqrt(pi_i[c]);
      for (index_t k = 0; k < dd; ++k) lrow[k] = sp * m[c * dd + k];
      lrow[dd] = lam[c];
      const double* sc = s.data() + c * n;
      const double sn = std::sqrt(nu[c]);
      for (index_t j = 0; j < n; ++j) M[c][at(dd, j)] = sn * sc[j];
      pi[dd * C + c] = pi_i[c];
    }
    active.push_back(i);
    d = dd + 1;
  }

  // h [n, C], A [n, C, C] of every point.
  void all_marginals(double* hout, double* Aout) const {
    const index_t CC = static_cast<index_t>(C) * C;
    for (index_t j = 0; j < n; ++j) marginal(j, hout + j * C, Aout + j * CC);
  }
};

// Information gain D[N(h_hat, A_hat) || N(h, A)] of a candidate, or -inf when its moments are
// not valid. status: 0 ok, 1 A_j not positive definite, 2 the primary rule failed (fallback used),
// 3 no rule gave valid moments.
struct Scorer {
  int C;
  const Cubature& primary;
  const Cubature* fallback;
  const double* beta;

  int tilted(int y, const double* hj, const double* Lj, double* mean_hat, double* cov_hat, double* p_cav,
             double* log_Z, std::vector<double>& work) const {
    work.resize(static_cast<std::size_t>(
        std::max(cubature_work_size(primary), fallback ? cubature_work_size(*fallback) : index_t{0})));
    if (softmax_tilted_moments(primary, y, hj, Lj, beta, mean_hat, cov_hat, p_cav, log_Z, work.data())) return 0;
    if (fallback != nullptr &&
        softmax_tilted_moments(*fallback, y, hj, Lj, beta, mean_hat, cov_hat, p_cav, log_Z, work.data()))
      return 2;
    return 3;
  }

  double score(const Stubs& st, index_t j, int y, int& status) const {
    const std::size_t CC = static_cast<std::size_t>(C * C);
    // (per thread, reused: the scoring runs |J| times per inclusion)
    thread_local std::vector<double> hj, Aj, Lj, mh, Ah, Lh, p, col, work;
    for (auto* v : {&hj, &mh, &p, &col}) v->resize(static_cast<std::size_t>(C));
    for (auto* v : {&Aj, &Lj, &Ah, &Lh}) v->resize(CC);
    double log_Z = 0.0;
    st.marginal(j, hj.data(), Aj.data());
    if (!small::cholesky(C, Aj.data(), Lj.data())) {
      status = 1;
      return -HUGE_VAL;
    }
    status = tilted(y, hj.data(), Lj.data(), mh.data(), Ah.data(), p.data(), &log_Z, work);
    if (status == 3) return -HUGE_VAL;
    small::cholesky(C, Ah.data(), Lh.data());
    // tr(A^{-1} A_hat) + (h_hat - h)^T A^{-1} (h_hat - h)
    double tr = 0.0;
    for (int e = 0; e < C; ++e) {
      for (int c = 0; c < C; ++c) col[c] = Ah[c * C + e];
      small::solve_cholesky(C, Lj.data(), col.data());
      tr += col[e];
    }
    for (int c = 0; c < C; ++c) col[c] = mh[c] - hj[c];
    small::solve_lower(C, Lj.data(), col.data());
    double maha = 0.0;
    for (int c = 0; c < C; ++c) maha += col[c] * col[c];
    return 0.5 * (tr - C + maha + small::logdet_cholesky(C, Lj.data()) - small::logdet_cholesky(C, Lh.data()));
  }
};

}  // namespace

Selection multiclass_select(const ClassKernels& kernels, ConstMatrixView X, const double* y, const double* beta,
                            const MulticlassSelectOptions& opt) {
  const int C = opt.num_classes;
  const index_t n = X.rows, d = opt.active_size;
  require(C >= 2, "num_classes must be >= 2, got ", C);
  require(n >= 1, "X must have at least one row");
  require(d >= 1 && d <= n, "active_size must be in [1, n] = [1, ", n, "], got ", d);
  require(opt.n_random >= 0 && opt.n_random <= d, "n_random must be in [0, active_size], got ", opt.n_random);
  require(opt.keep_fraction >= 0.0 && opt.keep_fraction <= 1.0, "keep_fraction must be in [0, 1], got ",
          opt.keep_fraction);
  require(opt.selection_size >= 0, "selection_size must be >= 0 (0: ceil(n / C)), got ", opt.selection_size);
  require(opt.max_newton >= 1, "max_newton must be >= 1, got ", opt.max_newton);
  require(kernels.size() == 1 || kernels.size() == static_cast<std::size_t>(C),
          "give one kernel shared by all classes or one per class (", C, "), got ", kernels.size());
  for (const auto* k : kernels) {
    require(k != nullptr, "null kernel");
    require(k->input_dim() == X.cols, "the kernel expects ", k->input_dim(), " input columns, X has ", X.cols);
  }
  for (index_t j = 0; j < n; ++j) {
    const double v = y[j];
    require(v >= 0.0 && v < C && v == std::floor(v), "y must hold class labels 0..", C - 1, ", got y[", j, "] = ", v);
    for (index_t k = 0; k < X.cols; ++k) require(std::isfinite(X(j, k)), "X has a non-finite entry at (", j, ", ", k, ")");
  }
  for (int c = 0; c < C; ++c) require(std::isfinite(beta[c]), "beta must be finite");

  // The BLAS on one thread: the selection's BLAS calls (the kernel columns' and the d x d
  // factors' small products and solves; the stubs' passes are its own OpenMP loops) are too short
  // to pay for the BLAS's threads, whose spinning on a
  // shared machine competes with the per-point loops' OpenMP threads. Measured on the 2-core
  // machine with one core taken: train5's shape (n = 800, d = 150, C = 5) with 10 L-BFGS-B
  // iterations fitted in 16.7 s with the BLAS on 2 threads, 5.3 s on one (its 14 bound
  // evaluations 13.1 s against 1.8 s). multiclass_bound and multiclass_predict do the same.
  const OneBlasThreadScope blas_on_one_thread;
  const Cubature primary = make_cubature(opt.rule, C);
  Cubature fallback_rule;
  const Cubature* fallback = nullptr;
  if (opt.rule != CubatureRule::GaussHermite3 && C <= kMaxGaussHermite3Dim) {
    fallback_rule = make_cubature(CubatureRule::GaussHermite3, C);
    fallback = &fallback_rule;
  }
  const Scorer scorer{C, primary, fallback, beta};

  const std::size_t nk = kernels.size();
  std::vector<std::vector<double>> kdiag(nk, std::vector<double>(static_cast<std::size_t>(n)));
  for (std::size_t k = 0; k < nk; ++k) kernels[k]->Kdiag(X, kdiag[k].data());
  Stubs st(n, d, C);
  st.start(kdiag);

  Selection out;
  out.n = n;
  out.d = d;
  out.C = C;
  out.pi.resize(static_cast<std::size_t>(d * C));
  out.b.resize(static_cast<std::size_t>(d * C));
  const index_t CC = static_cast<index_t>(C) * C;
  if (opt.record_marginals) {
    out.history_h.resize(static_cast<std::size_t>(d * n * C));
    out.history_A.resize(static_cast<std::size_t>(d * n * CC));
  }

  Rng rng(opt.seed);
  const index_t jsize = opt.selection_size > 0 ? opt.selection_size : (n + C - 1) / C;
  std::vector<char> state(static_cast<std::size_t>(n), 0);  // 0 free, 1 active, 2 in J, 3 skipped
  std::vector<index_t> J, avail;
  std::vector<double> jscore;
  std::vector<int> jstatus;
  std::vector<std::vector<double>> kcol_store(nk, std::vector<double>(static_cast<std::size_t>(n)));
  std::vector<const double*> kcol(C);
  std::vector<double> hi(C), Ai(CC), Li(CC), mh(C), Ah(CC), p(C), pi0(C), work;

  auto free_points = [&]() {
    avail.clear();
    for (index_t j = 0; j < n; ++j)
      if (state[j] == 0) avail.push_back(j);
  };

  for (index_t t = 0; t < d; ++t) {
    auto t0 = std::chrono::steady_clock::now();
    index_t i = -1;
    double log_Z = 0.0;
    double best = std::numeric_limits<double>::quiet_NaN();
    int status = 0;  // of the tilted moments at i (Scorer::tilted)
    if (t < opt.n_random) {
      // A uniform draw among the free points; one whose moments no rule gives (Stroud5 above
      // kMaxGaussHermite3Dim classes) is skipped for good and the draw repeated.
      free_points();
      std::sort(avail.begin(), avail.end());
      for (;;) {
        if (avail.empty())
          throw LinAlgError("ivm.multiclass_select", 1,
                            "no free point had a positive-definite marginal covariance and valid tilted moments at "
                            "inclusion " + std::to_string(t + 1));
        const index_t k = rng.below(static_cast<index_t>(avail.size()));
        i = avail[k];
        st.marginal(i, hi.data(), Ai.data());
        if (!small::cholesky(C, Ai.data(), Li.data()))
          throw LinAlgError("ivm.multiclass_select", 1,
                            "the marginal covariance of point " + std::to_string(i) + " is not positive definite");
        status = scorer.tilted(static_cast<int>(y[i]), hi.data(), Li.data(), mh.data(), Ah.data(), p.data(),
                               &log_Z, work);
        if (status != 3) break;
        ++out.invalid_moments;
        state[i] = 3;
        avail.erase(avail.begin() + k);
      }
      if (status == 2) ++out.quadrature_fallbacks;
    } else {
      if (J.empty()) {  // first greedy round: J at random
        free_points();
        const index_t take = std::min<index_t>(jsize, static_cast<index_t>(avail.size()));
        for (index_t k = 0; k < take; ++k) {
          const index_t r = k + rng.below(static_cast<index_t>(avail.size()) - k);
          std::swap(avail[k], avail[r]);
          J.push_back(avail[k]);
          state[avail[k]] = 2;
        }
      }
      jscore.assign(J.size(), -HUGE_VAL);
      jstatus.assign(J.size(), 0);
      parallel_for(static_cast<index_t>(J.size()), 4, [&](index_t k) {
        jscore[k] = scorer.score(st, J[k], static_cast<int>(y[J[k]]), jstatus[k]);
      });
      index_t best_k = -1;
      for (std::size_t k = 0; k < J.size(); ++k) {
        if (jstatus[k] == 2) ++out.quadrature_fallbacks;
        if (jstatus[k] == 3) ++out.invalid_moments;
        if (jscore[k] > -HUGE_VAL && (best_k < 0 || jscore[k] > jscore[best_k])) best_k = static_cast<index_t>(k);
      }
      if (best_k < 0)
        throw LinAlgError("ivm.multiclass_select", 1,
                          "no candidate of the selection index had a positive-definite marginal covariance "
                          "and valid tilted moments at inclusion " + std::to_string(t + 1));
      i = J[best_k];
      best = jscore[best_k];
      // (the scoring's moments at i again: the same arithmetic, so valid as they were there)
      st.marginal(i, hi.data(), Ai.data());
      small::cholesky(C, Ai.data(), Li.data());
      scorer.tilted(static_cast<int>(y[i]), hi.data(), Li.data(), mh.data(), Ah.data(), p.data(), &log_Z, work);
    }
    out.score_seconds.push_back(seconds_since(t0));

    // Site of i: the constrained projection of its tilted moments from pi0 = (e_y + E[softmax]) / 2.
    const int yi = static_cast<int>(y[i]);
    for (int c = 0; c < C; ++c) pi0[c] = 0.5 * ((c == yi ? 1.0 : 0.0) + p[c]);
    const ProjectionResult proj =
        project_constrained_site(C, hi.data(), Ai.data(), mh.data(), Ah.data(), pi0.data(), opt.max_newton);

    // Kernel columns K^(c)(X, x_i), with the diagonal entry from Kdiag (a White kernel's variance).
    //    (the squared distances to x_i summed once for all class kernels with one lengthscale)
    const ConstMatrixView xi(X.row(i), 1, X.cols, X.ld);
    const kernels::SquaredDistances r2(X, xi);
    for (std::size_t k = 0; k < nk; ++k) {
      kernels[k]->K(X, xi, false, MatrixView(kcol_store[k].data(), n, 1), nk > 1 ? &r2 : nullptr);
      kcol_store[k][i] = kdiag[k][i];
    }
    for (int c = 0; c < C; ++c) kcol[c] = kcol_store[nk == 1 ? 0 : c].data();

    auto t1 = std::chrono::steady_clock::now();
    st.include(i, proj.pi.data(), proj.g.data(), kcol);
    out.update_seconds.push_back(seconds_since(t1));

    state[i] = 1;
    out.active.push_back(i);
    std::copy(proj.pi.begin(), proj.pi.end(), out.pi.begin() + t * C);
    std::copy(proj.b.begin(), proj.b.end(), out.b.begin() + t * C);
    out.scores.push_back(best);
    out.log_Z.push_back(log_Z);
    out.newton_iterations.push_back(proj.iterations);
    out.newton_converged.push_back(proj.converged ? 1 : 0);
    if (opt.record_marginals) st.all_marginals(out.history_h.data() + t * n * C, out.history_A.data() + t * n * CC);

    // Re-select J: keep the top keep_fraction of this round's scorers (but i), fill at random.
    if (t >= opt.n_random && t + 1 < d) {
      std::vector<index_t> order;
      for (std::size_t k = 0; k < J.size(); ++k)
        if (J[k] != i) order.push_back(static_cast<index_t>(k));
      std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) { return jscore[a] > jscore[b]; });
      const index_t keep = std::min<index_t>(static_cast<index_t>(order.size()),
                                             static_cast<index_t>(std::floor(opt.keep_fraction * static_cast<double>(jsize))));
      std::vector<index_t> kept;
      for (index_t k = 0; k < keep; ++k) kept.push_back(J[order[k]]);
      for (index_t j : J)
        if (state[j] == 2) state[j] = 0;
      J = kept;
      for (index_t j : J) state[j] = 2;
      free_points();
      const index_t take = std::min<index_t>(jsize - static_cast<index_t>(J.size()), static_cast<index_t>(avail.size()));
      for (index_t k = 0; k < take; ++k) {
        const index_t r = k + rng.below(static_cast<index_t>(avail.size()) - k);
        std::swap(avail[k], avail[r]);
        J.push_back(avail[k]);
        state[avail[k]] = 2;
      }
    }
  }
  out.h.resize(static_cast<std::size_t>(n * C));
  out.A.resize(static_cast<std::size_t>(n * CC));
  st.all_marginals(out.h.data(), out.A.data());
  return out;
}

}  // namespace pygpfast::ivm
