#include "bind_common.hpp"
#include "pygpfast/quadrature.hpp"

namespace pygpfast::bind {

void bind_likelihoods(py::module_& m) {
  m.def(
      "gauss_hermite",
      [](int n) {
        const auto& rule = quadrature::gauss_hermite(n);
        return py::make_tuple(py::array_t<double>(n, rule.x.data()),
                              py::array_t<double>(n, rule.w.data()));
      },
      py::arg("n"),
      "Physicists' Gauss-Hermite rule (weight exp(-x^2)), 1 <= n <= 100. Returns (x [n], w [n]).");

  m.def(
      "variational_expectations",
      [](int kind, double variance, int n_gh, int num_classes, const py::array& y, const py::array& mu,
         const py::array& var) {
        const auto lik = make_likelihood(kind, variance, n_gh, num_classes);
        const double* yv = as_vector(y, "y");
        const index_t n = y.shape(0);
        const double* muv = as_vector(mu, "mu", n);
        const double* varv = as_vector(var, "var", n);
        auto f = new_vector(n), dmu = new_vector(n), dvar = new_vector(n), dparam = new_vector(n);
        {
          py::gil_scoped_release release;
          likelihoods::variational_expectations(lik, yv, muv, varv, n, f.mutable_data(),
                                                dmu.mutable_data(), dvar.mutable_data(),
                                                dparam.mutable_data());
        }
        return py::make_tuple(f, dmu, dvar, dparam);
      },
      py::arg("kind"), py::arg("variance"), py::arg("n_gh"), py::arg("num_classes"), py::arg("y"), py::arg("mu"),
      py::arg("var"),
      "E[log p(y|f)] under f ~ N(mu, var) per point. kind: 0 Gaussian, 1 Bernoulli-probit, "
      "2 Bernoulli-logit, 3 Poisson. Returns (f, dmu, dvar, dparam), each [N]; dparam is the "
      "derivative in the Gaussian variance (0 for the others).");

  m.def(
      "predict_mean_and_var",
      [](int kind, double variance, int n_gh, int num_classes, const py::array& mu, const py::array& var) {
        const auto lik = make_likelihood(kind, variance, n_gh, num_classes);
        const double* muv = as_vector(mu, "mu");
        const index_t n = mu.shape(0);
        const double* varv = as_vector(var, "var", n);
        auto mean = new_vector(n), y_var = new_vector(n);
        {
          py::gil_scoped_release release;
          likelihoods::predict_mean_and_var(lik, muv, varv, n, mean.mutable_data(),
                                            y_var.mutable_data());
        }
        return py::make_tuple(mean, y_var);
      },
      py::arg("kind"), py::arg("variance"), py::arg("n_gh"), py::arg("num_classes"), py::arg("mu"), py::arg("var"),
      "Predictive mean and variance of y at f ~ N(mu, var). Returns (mean [N], var [N]).");

  m.def(
      "predict_log_density",
      [](int kind, double variance, int n_gh, int num_classes, const py::array& y, const py::array& mu,
         const py::array& var) {
        const auto lik = make_likelihood(kind, variance, n_gh, num_classes);
        const double* yv = as_vector(y, "y");
        const index_t n = y.shape(0);
        const double* muv = as_vector(mu, "mu", n);
        const double* varv = as_vector(var, "var", n);
        auto out = new_vector(n);
        {
          py::gil_scoped_release release;
          likelihoods::predict_log_density(lik, yv, muv, varv, n, out.mutable_data());
        }
        return out;
      },
      py::arg("kind"), py::arg("variance"), py::arg("n_gh"), py::arg("num_classes"), py::arg("y"), py::arg("mu"),
      py::arg("var"), "log of the predictive density of y at f ~ N(mu, var), per point [N].");
}

}  // namespace pygpfast::bind
