#include <algorithm>

#include "bind_common.hpp"
#include "pygpfast/svgp/mf.hpp"

namespace pygpfast::bind {

void bind_svgp_mf(py::module_& m) {
  m.def(
      "mf_bound",
      [](const py::array& codes, const py::array& params, const py::array& Z, const py::array& X,
         const py::array& y, const py::array& a, double jitter, bool solve_a, int max_iter,
         double tol, bool with_grad) {
        const auto Zv = as_matrix(Z, "Z");
        const kernels::Kernel kernel = make_kernel(codes, params, Zv.cols);
        svgp_mf::Data data;
        data.X = as_matrix(X, "X");
        data.y = as_vector(y, "y", data.X.rows);
        const index_t N = data.X.rows, M = Zv.rows, D = Zv.cols;
        const double* a_in = as_vector(a, "a", N);
        py::array_t<double> a_out = new_vector(N);
        std::copy(a_in, a_in + N, a_out.mutable_data());
        py::array_t<double> d_a = new_vector(N), d_Z = new_matrix(M, D),
                            d_kern = new_vector(kernel.num_params());
        svgp_mf::Gradients g;
        g.a = d_a.mutable_data();
        g.Z = view_of(d_Z);
        g.kernel = d_kern.mutable_data();
        svgp_mf::InnerSolve solve;
        solve.max_iter = max_iter;
        solve.tol = tol;
        svgp_mf::Result r;
        {
          py::gil_scoped_release release;
          r = svgp_mf::bound(kernel, Zv, data, a_out.mutable_data(), jitter,
                             solve_a ? &solve : nullptr, with_grad ? &g : nullptr);
        }
        py::object grads = py::none();
        if (with_grad) grads = py::make_tuple(d_a, d_Z, d_kern);
        return py::make_tuple(r.bound, a_out, r.jitter,
                              py::make_tuple(r.inner_iterations, r.inner_residual, r.inner_converged),
                              grads);
      },
      py::arg("codes"), py::arg("params"), py::kw_only(), py::arg("Z"), py::arg("X"), py::arg("y"),
      py::arg("a"),
      py::arg("jitter"), py::arg("solve_a"), py::arg("max_iter"), py::arg("tol"),
      py::arg("with_grad"),
      "Sparse mean-field bound (seed 000 eq. 12), y in {0, 1}. With solve_a, a is first replaced "
      "by its optimum (starting from the given a). Returns (bound, a [N], extra_jitter, "
      "(inner_iterations, inner_residual, inner_converged), grads) with grads = (d_a [N], "
      "d_Z [M, D], d_kernel [P]) or None.");

  m.def(
      "mf_posterior",
      [](const py::array& codes, const py::array& params, const py::array& Z, const py::array& X,
         const py::array& y, const py::array& a, double jitter) {
        const auto Zv = as_matrix(Z, "Z");
        const kernels::Kernel kernel = make_kernel(codes, params, Zv.cols);
        svgp_mf::Data data;
        data.X = as_matrix(X, "X");
        data.y = as_vector(y, "y", data.X.rows);
        const double* av = as_vector(a, "a", data.X.rows);
        const index_t M = Zv.rows;
        py::array_t<double> q_mu = new_vector(M), q_sqrt = new_matrix(M, M);
        double extra = 0.0;
        {
          py::gil_scoped_release release;
          extra = svgp_mf::posterior(kernel, Zv, data, av, jitter, q_mu.mutable_data(),
                                     view_of(q_sqrt));
        }
        return py::make_tuple(q_mu, q_sqrt, extra);
      },
      py::arg("codes"), py::arg("params"), py::kw_only(), py::arg("Z"), py::arg("X"), py::arg("y"),
      py::arg("a"),
      py::arg("jitter"),
      "Gaussian approximation of the mean-field posterior at the inducing points, whitened: "
      "(q_mu [M], q_sqrt [M, M] lower, extra_jitter).");
}

}  // namespace pygpfast::bind
