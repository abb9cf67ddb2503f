// IS-MOE experts: time to fit P = J K blocks of n rows each (ML-II by L-BFGS, or one evaluation at
// fixed hyperparameters), on 1 and 2 OpenMP threads, with the flops of one evaluation per block and
// the rate reached.
//
//   bench_moe [max_threads]
//
// Per evaluation of an n-row block with D inputs (RBF ARD, P = D + 1 parameters, plus the noise):
// kernel 3 n^2 D, Cholesky n^3 / 3, inverse from the factor 2 n^3 / 3, kernel vjp about
// n^2 (2 D + 4) flops; the rate is evaluations x that / wall time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "blas_linked.hpp"
#include "pygpfast/moe/experts.hpp"
#include "pygpfast/threads.hpp"

using namespace pygpfast;

namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Case {
  const char* name;
  index_t J, K, n, D;
  bool optimize;
  moe::Likelihood lik;
};

void run(const Case& c, int threads) {
  const index_t P = c.J * c.K, N = c.J * c.K * c.n / 4 + c.n, D = c.D;  // rows drawn from N
  std::mt19937_64 rng(1);
  std::normal_distribution<double> g;
  std::vector<double> X(N * D), y(N);
  for (auto& x : X) x = g(rng);
  for (index_t i = 0; i < N; ++i) {
    const double f = std::sin(2.0 * X[i * D]) + 0.5 * X[i * D + 1] + 0.1 * g(rng);
    y[i] = c.lik == moe::Likelihood::Gaussian ? f : (f > 0 ? 1.0 : 0.0);
  }
  std::vector<index_t> offsets(P + 1), rows(P * c.n);
  for (index_t p = 0; p <= P; ++p) offsets[p] = p * c.n;
  for (auto& r : rows) r = static_cast<index_t>(rng() % static_cast<std::uint64_t>(N));
  std::vector<std::int32_t> codes{0, static_cast<std::int32_t>(D + 1)};
  std::vector<double> params(D + 1, 1.0);
  const double noise = 0.1, mean = 0.0;
  moe::KernelSpec spec{codes.data(), 2, D + 1};
  moe::Start start{params.data(), 0, &noise, 0, &mean, 0};
  moe::FitOptions o;
  o.likelihood = c.lik;
  o.optimize = c.optimize;
  o.lbfgs.max_iter = 50;
  std::vector<double> fitted(P * (D + 1)), logev(P), alpha(P * c.n), factor(P * c.n * c.n), W(P * c.n);
  std::vector<std::int32_t> evals(P);
  moe::FitOutputs out;
  out.params = fitted.data();
  out.log_evidence = logev.data();
  out.evaluations = evals.data();
  out.alpha = alpha.data();
  out.factor = factor.data();
  out.W = W.data();
  set_num_threads(threads);
  double best = 1e300;
  for (int rep = 0; rep < 2; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    moe::fit_blocks(spec, start, ConstMatrixView(X.data(), N, D), y.data(), offsets.data(), rows.data(), P, o, out);
    best = std::min(best, seconds_since(t0));
  }
  // Evaluations: the optimiser's (each with gradient) plus the final one without.
  const double n = static_cast<double>(c.n), d = static_cast<double>(D);
  const double flops_eval = 3 * n * n * d + n * n * n / 3 + 2 * n * n * n / 3 + n * n * (2 * d + 4);
  const double total_evals = std::accumulate(evals.begin(), evals.end(), 0.0) + static_cast<double>(P);
  std::printf("%-22s J=%4ld K=%3ld n=%5ld D=%ld  threads=%d  %8.3f s  %9.1f us/block  evals/block %5.1f  "
              "%.2e flop/eval  %6.2f GFLOP/s\n",
              c.name, static_cast<long>(c.J), static_cast<long>(c.K), static_cast<long>(c.n), static_cast<long>(D),
              threads, best, 1e6 * best / static_cast<double>(P), total_evals / static_cast<double>(P), flops_eval,
              total_evals * flops_eval / best * 1e-9);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  blas::install_linked_blas();
  const int max_threads = argc > 1 ? std::atoi(argv[1]) : 2;
  std::printf("CPU: %s | BLAS: %s (held to one thread inside blocks) | OpenMP: %s\n\n", cpu_model().c_str(),
              blas::linked_blas_name().c_str(), openmp_enabled() ? "yes" : "no");
  const Case cases[] = {
      {"regression, fixed", 128, 20, 50, 8, false, moe::Likelihood::Gaussian},
      {"regression, ML-II", 128, 20, 50, 8, true, moe::Likelihood::Gaussian},
      {"regression, fixed", 32, 5, 200, 8, false, moe::Likelihood::Gaussian},
      {"regression, ML-II", 32, 5, 200, 8, true, moe::Likelihood::Gaussian},
      {"probit Laplace, ML-II", 128, 20, 50, 8, true, moe::Likelihood::Probit},
  };
  for (const Case& c : cases)
    for (int t = 1; t <= max_threads; t *= 2) run(c, t);
  return 0;
}
