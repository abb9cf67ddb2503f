// Joint multi-class IVM (ivm/multiclass.hpp): the stub-buffer marginals after the last inclusion
// equal the marginals recomputed from scratch from the sites (a separate code path: triangular
// solves on the active set, no stubs), and the selection does not depend on the thread count.
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "check.hpp"
#include "pygpfast/ivm/multiclass.hpp"
#include "pygpfast/kernels.hpp"
#include "pygpfast/threads.hpp"

using namespace pygpfast;

namespace {

struct Problem {
  index_t n, D = 2;
  int C;
  std::vector<double> X, y, beta;
  Problem(index_t n_, int C_) : n(n_), C(C_) {
    std::mt19937_64 rng(42 + n);
    std::normal_distribution<double> normal;
    X.resize(n * D);
    y.resize(n);
    beta.resize(C);
    for (auto& v : X) v = normal(rng);
    for (index_t i = 0; i < n; ++i) {
      int best = 0;
      double bv = -1e300;
      for (int c = 0; c < C; ++c) {
        const double s = std::sin(1.3 * c + X[i * D]) + 0.5 * c * X[i * D + 1] + 0.3 * normal(rng);
        if (s > bv) bv = s, best = c;
      }
      y[i] = best;
    }
    for (auto& b : beta) b = 0.2 * normal(rng);
  }
};

}  // namespace

PYGPFAST_TEST(multiclass_marginals_equal_from_scratch_recompute) {
  const Problem p(60, 3);
  const std::int32_t codes[2] = {0, 3};
  const double params[3][3] = {{1.5, 1.0, 0.8}, {0.7, 0.6, 1.2}, {2.0, 1.5, 1.5}};
  std::vector<kernels::Kernel> ks;
  for (int c = 0; c < 3; ++c) ks.emplace_back(codes, 2, params[c], 3, p.D);
  ivm::ClassKernels kp{&ks[0], &ks[1], &ks[2]};
  const ConstMatrixView X(p.X.data(), p.n, p.D);
  for (int rule = 0; rule < 2; ++rule) {
    ivm::MulticlassSelectOptions opt;
    opt.num_classes = 3;
    opt.active_size = 15;
    opt.seed = 9;
    opt.rule = static_cast<ivm::CubatureRule>(rule);
    const auto s = ivm::multiclass_select(kp, X, p.y.data(), p.beta.data(), opt);
    std::vector<double> XI(s.d * p.D);
    for (index_t k = 0; k < s.d; ++k)
      for (index_t j = 0; j < p.D; ++j) XI[k * p.D + j] = p.X[s.active[k] * p.D + j];
    std::vector<double> mean(p.n * 3), cov(p.n * 9);
    ivm::multiclass_predict(kp, 3, ConstMatrixView(XI.data(), s.d, p.D), s.pi.data(), s.b.data(), p.beta.data(), X,
                            opt.rule, mean.data(), cov.data(), nullptr);
    double err = 0.0;
    for (index_t k = 0; k < p.n * 3; ++k) err = std::max(err, std::fabs(mean[k] - s.h[k]));
    for (index_t k = 0; k < p.n * 9; ++k) err = std::max(err, std::fabs(cov[k] - s.A[k]));
    CHECK(err < 1e-11);
    for (index_t k = 0; k < s.d; ++k) CHECK(s.newton_iterations[k] <= 50);
  }
}

PYGPFAST_TEST(multiclass_selection_thread_count_invariant) {
  const Problem p(1500, 4);
  const std::int32_t codes[2] = {0, 2};
  const double params[2] = {1.0, 0.9};
  const kernels::Kernel k(codes, 2, params, 2, p.D);
  ivm::ClassKernels kp{&k};
  ivm::MulticlassSelectOptions opt;
  opt.num_classes = 4;
  opt.active_size = 20;
  opt.seed = 3;
  opt.rule = ivm::CubatureRule::Stroud5;
  const ConstMatrixView X(p.X.data(), p.n, p.D);
  set_num_threads(1);
  const auto a = ivm::multiclass_select(kp, X, p.y.data(), p.beta.data(), opt);
  set_num_threads(2);
  const auto b = ivm::multiclass_select(kp, X, p.y.data(), p.beta.data(), opt);
  set_num_threads(0);
  CHECK(a.active == b.active);
  CHECK(a.pi == b.pi);
  CHECK(a.h == b.h);
  CHECK(a.A == b.A);
}

PYGPFAST_TEST(multiclass_bad_input_throws) {
  const Problem p(10, 3);
  const std::int32_t codes[2] = {0, 2};
  const double params[2] = {1.0, 0.9};
  const kernels::Kernel k(codes, 2, params, 2, p.D);
  ivm::ClassKernels kp{&k};
  ivm::MulticlassSelectOptions opt;
  opt.num_classes = 3;
  opt.active_size = 11;
  const ConstMatrixView X(p.X.data(), p.n, p.D);
  auto bad_select = [&] { ivm::multiclass_select(kp, X, p.y.data(), p.beta.data(), opt); };
  auto bad_rule = [] { ivm::make_cubature(ivm::CubatureRule::GaussHermite3, 13); };
  CHECK_THROWS(bad_select(), std::invalid_argument);
  CHECK_THROWS(bad_rule(), std::invalid_argument);
}

PYGPFAST_TEST_MAIN
