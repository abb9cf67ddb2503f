// Binary IVM selection (ivm/binary.hpp): time per inclusion and the rate of the stub update
// (s = K_{.,i} - M^T M_{.,i}, one GEMV of 2 n d flops with the d stub rows so far) against n and d.
// Then the joint multi-class selection (ivm/multiclass.hpp, C = 5): its stub update per inclusion
// reads M (C d' n doubles) and reads and writes Q (C d' n), a memory-bound pass, so its rate is
// given in bytes moved per second against one GEMV's over a C d x n matrix (what the memory
// allows a streaming read of the buffers' size), with the update's flops (6C + 9 per stub
// entry) beside.
//
//   bench_ivm [threads] [repeats]
//
// Per (n, d): the median over `repeats` (default 3) full selections of d points from n (probit,
// RBF over D = 5 inputs, two random picks), with the seconds the selection spent in each phase
// (kernel rows, stub GEMVs, ADF scores of all candidates, the O(n) updates of L, M, h and a).
// "GEMV GF/s" is the stub update's achieved rate over the selection; "peak" is one GEMV with
// all d rows of a d x n matrix, repeated (the rate the memory bandwidth allows for that shape).
// The reference GEMM rate (n = 2000) is measured in the same run. OPENBLAS_NUM_THREADS sets the
// BLAS pool; the first argument the core's OpenMP threads.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "blas_linked.hpp"
#include "pygpfast/blas.hpp"
#include "pygpfast/ivm/binary.hpp"
#include "pygpfast/ivm/multiclass.hpp"
#include "pygpfast/kernels.hpp"
#include "pygpfast/threads.hpp"

using namespace pygpfast;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

std::vector<double> randn(std::size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g;
  std::vector<double> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

// Seconds per call of one GEMV y -= A^T x with a random A [rows, n], repeated at least
// `min_calls` times and for about 2e8 flops: what a stub product of that shape costs (from the
// cache or from memory, as its size decides).
double gemv_seconds(index_t rows, index_t n, int min_calls) {
  auto A = randn(static_cast<std::size_t>(rows * n), 4), x = randn(static_cast<std::size_t>(rows), 5);
  std::vector<double> out(n);
  const int calls = std::max(min_calls, static_cast<int>(2e8 / (2.0 * n * rows)));
  return seconds([&] {
           for (int c = 0; c < calls; ++c)
             blas::gemv(blas::Trans::Yes, -1.0, ConstMatrixView(A.data(), rows, n), x.data(), 1.0, out.data());
         }) /
         calls;
}

}  // namespace

