#include "bind_common.hpp"
#include "pygpfast/quadrature.hpp"

namespace pygpfast::bind {
namespace {

// The marginal means or variances of n points: [n] for the likelihoods of one latent function,
// [n, C] for the multi-class ones (latent_dim C). n < 0 takes n from the array.
const double* latent_array(const py::array& a, const char* name, const likelihoods::Likelihood& lik,
                           index_t n = -1) {
  const index_t D = likelihoods::latent_dim(lik);
  if (D == 1) return as_vector(a, name, n);
  const ConstMatrixView m = as_matrix(a, name);
  if ((n >= 0 && m.rows != n) || m.cols != D)
    throw std::invalid_argument(std::string(name) + " must have shape [" +
                                (n >= 0 ? std::to_string(n) : std::string("N")) + ", " +
                                std::to_string(D) + "] (one column per class), got [" +
                                std::to_string(m.rows) + ", " + std::to_string(m.cols) + "]");
  return m.data;
}

// A new array of n points' latent values: [n] or [n, C].
py::array_t<double> new_latent_array(const likelihoods::Likelihood& lik, index_t n) {
  const index_t D = likelihoods::latent_dim(lik);
  return D == 1 ? new_vector(n) : new_matrix(n, D);
}

}  // namespace

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
      [](int kind, double param, int n_gh, int num_classes, const py::array& y, const py::array& mu,
         const py::array& var) {
        const auto lik = make_likelihood(kind, param, n_gh, num_classes);
        const double* yv = as_vector(y, "y");
        const index_t n = y.shape(0);
        const double* muv = latent_array(mu, "mu", lik, n);
        const double* varv = latent_array(var, "var", lik, n);
        auto f = new_vector(n), dparam = new_vector(n);
        auto dmu = new_latent_array(lik, n), dvar = new_latent_array(lik, n);
        {
          py::gil_scoped_release release;
          likelihoods::variational_expectations(lik, yv, muv, varv, n, f.mutable_data(),
                                                dmu.mutable_data(), dvar.mutable_data(),
                                                dparam.mutable_data());
        }
        return py::make_tuple(f, dmu, dvar, dparam);
      },
      py::arg("kind"), py::arg("param"), py::arg("n_gh"), py::arg("num_classes"), py::arg("y"), py::arg("mu"),
      py::arg("var"),
      "E[log p(y|f)] under f ~ N(mu, var) per point. kind: 0 Gaussian, 1 Bernoulli-probit, "
      "2 Bernoulli-logit, 3 Poisson, 4 softmax, 5 robust-max (num_classes C >= 2, y in 0..C-1; "
      "robust-max: param is epsilon). mu, var: [N], or [N, C] for the multi-class ones. Returns (f [N], dmu, "
      "dvar (the shape of mu), dparam [N]); dparam is the derivative in param: the Gaussian variance or a "
      "Bernoulli's or robust-max's label-noise probability (0 for the others).");

  m.def(
      "check_labels",
      [](int kind, double param, int n_gh, int num_classes, const py::array& y) {
        const auto lik = make_likelihood(kind, param, n_gh, num_classes);
        likelihoods::check_labels(lik, as_vector(y, "y"), y.shape(0));
      },
      py::arg("kind"), py::arg("param"), py::arg("n_gh"), py::arg("num_classes"), py::arg("y"),
      "ValueError naming the first label of y [N] outside the likelihood's support.");

  m.def(
      "predict_mean_and_var",
      [](int kind, double param, int n_gh, int num_classes, const py::array& mu, const py::array& var) {
        const auto lik = make_likelihood(kind, param, n_gh, num_classes);
        const double* muv = latent_array(mu, "mu", lik);
        const index_t n = mu.shape(0);
        const double* varv = latent_array(var, "var", lik, n);
        auto mean = new_latent_array(lik, n), y_var = new_latent_array(lik, n);
        {
          py::gil_scoped_release release;
          likelihoods::predict_mean_and_var(lik, muv, varv, n, mean.mutable_data(),
                                            y_var.mutable_data());
        }
        return py::make_tuple(mean, y_var);
      },
      py::arg("kind"), py::arg("param"), py::arg("n_gh"), py::arg("num_classes"), py::arg("mu"), py::arg("var"),
      "Predictive mean and variance of y at f ~ N(mu, var). Returns (mean [N], var [N]); for the "
      "multi-class ones (mu, var [N, C]): (P(y = c) [N, C], P(y = c) (1 - P(y = c)) [N, C]).");

  m.def(
      "predict_log_class_probabilities",
      [](int kind, double param, int n_gh, int num_classes, const py::array& mu, const py::array& var) {
        const auto lik = make_likelihood(kind, param, n_gh, num_classes);
        const double* muv = latent_array(mu, "mu", lik);
        const index_t n = mu.shape(0);
        const double* varv = latent_array(var, "var", lik, n);
        auto out = new_latent_array(lik, n);
        {
          py::gil_scoped_release release;
          likelihoods::predict_log_class_probabilities(lik, muv, varv, n, out.mutable_data());
        }
        return out;
      },
      py::arg("kind"), py::arg("param"), py::arg("n_gh"), py::arg("num_classes"), py::arg("mu"), py::arg("var"),
      "log P(y = c) at f ~ N(mu, var) [N, C] (softmax: log E[softmax_c(f)] in log space; robust-max).");

  m.def(
      "predict_log_density",
      [](int kind, double param, int n_gh, int num_classes, const py::array& y, const py::array& mu,
         const py::array& var) {
        const auto lik = make_likelihood(kind, param, n_gh, num_classes);
        const double* yv = as_vector(y, "y");
        const index_t n = y.shape(0);
        const double* muv = latent_array(mu, "mu", lik, n);
        const double* varv = latent_array(var, "var", lik, n);
        auto out = new_vector(n);
        {
          py::gil_scoped_release release;
          likelihoods::predict_log_density(lik, yv, muv, varv, n, out.mutable_data());
        }
        return out;
      },
      py::arg("kind"), py::arg("param"), py::arg("n_gh"), py::arg("num_classes"), py::arg("y"), py::arg("mu"),
      py::arg("var"),
      "log of the predictive density of y at f ~ N(mu, var), per point [N] (mu, var: [N], or "
      "[N, C] for the multi-class ones).");
}

}  // namespace pygpfast::bind
