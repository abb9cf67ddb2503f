#include "bind_common.hpp"
#include "pygpfast/cvi/cvi.hpp"

namespace pygpfast::bind {

namespace {

// The local bound (kind, knots, a, b, c, num_classes, thresholds); the llp table may be empty
// for the kinds that do not use it.
cvi::LocalBound make_local_bound(int kind, const py::array& knots, const py::array& a,
                                 const py::array& b, const py::array& c, int num_classes,
                                 const py::array& thresholds) {
  cvi::LocalBound lb;
  lb.type = static_cast<cvi::LocalBoundType>(kind);
  lb.llp = make_piecewise_bound(knots, a, b, c);
  lb.num_classes = num_classes;
  lb.thresholds = to_std_vector(thresholds, "thresholds");
  cvi::validate(lb);
  return lb;
}

// An [L, N] float64 array (latent-major); returns its data.
const double* as_latent_array(const py::array& x, const char* name, index_t L, index_t N) {
  const ConstMatrixView X = as_matrix(x, name);
  if (X.rows != L || X.cols != N)
    throw std::invalid_argument(std::string(name) + " must be [" + std::to_string(L) + ", " +
                                std::to_string(N) + "], got [" + std::to_string(X.rows) + ", " +
                                std::to_string(X.cols) + "]");
  return X.data;
}

cvi::Options make_options(int max_iter, double tol, index_t block_size, int max_newton,
                          double skip_tol, bool coupled_means) {
  cvi::Options opt;
  opt.coupled_means = coupled_means;
  opt.skip_tol = skip_tol;
  opt.max_iter = max_iter;
  opt.tol = tol;
  opt.block_size = block_size;
  opt.max_newton = max_newton;
  return opt;
}

py::dict result_dict(const cvi::Result& r) {
  py::dict d;
  d["bound"] = r.bound;
  d["iterations"] = r.iterations;
  d["converged"] = r.converged;
  d["flops"] = r.flops;
  d["bound_evaluations"] = r.bound_evaluations;
  d["max_residual_alpha"] = r.max_residual_alpha;
  d["max_residual_lambda"] = r.max_residual_lambda;
  d["damped_sweeps"] = r.damped_sweeps;
  d["bracketed_solves"] = r.bracketed_solves;
  d["refused_solves"] = r.refused_solves;
  d["coupled_steps"] = r.coupled_steps;
  d["undone_coupled_steps"] = r.undone_coupled_steps;
  auto h = new_matrix(static_cast<index_t>(r.history.size()), 4);
  for (std::size_t i = 0; i < r.history.size(); ++i) {
    double* row = h.mutable_data() + 4 * i;
    row[0] = r.history[i].bound;
    row[1] = r.history[i].flops;
    row[2] = r.history[i].bound_evaluations;
    row[3] = r.history[i].seconds;
  }
  d["history"] = h;
  return d;
}

py::array_t<double> copy_of(const double* p, index_t rows, index_t cols) {
  auto out = new_matrix(rows, cols);
  std::copy(p, p + rows * cols, out.mutable_data());
  return out;
}

#define PYGPFAST_LOCAL_BOUND_ARGS                                                           \
  py::arg("kind"), py::arg("knots"), py::arg("a"), py::arg("b"), py::arg("c"),             \
      py::arg("num_classes"), py::arg("thresholds")

}  // namespace

// The entry points take the kernel (codes, params), the local bound (kind ... thresholds, as
// pygpfast.cvi.LocalBound._core_args() lists them) and the data (X or Sigma, y) by position, and
// everything else by keyword only.
void bind_cvi(py::module_& m) {
  m.def(
      "local_bounds",
      [](int kind, const py::array& knots, const py::array& a, const py::array& b,
         const py::array& c, int num_classes, const py::array& thresholds, const py::array& y,
         const py::array& mean, const py::array& var) {
        const auto lb = make_local_bound(kind, knots, a, b, c, num_classes, thresholds);
        const double* yv = as_vector(y, "y");
        const index_t N = y.shape(0), L = lb.num_latent();
        const double* mv = as_latent_array(mean, "m", L, N);
        const double* vv = as_latent_array(var, "v", L, N);
        for (index_t i = 0; i < L * N; ++i)
          if (!(vv[i] >= 0.0 && std::isfinite(vv[i]) && std::isfinite(mv[i])))
            throw std::invalid_argument("m must be finite and v finite and >= 0");
        cvi::check_labels(lb, yv, N);
        auto value = new_vector(N), dm = new_matrix(L, N), dv = new_matrix(L, N),
             d2m = new_matrix(L, N), dphi = new_vector(lb.num_thresholds());
        {
          py::gil_scoped_release release;
          cvi::local_bounds(lb, yv, N, mv, vv, value.mutable_data(), dm.mutable_data(),
                            dv.mutable_data(), d2m.mutable_data(), dphi.mutable_data());
        }
        return py::make_tuple(value, dm, dv, d2m, dphi);
      },
      PYGPFAST_LOCAL_BOUND_ARGS, py::arg("y"), py::kw_only(), py::arg("m"), py::arg("v"),
      "Local variational bounds f_b(y_n, m_n, v_n) per point, m and v [L, N] latent-major. "
      "Returns (value [N], dm [L, N], dv [L, N], d2m [L, N], dthresholds [K-1]).");

  m.def(
      "infer",
      [](int kind, const py::array& knots, const py::array& a, const py::array& b,
         const py::array& c, int num_classes, const py::array& thresholds, const py::array& y,
         const py::array& Sigma, const py::array& mean, const py::array& alpha,
         const py::array& lambda, int max_iter, double tol, index_t block_size, int max_newton,
         double skip_tol, bool coupled_means, bool return_V) {
        const auto lb = make_local_bound(kind, knots, a, b, c, num_classes, thresholds);
        const ConstMatrixView S = as_matrix(Sigma, "Sigma");
        const index_t N = S.rows, L = lb.num_latent();
        const double* yv = as_vector(y, "y", N);
        const double* mv = as_vector(mean, "mean", L);
        auto al = copy_of(as_latent_array(alpha, "alpha", L, N), L, N);
        auto la = copy_of(as_latent_array(lambda, "lambda", L, N), L, N);
        const auto opt = make_options(max_iter, tol, block_size, max_newton, skip_tol, coupled_means);
        py::array_t<double> V;
        if (return_V) V = new_array3(L, N, N);
        cvi::Result r;
        {
          py::gil_scoped_release release;
          r = cvi::infer(lb, yv, S, mv, al.mutable_data(), la.mutable_data(), opt,
                         return_V ? V.mutable_data() : nullptr);
        }
        return py::make_tuple(result_dict(r), al, la, return_V ? py::object(V) : py::none());
      },
      PYGPFAST_LOCAL_BOUND_ARGS, py::arg("y"), py::arg("Sigma"), py::kw_only(), py::arg("mean"),
      py::arg("alpha"), py::arg("lambda_"), py::arg("max_iter"), py::arg("tol"),
      py::arg("block_size"), py::arg("max_newton"), py::arg("skip_tol"), py::arg("coupled_means"),
      py::arg("return_V"),
      "Algorithm 1 of seed 004 from (alpha, lambda) [L, N] for the prior N(mean_l, Sigma). "
      "Returns (result dict, alpha, lambda, V [L, N, N] or None).");

  m.def(
      "fit_step",
      [](const py::array& codes, const py::array& params, int kind, const py::array& knots,
         const py::array& a, const py::array& b, const py::array& c, int num_classes,
         const py::array& thresholds, const py::array& X, const py::array& y,
         const py::array& mean, double jitter, const py::array& alpha, const py::array& lambda,
         int max_iter, double tol, index_t block_size, int max_newton, double skip_tol,
         bool with_grad, bool return_Pi) {
        const auto Xv = as_matrix(X, "X");
        const kernels::Kernel kernel = make_kernel(codes, params, Xv.cols);
        const auto lb = make_local_bound(kind, knots, a, b, c, num_classes, thresholds);
        const index_t N = Xv.rows, L = lb.num_latent();
        const double* yv = as_vector(y, "y", N);
        const double* mv = as_vector(mean, "mean", L);
        auto al = copy_of(as_latent_array(alpha, "alpha", L, N), L, N);
        auto la = copy_of(as_latent_array(lambda, "lambda", L, N), L, N);
        const auto opt = make_options(max_iter, tol, block_size, max_newton, skip_tol, true);
        auto dk = new_vector(kernel.num_params()), dmean = new_vector(L),
             dphi = new_vector(lb.num_thresholds());
        py::array_t<double> Pi;
        if (return_Pi) Pi = new_array3(L, N, N);
        cvi::Gradients g;
        g.kernel = dk.mutable_data();
        g.mean = dmean.mutable_data();
        g.thresholds = dphi.mutable_data();
        std::fill(g.thresholds, g.thresholds + lb.num_thresholds(), 0.0);
        cvi::Result r;
        {
          py::gil_scoped_release release;
          r = cvi::fit_step(kernel, lb, Xv, yv, mv, jitter, al.mutable_data(), la.mutable_data(), opt,
                            with_grad ? &g : nullptr, return_Pi ? Pi.mutable_data() : nullptr);
        }
        py::object grads = py::none();
        if (with_grad) grads = py::make_tuple(dk, dmean, dphi);
        return py::make_tuple(result_dict(r), al, la, grads,
                              return_Pi ? py::object(Pi) : py::none());
      },
      py::arg("codes"), py::arg("params"), PYGPFAST_LOCAL_BOUND_ARGS, py::arg("X"), py::arg("y"),
      py::kw_only(), py::arg("mean"), py::arg("jitter"), py::arg("alpha"), py::arg("lambda_"),
      py::arg("max_iter"), py::arg("tol"), py::arg("block_size"), py::arg("max_newton"),
      py::arg("skip_tol"), py::arg("with_grad"), py::arg("return_Pi"),
      "Inference at Sigma = K(X, X) + jitter mean(diag K) I from the warm start (alpha, lambda) "
      "and the bound's "
      "gradients at the optimum. Returns (result dict, alpha, lambda, (d_kernel [P], d_mean [L], "
      "d_thresholds [K-1]) or None, Pi [L, N, N] or None).");

  m.def(
      "oa_objective",
      [](int kind, const py::array& knots, const py::array& a, const py::array& b,
         const py::array& c, int num_classes, const py::array& thresholds, const py::array& y,
         const py::array& Sigma, const py::array& mean, const py::array& alpha,
         const py::array& lambda) {
        const auto lb = make_local_bound(kind, knots, a, b, c, num_classes, thresholds);
        const ConstMatrixView S = as_matrix(Sigma, "Sigma");
        const index_t N = S.rows, L = lb.num_latent();
        const double* yv = as_vector(y, "y", N);
        const double* mv = as_vector(mean, "mean", L);
        const double* al = as_latent_array(alpha, "alpha", L, N);
        const double* la = as_latent_array(lambda, "lambda", L, N);
        auto da = new_matrix(L, N), dl = new_matrix(L, N);
        double flops = 0.0, evals = 0.0, value = 0.0;
        {
          py::gil_scoped_release release;
          value = cvi::oa_objective(lb, yv, S, mv, al, la, da.mutable_data(), dl.mutable_data(),
                                    &flops, &evals);
        }
        return py::make_tuple(value, da, dl, flops, evals);
      },
      PYGPFAST_LOCAL_BOUND_ARGS, py::arg("y"), py::arg("Sigma"), py::kw_only(), py::arg("mean"),
      py::arg("alpha"), py::arg("lambda_"),
      "The Opper-Archambeau objective (seed 004 eq. 11) at (alpha, lambda >= 0) [L, N]. Returns "
      "(value, d_alpha [L, N], d_lambda [L, N], flops, bound_evaluations).");

  m.def(
      "prior_covariance",
      [](const py::array& codes, const py::array& params, const py::array& X, double jitter) {
        const auto Xv = as_matrix(X, "X");
        const kernels::Kernel kernel = make_kernel(codes, params, Xv.cols);
        auto S = new_matrix(Xv.rows, Xv.rows);
        {
          py::gil_scoped_release release;
          cvi::prior_covariance(kernel, Xv, jitter, view_of(S), nullptr);
        }
        return S;
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::kw_only(), py::arg("jitter"),
      "The prior covariance of fit_step, K(X, X) + jitter mean(diag K) I [N, N].");

  m.def(
      "predictive_factor",
      [](const py::array& codes, const py::array& params, const py::array& X, double jitter,
         const py::array& lambda) {
        const auto Xv = as_matrix(X, "X");
        const kernels::Kernel kernel = make_kernel(codes, params, Xv.cols);
        const index_t N = Xv.rows, L = lambda.ndim() == 2 ? lambda.shape(0) : 0;
        const double* lam = as_latent_array(lambda, "lambda", L, N);
        auto F = new_array3(L, N, N);
        {
          py::gil_scoped_release release;
          cvi::predictive_factor(kernel, Xv, jitter, lam, L, F.mutable_data());
        }
        return F;
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::kw_only(), py::arg("jitter"),
      py::arg("lambda_"),
      "F [L, N, N]: lower Cholesky factors of I + Lambda_l^1/2 Sigma Lambda_l^1/2 (Sigma with the "
      "fit's relative jitter), for predict_f.");

  m.def(
      "predict_f",
      [](const py::array& codes, const py::array& params, const py::array& X,
         const py::array& Xnew, const py::array& mean, const py::array& alpha,
         const py::array& lambda, const py::array& F) {
        const auto Xv = as_matrix(X, "X");
        const auto Xn = as_matrix(Xnew, "Xnew");
        const kernels::Kernel kernel = make_kernel(codes, params, Xv.cols);
        const index_t N = Xv.rows, L = alpha.ndim() == 2 ? alpha.shape(0) : 0;
        const double* mv = as_vector(mean, "mean", L);
        const double* al = as_latent_array(alpha, "alpha", L, N);
        const double* lam = as_latent_array(lambda, "lambda", L, N);
        check_float64_c(F, "F");
        if (F.ndim() != 3 || F.shape(0) != L || F.shape(1) != N || F.shape(2) != N)
          throw std::invalid_argument("F must be [L, N, N]");
        auto mu = new_matrix(Xn.rows, L), var = new_matrix(Xn.rows, L);
        {
          py::gil_scoped_release release;
          cvi::predict_f(kernel, Xv, mv, al, lam, static_cast<const double*>(F.data()), L, Xn,
                         view_of(mu), view_of(var));
        }
        return py::make_tuple(mu, var);
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::arg("Xnew"), py::kw_only(),
      py::arg("mean"), py::arg("alpha"), py::arg("lambda_"), py::arg("F"),
      "Latent marginals at Xnew [T, D]: (mean [T, L], var [T, L]) from fit_step's alpha and "
      "lambda and predictive_factor's F.");
}

}  // namespace pygpfast::bind