int main(int argc, char** argv) {
  blas::install_linked_blas();
  if (argc > 1) set_num_threads(std::atoi(argv[1]));
  const int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 3;
  const char* blas_env = std::getenv("OPENBLAS_NUM_THREADS");
  std::printf("CPU: %s | core threads: %d | BLAS: %s (threads %d, OPENBLAS_NUM_THREADS=%s)\n",
              cpu_model().c_str(), get_num_threads(), blas::linked_blas_name().c_str(), blas_threads(),
              blas_env ? blas_env : "unset");

  {
    const index_t n = 2000;
    auto A = randn(n * n, 1), B = randn(n * n, 2);
    std::vector<double> C(n * n);
    std::vector<double> t;
    for (int r = 0; r < 3; ++r)
      t.push_back(seconds([&] {
        blas::gemm(blas::Trans::No, blas::Trans::No, 1.0, ConstMatrixView(A.data(), n, n),
                   ConstMatrixView(B.data(), n, n), 0.0, MatrixView(C.data(), n, n));
      }));
    std::printf("reference dgemm n=2000: %.1f GF/s\n\n", 2.0 * n * n * n / median_of(t) / 1e9);
  }

  std::printf("%6s %5s %10s %12s %8s %8s %8s %8s %10s %10s\n", "n", "d", "total ms", "us/inclusion",
              "kernel%", "stub%", "score%", "update%", "GEMV GF/s", "peak GF/s");
  const index_t D = 5;
  for (index_t n : {800, 2000, 4000, 8000}) {
    auto X = randn(static_cast<std::size_t>(n * D), 3);
    std::vector<double> y(n);
    for (index_t i = 0; i < n; ++i) y[i] = std::sin(2.0 * X[i * D]) + X[i * D + 1] > 0 ? 1.0 : -1.0;
    const ConstMatrixView Xv(X.data(), n, D);
    std::vector<std::int32_t> codes = {static_cast<std::int32_t>(kernels::KernelType::RBF), 2};
    std::vector<double> params = {1.0, 1.5};
    const kernels::Kernel kernel(codes.data(), 2, params.data(), 2, D);
    ivm::BinaryLikelihood lik;
    for (index_t d : {150, 250, 400}) {
      ivm::SelectOptions opt;
      opt.active_size = d;
      opt.seed = 1;
      std::vector<double> total, share[4], gf;
      for (int r = 0; r < repeats; ++r) {
        ivm::BinaryIVM model(kernel, Xv, y.data(), lik, d);
        total.push_back(seconds([&] { ivm::select(model, opt); }));
        const auto& s = model.stats();
        const double sum = s.kernel_seconds + s.stub_seconds + s.score_seconds + s.update_seconds;
        share[0].push_back(100 * s.kernel_seconds / sum);
        share[1].push_back(100 * s.stub_seconds / sum);
        share[2].push_back(100 * s.score_seconds / sum);
        share[3].push_back(100 * s.update_seconds / sum);
        gf.push_back(s.stub_flops / s.stub_seconds / 1e9);
      }
      // One GEMV with all d rows (the last inclusion's shape).
      const double tg = gemv_seconds(d, n, 20);
      const double t = median_of(total);
      std::printf("%6ld %5ld %10.2f %12.1f %8.1f %8.1f %8.1f %8.1f %10.2f %10.2f\n", static_cast<long>(n),
                  static_cast<long>(d), 1e3 * t, 1e6 * t / static_cast<double>(d), median_of(share[0]),
                  median_of(share[1]), median_of(share[2]), median_of(share[3]), median_of(gf),
                  2.0 * n * d / tg / 1e9);
    }
  }

  // Joint multi-class selection, C = 5 classes of an isotropic RBF per class over D = 50 inputs.
  std::printf("\njoint multi-class selection, C = 5\n%6s %5s %10s %9s %9s %11s %10s %11s %9s\n", "n", "d",
              "total ms", "score%", "update%", "update GB/s", "GEMV GB/s", "update/GEMV", "upd GF/s");
  const int C = 5;
  const index_t Dm = 50;
  for (index_t n : {800, 2000, 4000}) {
    auto X = randn(static_cast<std::size_t>(n * Dm), 6);
    std::vector<double> y(n), beta(C, 0.0);
    for (index_t i = 0; i < n; ++i) {  // the class of the largest of C random projections
      int best = 0;
      for (int c = 1; c < C; ++c)
        if (X[i * Dm + c] + 0.5 * X[i * Dm + C + c] > X[i * Dm + best] + 0.5 * X[i * Dm + C + best]) best = c;
      y[i] = best;
    }
    const ConstMatrixView Xv(X.data(), n, Dm);
    std::vector<kernels::Kernel> ks;
    ivm::ClassKernels kp;
    for (int c = 0; c < C; ++c) {
      std::vector<std::int32_t> codes = {static_cast<std::int32_t>(kernels::KernelType::RBF), 2};
      std::vector<double> params = {1.0, std::sqrt(static_cast<double>(Dm)) * (1.0 + 0.1 * c)};
      ks.emplace_back(codes.data(), 2, params.data(), 2, Dm);
    }
    for (const auto& k : ks) kp.push_back(&k);
    for (index_t d : {150, 400}) {
      ivm::MulticlassSelectOptions opt;
      opt.num_classes = C;
      opt.active_size = d;
      opt.seed = 1;
      std::vector<double> total, score, update;
      for (int r = 0; r < repeats; ++r) {
        ivm::Selection sel;
        total.push_back(seconds([&] { sel = ivm::multiclass_select(kp, Xv, y.data(), beta.data(), opt); }));
        double sc = 0.0, up = 0.0;
        for (double v : sel.score_seconds) sc += v;
        for (double v : sel.update_seconds) up += v;
        score.push_back(sc);
        update.push_back(up);
      }
      // Over the selection: sum over inclusions of C d' n stub entries (d' = 0..d-1), each read
      // once in M and read and written once in Q (24 bytes), (6C + 9) flops.
      const double entries = static_cast<double>(C) * static_cast<double>(n) * static_cast<double>(d) * (d - 1) / 2.0;
      // The reference: one GEMV over C d x n doubles (the size of the Q buffers: past the L3
      // cache at n = 4000, d = 400, as the update's M and Q are).
      const index_t rows = C * d;
      const double t = median_of(total), up = median_of(update),
                   gemv_bytes = 8.0 * n * rows / gemv_seconds(rows, n, 10);
      std::printf("%6ld %5ld %10.1f %9.1f %9.1f %11.2f %10.2f %11.2f %9.2f\n", static_cast<long>(n),
                  static_cast<long>(d), 1e3 * t, 100 * median_of(score) / t, 100 * up / t, 24.0 * entries / up / 1e9,
                  gemv_bytes / 1e9, 24.0 * entries / up / gemv_bytes, (6.0 * C + 9.0) * entries / up / 1e9);
    }
  }
  return 0;
}
