// The SVGP evaluation (svgp.hpp) from a C++ program: called from the caller's own OpenMP threads,
// evaluations that cut the minibatch into blocks (and, for 128 <= M < 512, run the three-phase
// region of svgp.cpp) finish, and give what a call from outside any team gives.
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "blas_linked.hpp"
#include "check.hpp"
#include "pygpfast/kernels.hpp"
#include "pygpfast/likelihoods.hpp"
#include "pygpfast/svgp/svgp.hpp"
#include "pygpfast/threads.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace pygpfast;

namespace {

struct Problem {
  index_t M, B, D = 3;
  std::vector<double> X, y, Z, params, q_mu, q_sqrt;
  std::vector<std::int32_t> codes;

  Problem(index_t M_, index_t B_) : M(M_), B(B_) {
    std::mt19937_64 rng(M * 7919 + B);
    std::normal_distribution<double> normal;
    X.resize(B * D);
    Z.resize(M * D);
    y.resize(B);
    for (auto& v : X) v = normal(rng);
    for (auto& v : Z) v = normal(rng);
    for (index_t i = 0; i < B; ++i) y[i] = std::sin(2.0 * X[i * D]) + X[i * D + 1] > 0 ? 1.0 : 0.0;
    codes = {static_cast<std::int32_t>(kernels::KernelType::RBF), static_cast<std::int32_t>(D + 1)};
    params.assign(D + 1, 1.5);
    q_mu.resize(M);
    q_sqrt.assign(M * M, 0.0);
    for (index_t i = 0; i < M; ++i) {
      q_mu[i] = 0.3 * normal(rng);
      q_sqrt[i * M + i] = 0.6;
      if (i > 0) q_sqrt[i * M + i - 1] = 0.05;
    }
  }

  // The ELBO, then its gradients w.r.t. q_mu, Z and the kernel, in one vector.
  std::vector<double> evaluate() const {
    const kernels::Kernel kernel(codes.data(), 2, params.data(), D + 1, D);
    likelihoods::Likelihood lik;
    lik.type = likelihoods::LikelihoodType::BernoulliProbit;
    svgp::Variational q;
    q.Z = ConstMatrixView(Z.data(), M, D);
    q.q_mu = ConstMatrixView(q_mu.data(), M, 1);
    q.q_sqrt = q_sqrt.data();
    svgp::Batch batch;
    batch.X = ConstMatrixView(X.data(), B, D);
    batch.y = y.data();
    std::vector<double> out(1 + M + M * D + D + 1), g_sqrt(M * M);
    svgp::Gradients g;
    g.q_mu = MatrixView(out.data() + 1, M, 1);
    g.q_sqrt = g_sqrt.data();
    g.Z = MatrixView(out.data() + 1 + M, M, D);
    g.kernel = out.data() + 1 + M + M * D;
    out[0] = svgp::elbo(kernel, lik, q, batch, 1e-6, &g).elbo;
    return out;
  }
};

}  // namespace

PYGPFAST_TEST(evaluations_called_from_the_callers_openmp_threads) {
  blas::install_linked_blas();
  set_num_threads(2);
  // (M = 16, B = 200: one block on one thread; M = 64: blocks only; M = 200: the three-phase
  // region; both cut B = 2000 into 8 blocks.)
  for (const auto& [M, B] : {std::pair<index_t, index_t>{16, 200}, {64, 2000}, {200, 2000}}) {
    const Problem problem(M, B);
    const std::vector<double> reference = problem.evaluate();
    // Both of the caller's threads evaluate; then only one of them does (a barrier of the
    // evaluation's that bound to the caller's team would wait for the other forever).
    std::vector<std::vector<double>> got(3);
#ifdef _OPENMP
#pragma omp parallel num_threads(2)
    got[omp_get_thread_num()] = problem.evaluate();
#pragma omp parallel num_threads(2)
    if (omp_get_thread_num() == 1) got[2] = problem.evaluate();
#else
    got[0] = got[1] = got[2] = problem.evaluate();
#endif
    for (const auto& g : got) {
      CHECK(g.size() == reference.size());
      for (std::size_t i = 0; i < reference.size(); ++i) CHECK_NEAR(g[i], reference[i], 1e-9 * (1.0 + std::fabs(reference[i])));
    }
  }
  set_num_threads(0);
}

PYGPFAST_TEST_MAIN
