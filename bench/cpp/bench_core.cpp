// Microbenchmarks of the core's hot kernels, linked against a system BLAS.
//
//   bench_core [threads]
//
// Prints, per operation, the median wall time, the throughput and (for GEMM-shaped work) the
// fraction of the float64 GEMM rate measured in the same run. OPENBLAS_NUM_THREADS sets the
// BLAS pool (an OpenBLAS older than 0.3.27 runs on one thread: blas_linked.hpp); the argument
// sets the core's OpenMP threads (default: OMP_NUM_THREADS or all cores).
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
#include "pygpfast/kernels.hpp"
#include "pygpfast/likelihoods.hpp"
#include "pygpfast/svgp/svgp.hpp"
#include "pygpfast/threads.hpp"
#include "pygpfast/workspace.hpp"

using namespace pygpfast;

namespace {

double median_seconds(const std::function<void()>& fn, int min_calls = 5, double min_time = 0.5) {
  fn();  // warm-up
  std::vector<double> t;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (static_cast<int>(t.size()) < min_calls || (elapsed() < min_time && t.size() < 200)) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
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

}  // namespace

int main(int argc, char** argv) {
  blas::install_linked_blas();
  if (argc > 1) set_num_threads(std::atoi(argv[1]));
  const char* blas_threads = std::getenv("OPENBLAS_NUM_THREADS");
  std::printf("CPU: %s | core threads: %d | BLAS: %s (OPENBLAS_NUM_THREADS=%s)\n\n", cpu_model().c_str(),
              get_num_threads(), blas::linked_blas_name().c_str(), blas_threads ? blas_threads : "unset");

  // Reference: float64 GEMM rate at n = 2000.
  const index_t n = 2000;
  auto A = randn(n * n, 1), B = randn(n * n, 2);
  std::vector<double> C(n * n);
  const double t_gemm = median_seconds([&] {
    blas::gemm(blas::Trans::No, blas::Trans::No, 1.0, ConstMatrixView(A.data(), n, n),
               ConstMatrixView(B.data(), n, n), 0.0, MatrixView(C.data(), n, n));
  });
  const double gemm_gflops = 2.0 * n * n * n / t_gemm / 1e9;
  std::printf("%-28s %10s %14s %10s\n", "operation", "ms", "throughput", "frac GEMM");
  std::printf("%-28s %10.2f %10.1f GF/s %10.2f\n", "dgemm n=2000", 1e3 * t_gemm, gemm_gflops, 1.0);

  // Kernels: K and the full vector-Jacobian product, RBF and Matern 5/2 with ARD.
  for (index_t D : {8, 256}) {
    const index_t N = 2000, M = 2000;
    auto X = randn(N * D, 3), X2 = randn(M * D, 4), G = randn(N * M, 5);
    std::vector<double> K(N * M), dX2(M * D);
    for (auto type : {kernels::KernelType::RBF, kernels::KernelType::Matern52}) {
      std::vector<std::int32_t> codes = {static_cast<std::int32_t>(type), static_cast<std::int32_t>(D + 1)};
      std::vector<double> params(D + 1, std::sqrt(static_cast<double>(D)));
      params[0] = 1.3;
      kernels::Kernel k(codes.data(), 2, params.data(), D + 1, D);
      std::vector<double> dparams(D + 1);
      ConstMatrixView Xv(X.data(), N, D), X2v(X2.data(), M, D);
      const double tK = median_seconds([&] { k.K(Xv, X2v, false, MatrixView(K.data(), N, M)); });
      const double tV = median_seconds([&] {
        MatrixView dX2v(dX2.data(), M, D);
        k.K_vjp(Xv, X2v, false, ConstMatrixView(G.data(), N, M), dparams.data(), nullptr, &dX2v);
      });
      const double flops = 2.0 * N * M * D;
      const char* name = type == kernels::KernelType::RBF ? "rbf" : "matern52";
      char label[64];
      std::snprintf(label, sizeof label, "%s K 2000x2000 D=%ld", name, static_cast<long>(D));
      std::printf("%-28s %10.2f %9.1f Me/s %10.2f\n", label, 1e3 * tK, N * M / tK / 1e6,
                  flops / tK / 1e9 / gemm_gflops);
      std::snprintf(label, sizeof label, "%s vjp 2000x2000 D=%ld", name, static_cast<long>(D));
      std::printf("%-28s %10.2f %9.1f Me/s %10.2f\n", label, 1e3 * tV, N * M / tV / 1e6,
                  4 * flops / tV / 1e9 / gemm_gflops);
    }
  }

  // Likelihood expectations at one million points.
  const index_t P = 1000000;
  auto mu = randn(P, 6), var = randn(P, 7);
  for (auto& v : var) v = 0.01 + std::fabs(v);
  std::vector<double> y(P), f(P), dmu(P), dvar(P);
  for (index_t i = 0; i < P; ++i) y[i] = (mu[i] + var[i] > 0.5) ? 1.0 : 0.0;
  const std::pair<likelihoods::LikelihoodType, const char*> liks[] = {
      {likelihoods::LikelihoodType::BernoulliProbit, "probit (20 GH)"},
      {likelihoods::LikelihoodType::BernoulliLogit, "logit (20 GH)"},
      {likelihoods::LikelihoodType::Poisson, "poisson"},
      {likelihoods::LikelihoodType::Gaussian, "gaussian"}};
  for (const auto& [type, name] : liks) {
    likelihoods::Likelihood lik;
    lik.type = type;
    const double t = median_seconds([&] {
      likelihoods::variational_expectations(lik, y.data(), mu.data(), var.data(), P, f.data(), dmu.data(),
                                            dvar.data(), nullptr);
    });
    char label[64];
    std::snprintf(label, sizeof label, "E[log p] %s N=1e6", name);
    std::printf("%-28s %10.2f %8.1f Mpt/s %10s\n", label, 1e3 * t, P / t / 1e6, "-");
  }

  // Softmax expectations, C = 10 classes: 10^4 points with means N(0, 4) plus 3 on the label's
  // class and variances 0.05 + |N(0, 1)| (about the spread of a fitted model's marginals).
  const index_t Ps = 10000, Cs = 10;
  auto mus = randn(Ps * Cs, 8), vars = randn(Ps * Cs, 9);
  std::vector<double> ys(Ps), fs(Ps), dmus(Ps * Cs), dvars(Ps * Cs);
  for (index_t i = 0; i < Ps; ++i) {
    ys[i] = static_cast<double>(i % Cs);
    for (index_t c = 0; c < Cs; ++c) {
      mus[i * Cs + c] = 2.0 * mus[i * Cs + c] + (c == i % Cs ? 3.0 : 0.0);
      vars[i * Cs + c] = 0.05 + std::fabs(vars[i * Cs + c]);
    }
  }
  for (int n_gh : {10, 20}) {
    likelihoods::Likelihood lik;
    lik.type = likelihoods::LikelihoodType::Softmax;
    lik.num_classes = static_cast<int>(Cs);
    lik.n_gh = n_gh;
    const double t = median_seconds([&] {
      likelihoods::variational_expectations(lik, ys.data(), mus.data(), vars.data(), Ps, fs.data(),
                                            dmus.data(), dvars.data(), nullptr);
    });
    char label[64];
    std::snprintf(label, sizeof label, "softmax C=10 (%d GH) N=1e4", n_gh);
    std::printf("%-28s %10.2f %8.3f Mpt/s %10s\n", label, 1e3 * t, Ps / t / 1e6, "-");
  }

  // One SVGP ELBO + gradient step, the peers' case (svgp_step.py): D = 8, ARD RBF (lengthscales
  // 2), probit with 20 Gauss-Hermite points, whitened, full lower-triangular q_sqrt. "frac GEMM"
  // uses the peers' nominal flop count (7/3) M^3 + 10 M^2 B + 9 D (M^2 + M B). The last column
  // empties the scratch cache (workspace.hpp) before every step, so each step's scratch comes
  // from malloc; it differs from the first only when malloc hands out fresh pages (e.g. with
  // GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072; glibc's default keeps freed blocks here).
  std::printf("\n%-28s %10s %14s %10s %12s\n", "svgp step (D=8, probit)", "ms", "throughput", "frac GEMM",
              "no cache ms");
  for (index_t Ms : {64, 256, 1024}) {
    for (index_t Bs : {256, 4096}) {
      const index_t Ds = 8;
      auto Xs = randn(Bs * Ds, 10), Zs = randn(Ms * Ds, 11), qm = randn(Ms, 12), noise = randn(Ms * Ms, 13);
      std::vector<double> ysv(Bs), q_sqrt(Ms * Ms, 0.0);
      for (index_t i = 0; i < Bs; ++i) ysv[i] = Xs[i * Ds] + 0.5 * Xs[i * Ds + 1] * Xs[i * Ds + 2] > 0 ? 1.0 : 0.0;
      for (index_t i = 0; i < Ms; ++i) {
        qm[i] *= 0.3;
        for (index_t j = 0; j < i; ++j) q_sqrt[i * Ms + j] = 0.02 * noise[i * Ms + j];
        q_sqrt[i * Ms + i] = 0.3 + 0.25 * (1.0 + std::tanh(noise[i * Ms + i]));
      }
      std::vector<std::int32_t> codes = {0, static_cast<std::int32_t>(Ds + 1)};
      std::vector<double> params(Ds + 1, 2.0);
      params[0] = 1.0;
      kernels::Kernel k(codes.data(), 2, params.data(), Ds + 1, Ds);
      likelihoods::Likelihood lik;
      lik.type = likelihoods::LikelihoodType::BernoulliProbit;
      svgp::Variational q;
      q.Z = ConstMatrixView(Zs.data(), Ms, Ds);
      q.q_mu = ConstMatrixView(qm.data(), Ms, 1);
      q.q_sqrt = q_sqrt.data();
      svgp::Batch batch;
      batch.X = ConstMatrixView(Xs.data(), Bs, Ds);
      batch.y = ysv.data();
      batch.scale = 100000.0 / static_cast<double>(Bs);
      std::vector<double> g_mu(Ms), g_sqrt(Ms * Ms), g_Z(Ms * Ds), g_k(Ds + 1);
      svgp::Gradients g;
      g.q_mu = MatrixView(g_mu.data(), Ms, 1);
      g.q_sqrt = g_sqrt.data();
      g.Z = MatrixView(g_Z.data(), Ms, Ds);
      g.kernel = g_k.data();
      auto step = [&] { svgp::elbo(k, lik, q, batch, 1e-6, &g); };
      const double t = median_seconds(step, 5, 1.0);
      const double t_fresh = median_seconds([&] {
        workspace::trim();
        step();
      }, 5, 1.0);
      const double nominal = (7.0 / 3.0) * Ms * Ms * Ms + 10.0 * Ms * Ms * Bs + 9.0 * Ds * (Ms * Ms + Ms * Bs);
      char label[64];
      std::snprintf(label, sizeof label, "svgp step M=%ld B=%ld", static_cast<long>(Ms), static_cast<long>(Bs));
      std::printf("%-28s %10.3f %9.1f GF/s %10.2f %12.3f\n", label, 1e3 * t, nominal / t / 1e9,
                  nominal / t / 1e9 / gemm_gflops, 1e3 * t_fresh);
    }
  }
  return 0;
}
