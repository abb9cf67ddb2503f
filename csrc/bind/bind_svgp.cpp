#include "bind_common.hpp"
#include "pygpfast/svgp/svgp.hpp"

#include <string>
#include <vector>

namespace pygpfast::bind {

namespace {

// q_mu [M] with q_sqrt [M, M] (one latent function), or q_mu [M, L] with q_sqrt [L, M, M];
// prior_mean [L] or None (zero).
svgp::Variational make_variational(const py::array& Z, const py::array& q_mu, const py::array& q_sqrt,
                                   bool whiten, const py::object& prior_mean) {
  svgp::Variational q;
  q.Z = as_matrix(Z, "Z");
  const index_t M = q.Z.rows;
  check_float64_c(q_mu, "q_mu");
  check_float64_c(q_sqrt, "q_sqrt");
  const auto* mu = static_cast<const double*>(q_mu.data());
  if (q_mu.ndim() == 1) {
    q.q_mu = ConstMatrixView(mu, q_mu.shape(0), 1);
    if (q_sqrt.ndim() != 2)
      throw std::invalid_argument("q_sqrt must be [M, M] when q_mu is [M]");
  } else if (q_mu.ndim() == 2) {
    q.q_mu = ConstMatrixView(mu, q_mu.shape(0), q_mu.shape(1));
    if (q_sqrt.ndim() != 3 || q_sqrt.shape(0) != q_mu.shape(1))
      throw std::invalid_argument("q_sqrt must be [L, M, M] when q_mu is [M, L]");
  } else {
    throw std::invalid_argument("q_mu must be [M] or [M, L]");
  }
  if (q.q_mu.rows != M)
    throw std::invalid_argument("q_mu has " + std::to_string(q.q_mu.rows) + " rows but Z has " +
                                std::to_string(M));
  const py::ssize_t r = q_sqrt.ndim();
  if (q_sqrt.shape(r - 1) != M || q_sqrt.shape(r - 2) != M)
    throw std::invalid_argument("q_sqrt must be made of [M, M] matrices with M = " + std::to_string(M));
  q.q_sqrt = static_cast<const double*>(q_sqrt.data());
  q.whiten = whiten;
  if (!prior_mean.is_none()) {
    // (an ndarray, not a sequence: the view must point into memory the caller keeps alive)
    if (!py::isinstance<py::array>(prior_mean))
      throw std::invalid_argument("prior_mean must be a float64 ndarray or None");
    q.mean = as_vector(py::reinterpret_borrow<py::array>(prior_mean), "prior_mean", q.num_latent());
  }
  return q;
}

// An uninitialised float64 array with the given shape.
py::array_t<double> new_array(std::vector<py::ssize_t> shape) { return py::array_t<double>(shape); }

std::vector<py::ssize_t> shape_of(const py::array& a) { return {a.shape(), a.shape() + a.ndim()}; }

}  // namespace

void bind_svgp(py::module_& m) {
  m.def(
      "elbo",
      [](const py::array& codes, const py::array& params, int lik_kind, double lik_param, int n_gh,
         int num_classes, const py::array& Z, const py::array& q_mu, const py::array& q_sqrt,
         bool whiten, const py::array& X, const py::array& y, double scale, double jitter,
         bool with_grad, bool natural, const std::string& path, bool return_path, const py::object& prior_mean) {
        svgp::Path p = svgp::Path::Auto;
        if (path == "solve")
          p = svgp::Path::Solve;
        else if (path == "precomputed")
          p = svgp::Path::Precomputed;
        else if (path != "auto")
          throw std::invalid_argument("path must be 'auto', 'solve' or 'precomputed', got '" + path + "'");
        const kernels::Kernel kernel = make_kernel(codes, params, as_matrix(Z, "Z").cols);
        const auto lik = make_likelihood(lik_kind, lik_param, n_gh, num_classes);
        const auto q = make_variational(Z, q_mu, q_sqrt, whiten, prior_mean);
        svgp::Batch batch;
        batch.X = as_matrix(X, "X");
        batch.y = as_vector(y, "y", batch.X.rows);
        batch.scale = scale;
        const index_t M = q.Z.rows, D = q.Z.cols, L = q.num_latent();
        py::array_t<double> d_mu = new_array(shape_of(q_mu)), d_sqrt = new_array(shape_of(q_sqrt)),
                            d_Z = new_matrix(M, D), d_kern = new_vector(kernel.num_params()),
                            d_mean = new_vector(L);
        double d_lik = 0.0;
        svgp::Gradients g;
        if (natural) {
          g.ell_q_mu = d_mu.mutable_data();
          g.ell_q_cov = d_sqrt.mutable_data();
        } else {
          g.q_mu = MatrixView(d_mu.mutable_data(), M, L);
          g.q_sqrt = d_sqrt.mutable_data();
        }
        g.Z = view_of(d_Z);
        g.kernel = d_kern.mutable_data();
        g.likelihood_param = &d_lik;
        g.mean = d_mean.mutable_data();
        svgp::Result r;
        {
          py::gil_scoped_release release;
          r = svgp::elbo(kernel, lik, q, batch, jitter, with_grad ? &g : nullptr, p);
        }
        py::object grads = py::none();
        if (with_grad) grads = py::make_tuple(d_mu, d_sqrt, d_Z, d_kern, d_lik, d_mean);
        if (return_path)
          return py::tuple(py::make_tuple(r.elbo, r.expected_log_lik, r.kl, r.jitter, grads,
                                          r.path == svgp::Path::Precomputed ? "precomputed" : "solve"));
        return py::tuple(py::make_tuple(r.elbo, r.expected_log_lik, r.kl, r.jitter, grads));
      },
      py::arg("codes"), py::arg("params"), py::arg("lik_kind"), py::arg("lik_param"),
      py::arg("n_gh"), py::arg("num_classes"), py::kw_only(), py::arg("Z"), py::arg("q_mu"), py::arg("q_sqrt"),
      py::arg("whiten"), py::arg("X"), py::arg("y"), py::arg("scale"), py::arg("jitter"),
      py::arg("with_grad"), py::arg("natural") = false, py::arg("path") = "auto",
      py::arg("return_path") = false, py::arg("prior_mean") = py::none(),
      "SVGP ELBO on a minibatch, for q_mu [M] and q_sqrt [M, M] (one latent function) or q_mu [M, L] "
      "and q_sqrt [L, M, M]. Returns (elbo, expected_log_lik, kl, extra_jitter, grads) with grads = "
      "(d_q_mu, d_q_sqrt (shaped like their inputs), d_Z [M, D], d_kernel [P], d_lik_param, d_mean [L]) "
      "or None; prior_mean [L] (or None: zero) is the latent functions' constant prior mean. "
      "With natural=True the first two are instead d ELL / d m and d ELL / d S (symmetric, shaped like "
      "q_sqrt) of the scaled expected log-likelihood alone, in q's coordinates (v when whitened, u "
      "otherwise), for natural-gradient steps; the others are unchanged. path: 'auto' (the cheaper "
      "of the two evaluations of svgp.hpp), 'solve' or 'precomputed' (which falls back to 'solve' when "
      "its accuracy check fails); with return_path=True the path that ran is appended to the tuple.");

  m.def(
      "predict_f",
      [](const py::array& codes, const py::array& params, const py::array& Z, const py::array& q_mu,
         const py::array& q_sqrt, bool whiten, const py::array& Xnew, double jitter, const py::object& prior_mean) {
        const kernels::Kernel kernel = make_kernel(codes, params, as_matrix(Z, "Z").cols);
        const auto q = make_variational(Z, q_mu, q_sqrt, whiten, prior_mean);
        const auto Xv = as_matrix(Xnew, "Xnew");
        const index_t L = q.num_latent();
        std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(Xv.rows)};
        if (q_mu.ndim() == 2) shape.push_back(static_cast<py::ssize_t>(L));
        py::array_t<double> mean = new_array(shape), var = new_array(shape);
        double extra = 0.0;
        {
          py::gil_scoped_release release;
          extra = svgp::predict_f(kernel, q, Xv, jitter, MatrixView(mean.mutable_data(), Xv.rows, L),
                                  MatrixView(var.mutable_data(), Xv.rows, L));
        }
        return py::make_tuple(mean, var, extra);
      },
      py::arg("codes"), py::arg("params"), py::kw_only(), py::arg("Z"), py::arg("q_mu"),
      py::arg("q_sqrt"), py::arg("whiten"), py::arg("Xnew"), py::arg("jitter"),
      py::arg("prior_mean") = py::none(),
      "Marginals of q(f) at Xnew: (mean, var, extra_jitter), [T] or [T, L] like q_mu's columns; the "
      "constant prior_mean [L] (None: zero) is included in mean.");
}

}  // namespace pygpfast::bind
