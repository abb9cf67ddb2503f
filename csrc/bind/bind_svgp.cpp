#include "bind_common.hpp"
#include "pygpfast/svgp.hpp"

namespace pygpfast::bind {

namespace {

svgp::Variational make_variational(const py::array& Z, const py::array& q_mu, const py::array& q_sqrt,
                                   bool whiten) {
  svgp::Variational q;
  q.Z = as_matrix(Z, "Z");
  q.q_mu = as_vector(q_mu, "q_mu", q.Z.rows);
  q.q_sqrt = as_matrix(q_sqrt, "q_sqrt");
  q.whiten = whiten;
  return q;
}

}  // namespace

void bind_svgp(py::module_& m) {
  m.def(
      "svgp_elbo",
      [](const py::array& codes, const py::array& params, int lik_kind, double lik_variance, int n_gh,
         const py::array& Z, const py::array& q_mu, const py::array& q_sqrt, bool whiten,
         const py::array& X, const py::array& y, double scale, double jitter, bool with_grad) {
        const kernels::Kernel kernel = make_kernel(codes, params, as_matrix(Z, "Z").cols);
        const auto lik = make_likelihood(lik_kind, lik_variance, n_gh);
        const auto q = make_variational(Z, q_mu, q_sqrt, whiten);
        svgp::Batch batch;
        batch.X = as_matrix(X, "X");
        batch.y = as_vector(y, "y", batch.X.rows);
        batch.scale = scale;
        const index_t M = q.Z.rows, D = q.Z.cols;
        py::array_t<double> d_mu = new_vector(M), d_sqrt = new_matrix(M, M), d_Z = new_matrix(M, D),
                            d_kern = new_vector(kernel.num_params());
        double d_lik = 0.0;
        svgp::Gradients g;
        g.q_mu = d_mu.mutable_data();
        g.q_sqrt = view_of(d_sqrt);
        g.Z = view_of(d_Z);
        g.kernel = d_kern.mutable_data();
        g.likelihood_variance = &d_lik;
        svgp::Result r;
        {
          py::gil_scoped_release release;
          r = svgp::elbo(kernel, lik, q, batch, jitter, with_grad ? &g : nullptr);
        }
        py::object grads = py::none();
        if (with_grad) grads = py::make_tuple(d_mu, d_sqrt, d_Z, d_kern, d_lik);
        return py::make_tuple(r.elbo, r.expected_log_lik, r.kl, r.jitter, grads);
      },
      py::arg("codes"), py::arg("params"), py::arg("lik_kind"), py::arg("lik_variance"),
      py::arg("n_gh"), py::arg("Z"), py::arg("q_mu"), py::arg("q_sqrt"), py::arg("whiten"),
      py::arg("X"), py::arg("y"), py::arg("scale"), py::arg("jitter"), py::arg("with_grad"),
      "SVGP ELBO on a minibatch. Returns (elbo, expected_log_lik, kl, extra_jitter, grads) with "
      "grads = (d_q_mu [M], d_q_sqrt [M, M], d_Z [M, D], d_kernel [P], d_lik_variance) or None.");

  m.def(
      "svgp_predict_f",
      [](const py::array& codes, const py::array& params, const py::array& Z, const py::array& q_mu,
         const py::array& q_sqrt, bool whiten, const py::array& Xnew, double jitter) {
        const kernels::Kernel kernel = make_kernel(codes, params, as_matrix(Z, "Z").cols);
        const auto q = make_variational(Z, q_mu, q_sqrt, whiten);
        const auto Xv = as_matrix(Xnew, "Xnew");
        py::array_t<double> mean = new_vector(Xv.rows), var = new_vector(Xv.rows);
        double extra = 0.0;
        {
          py::gil_scoped_release release;
          extra = svgp::predict_f(kernel, q, Xv, jitter, mean.mutable_data(), var.mutable_data());
        }
        return py::make_tuple(mean, var, extra);
      },
      py::arg("codes"), py::arg("params"), py::arg("Z"), py::arg("q_mu"), py::arg("q_sqrt"),
      py::arg("whiten"), py::arg("Xnew"), py::arg("jitter"),
      "Marginals of q(f) at Xnew: (mean [T], var [T], extra_jitter).");
}

}  // namespace pygpfast::bind
