// pygpfast's core from C++: one SVGP ELBO and its gradients on a minibatch, then a timed loop.
//
//   cmake -S examples/cpp -B build/example -G Ninja && cmake --build build/example
//   build/example/svgp_elbo [M] [B]
//
// The program links pygpfast_blas_linked, which fills the core's BLAS/LAPACK table from the
// system BLAS (install_linked_blas); the core itself never links a BLAS.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "blas_linked.hpp"
#include "pygpfast/kernels.hpp"
#include "pygpfast/likelihoods.hpp"
#include "pygpfast/svgp/svgp.hpp"

using namespace pygpfast;

int main(int argc, char** argv) {
  const index_t M = argc > 1 ? std::atol(argv[1]) : 64, B = argc > 2 ? std::atol(argv[2]) : 256;
  const index_t D = 4;
  blas::install_linked_blas();

  // Data: y = 1 when sin(2 x0) + x1 x2 > 0 (row-major [B, D]), inducing inputs from N(0, I).
  std::mt19937_64 rng(0);
  std::normal_distribution<double> normal;
  std::vector<double> X(B * D), y(B), Z(M * D);
  for (auto& v : X) v = normal(rng);
  for (auto& v : Z) v = normal(rng);
  for (index_t i = 0; i < B; ++i) y[i] = std::sin(2.0 * X[i * D]) + X[i * D + 1] * X[i * D + 2] > 0 ? 1.0 : 0.0;

  // ARD RBF kernel (variance 1, lengthscales 1): one leaf [type, n_params] and its parameters.
  const std::int32_t codes[] = {static_cast<std::int32_t>(kernels::KernelType::RBF), static_cast<std::int32_t>(D + 1)};
  std::vector<double> params(D + 1, 1.0);
  const kernels::Kernel kernel(codes, 2, params.data(), D + 1, D);
  likelihoods::Likelihood lik;
  lik.type = likelihoods::LikelihoodType::BernoulliProbit;  // 20-point Gauss-Hermite by default

  // Whitened q(u) = N(m, S) with S = L L^T: m = 0, L = 0.5 I.
  std::vector<double> q_mu(M, 0.0), q_sqrt(M * M, 0.0);
  for (index_t i = 0; i < M; ++i) q_sqrt[i * M + i] = 0.5;
  svgp::Variational q;
  q.Z = ConstMatrixView(Z.data(), M, D);
  q.q_mu = ConstMatrixView(q_mu.data(), M, 1);
  q.q_sqrt = q_sqrt.data();
  svgp::Batch batch;
  batch.X = ConstMatrixView(X.data(), B, D);
  batch.y = y.data();
  batch.scale = 100000.0 / static_cast<double>(B);  // a minibatch of a 100 000-row data set

  std::vector<double> g_mu(M), g_sqrt(M * M), g_Z(M * D), g_kernel(D + 1);
  svgp::Gradients g;
  g.q_mu = MatrixView(g_mu.data(), M, 1);
  g.q_sqrt = g_sqrt.data();
  g.Z = MatrixView(g_Z.data(), M, D);
  g.kernel = g_kernel.data();

  const svgp::Result r = svgp::elbo(kernel, lik, q, batch, 1e-6, &g);
  std::printf("M = %ld, B = %ld: ELBO %.6f (expected log-likelihood %.6f, KL %.6f)\n",
              static_cast<long>(M), static_cast<long>(B), r.elbo, r.expected_log_lik, r.kl);
  std::printf("dELBO/dvariance %.6f, dELBO/dlengthscale_1 %.6f\n", g_kernel[0], g_kernel[1]);
  if (!std::isfinite(r.elbo)) return 1;

  const int steps = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) svgp::elbo(kernel, lik, q, batch, 1e-6, &g);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%.3f ms per ELBO + gradient step (%s)\n", 1e3 * seconds / steps,
              blas::linked_blas_name().c_str());
  return 0;
}
