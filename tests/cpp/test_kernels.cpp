// Kernels against loop references and finite differences, with a linked system BLAS.
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "check.hpp"
#include "pygpfast/kernels.hpp"

using namespace pygpfast;
using kernels::Kernel;

namespace {

constexpr std::int32_t kRBF = 0, kMatern52 = 3, kLinear = 4, kWhite = 6, kSum = 7, kProduct = 8;

std::vector<double> random_vector(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> g;
  std::vector<double> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

// Loop reference of an RBF kernel with variance s2 and per-dimension lengthscales l.
double rbf_reference(const double* x, const double* x2, index_t D, double s2, const double* l) {
  double r2 = 0.0;
  for (index_t d = 0; d < D; ++d) r2 += (x[d] - x2[d]) * (x[d] - x2[d]) / (l[d] * l[d]);
  return s2 * std::exp(-0.5 * r2);
}

}  // namespace

PYGPFAST_TEST(rbf_matches_loop_reference) {
  const index_t N = 23, M = 17, D = 3;
  const auto X = random_vector(N * D, 1), X2 = random_vector(M * D, 2);
  const std::vector<std::int32_t> iso = {kRBF, 2}, ard = {kRBF, 4};
  const std::vector<double> iso_params = {1.7, 0.8}, ard_params = {1.7, 0.5, 1.2, 2.0};
  const double iso_l[] = {0.8, 0.8, 0.8};
  for (bool is_ard : {false, true}) {
    const auto& codes = is_ard ? ard : iso;
    const auto& params = is_ard ? ard_params : iso_params;
    const double* l = is_ard ? ard_params.data() + 1 : iso_l;
    Kernel k(codes.data(), 2, params.data(), static_cast<index_t>(params.size()), D);
    std::vector<double> K(N * M), Kxx(N * N);
    k.K(ConstMatrixView(X.data(), N, D), ConstMatrixView(X2.data(), M, D), false,
        MatrixView(K.data(), N, M));
    k.K(ConstMatrixView(X.data(), N, D), ConstMatrixView(X.data(), N, D), true,
        MatrixView(Kxx.data(), N, N));
    for (index_t i = 0; i < N; ++i) {
      for (index_t j = 0; j < M; ++j)
        CHECK_NEAR(K[i * M + j], rbf_reference(&X[i * D], &X2[j * D], D, 1.7, l), 1e-13);
      for (index_t j = 0; j < N; ++j) {
        CHECK_NEAR(Kxx[i * N + j], rbf_reference(&X[i * D], &X[j * D], D, 1.7, l), 1e-13);
        CHECK(Kxx[i * N + j] == Kxx[j * N + i]);  // exactly symmetric
      }
      CHECK(Kxx[i * N + i] == 1.7);
    }
  }
}

PYGPFAST_TEST(vjp_matches_finite_differences) {
  // (Matern52 ARD * Linear) + White, evaluated on K(X, X2) and K(X, X).
  const index_t N = 7, M = 5, D = 2;
  const std::vector<std::int32_t> codes = {
      kSum, 2, kProduct, 2, kMatern52, 3, kLinear, 1, kWhite, 1};
  std::vector<double> params = {1.3, 0.7, 1.6, 0.9, 0.2};
  const index_t P = static_cast<index_t>(params.size());
  auto X = random_vector(N * D, 3), X2 = random_vector(M * D, 4);
  for (bool same : {false, true}) {
    const index_t cols = same ? N : M;
    const auto G = random_vector(N * cols, 5);
    // f = sum(G o K) for the current params, X and X2 (X2 is X when same).
    auto f = [&]() {
      Kernel k(codes.data(), static_cast<index_t>(codes.size()), params.data(), P, D);
      std::vector<double> K(N * cols);
      const double* x2 = same ? X.data() : X2.data();
      k.K(ConstMatrixView(X.data(), N, D), ConstMatrixView(x2, cols, D), same,
          MatrixView(K.data(), N, cols));
      double s = 0.0;
      for (index_t i = 0; i < N * cols; ++i) s += G[i] * K[i];
      return s;
    };
    auto central = [&](double& x) {
      const double eps = 1e-6, x0 = x;
      x = x0 + eps;
      const double up = f();
      x = x0 - eps;
      const double down = f();
      x = x0;
      return (up - down) / (2 * eps);
    };

    Kernel k(codes.data(), static_cast<index_t>(codes.size()), params.data(), P, D);
    std::vector<double> dparams(P, 0.0), dX(N * D, 0.0), dX2(cols * D, 0.0);
    MatrixView dXv(dX.data(), N, D), dX2v(dX2.data(), cols, D);
    const double* x2 = same ? X.data() : X2.data();
    k.K_vjp(ConstMatrixView(X.data(), N, D), ConstMatrixView(x2, cols, D), same,
            ConstMatrixView(G.data(), N, cols), dparams.data(), &dXv, &dX2v);
    for (index_t p = 0; p < P; ++p) CHECK_NEAR(dparams[p], central(params[p]), 1e-6);
    // With `same`, X enters through both arguments: its gradient is dX + dX2.
    for (index_t i = 0; i < N * D; ++i)
      CHECK_NEAR(dX[i] + (same ? dX2[i] : 0.0), central(X[i]), 1e-6);
    if (!same)
      for (index_t i = 0; i < M * D; ++i) CHECK_NEAR(dX2[i], central(X2[i]), 1e-6);
  }
}

PYGPFAST_TEST(bad_descriptions_throw_invalid_argument) {
  const std::vector<double> params = {1.0, 1.0, 1.0};
  auto make = [&](std::vector<std::int32_t> codes, index_t n_params) {
    Kernel(codes.data(), static_cast<index_t>(codes.size()), params.data(), n_params, 2);
  };
  CHECK_THROWS(make({99, 1}, 1), std::invalid_argument);             // unknown type
  CHECK_THROWS(make({kRBF, 1}, 1), std::invalid_argument);           // too few params
  CHECK_THROWS(make({kRBF, 2}, 3), std::invalid_argument);           // params left over
  CHECK_THROWS(make({kRBF, 2, kWhite, 1}, 3), std::invalid_argument);  // codes left over
  CHECK_THROWS(make({kSum, 2, kWhite, 1}, 1), std::invalid_argument);  // missing child
  CHECK_THROWS(make({kWhite, 1}, 0), std::invalid_argument);         // missing params
  const double negative[] = {1.0, -0.5};
  const std::int32_t rbf[] = {kRBF, 2};
  CHECK_THROWS(Kernel(rbf, 2, negative, 2, 2), std::invalid_argument);
  CHECK_THROWS(Kernel(rbf, 2, params.data(), 2, 0), std::invalid_argument);

  // Inputs whose width is not input_dim.
  Kernel k(rbf, 2, params.data(), 2, 2);
  std::vector<double> X(6, 0.0), K(4);
  CHECK_THROWS(k.K(ConstMatrixView(X.data(), 2, 3), ConstMatrixView(X.data(), 2, 3), true,
                   MatrixView(K.data(), 2, 2)),
               std::invalid_argument);
}

PYGPFAST_TEST_MAIN
