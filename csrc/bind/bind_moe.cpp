// pygpfast._core.moe: the per-expert work of IS-MOE (csrc/include/pygpfast/moe/experts.hpp).
// Thin: converts arrays, releases the GIL, calls the core, wraps the results in dicts.
#include <cstdint>
#include <string>
#include <vector>

#include "bind_common.hpp"
#include "pygpfast/moe/experts.hpp"

namespace pygpfast::bind {

namespace {

moe::Likelihood parse_likelihood(const std::string& name) {
  if (name == "gaussian") return moe::Likelihood::Gaussian;
  if (name == "probit") return moe::Likelihood::Probit;
  if (name == "logit") return moe::Likelihood::Logit;
  throw std::invalid_argument("likelihood must be 'gaussian', 'probit' or 'logit', got '" + name + "'");
}

const index_t* as_index_vector(const py::array& a, const char* name) {
  if (!py::array_t<std::int64_t>::check_(a))
    throw std::invalid_argument(std::string(name) + " must have dtype int64, got " + std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style))
    throw std::invalid_argument(std::string(name) + " must be C-contiguous; use numpy.ascontiguousarray");
  check_aligned(a, name);
  if (a.ndim() != 1)
    throw std::invalid_argument(std::string(name) + " must be 1-D, got " + std::to_string(a.ndim()) + "-D");
  return static_cast<const index_t*>(a.data());
}

// The kernel spec, and the kernel parameters: [P] shared or [blocks, P] per block.
struct KernelArgs {
  moe::KernelSpec spec;
  const double* params = nullptr;
  index_t stride = 0;
};

KernelArgs kernel_args(const py::array& codes, const py::array& params, index_t blocks, index_t D) {
  KernelArgs k;
  k.spec.codes = as_int32_vector(codes, "codes");
  k.spec.n_codes = codes.shape(0);
  check_float64_c(params, "params");
  if (params.ndim() == 1) {
    k.spec.n_params = params.shape(0);
  } else if (params.ndim() == 2) {
    if (params.shape(0) != blocks)
      throw std::invalid_argument("params must be [P] or [blocks, P] with blocks = " + std::to_string(blocks) +
                                  ", got " + std::to_string(params.shape(0)) + " rows");
    k.spec.n_params = params.shape(1);
    k.stride = k.spec.n_params;
  } else {
    throw std::invalid_argument("params must be [P] or [blocks, P]");
  }
  k.params = static_cast<const double*>(params.data());
  // (the parser checks the count and the values)
  (void)kernels::Kernel(k.spec.codes, k.spec.n_codes, k.params, k.spec.n_params, D);
  return k;
}

// A float or a float64 array [blocks]: (pointer, stride). `store` holds the float.
const double* per_block(const py::object& v, index_t blocks, const char* name, double& store, index_t& stride) {
  if (py::isinstance<py::array>(v)) {
    stride = 1;
    return as_vector(py::reinterpret_borrow<py::array>(v), name, blocks);
  }
  store = v.cast<double>();
  stride = 0;
  return &store;
}

// An optional float64 array of length n (None: null).
const double* optional_vector(const py::object& v, const char* name, index_t n) {
  if (v.is_none()) return nullptr;
  if (!py::isinstance<py::array>(v)) throw std::invalid_argument(std::string(name) + " must be a float64 ndarray or None");
  return as_vector(py::reinterpret_borrow<py::array>(v), name, n);
}

struct BlocksArgs {
  const index_t* offsets = nullptr;
  const index_t* rows = nullptr;
  index_t blocks = 0, total = 0, factor_size = 0;
};

BlocksArgs blocks_args(const py::array& offsets, const py::array& rows) {
  BlocksArgs b;
  b.offsets = as_index_vector(offsets, "offsets");
  b.rows = as_index_vector(rows, "rows");
  if (offsets.shape(0) < 2) throw std::invalid_argument("offsets must have at least 2 entries (one block)");
  b.blocks = offsets.shape(0) - 1;
  if (b.offsets[0] != 0) throw std::invalid_argument("offsets[0] must be 0");
  for (index_t p = 0; p < b.blocks; ++p)
    if (b.offsets[p + 1] < b.offsets[p]) throw std::invalid_argument("offsets must be non-decreasing");
  b.total = b.offsets[b.blocks];
  if (rows.shape(0) != b.total)
    throw std::invalid_argument("rows has " + std::to_string(rows.shape(0)) + " entries but offsets[-1] = " +
                                std::to_string(b.total));
  for (index_t p = 0; p < b.blocks; ++p) {
    const index_t n = b.offsets[p + 1] - b.offsets[p];
    b.factor_size += n * n;
  }
  return b;
}

py::array_t<std::int64_t> factor_offsets_array(const BlocksArgs& b) {
  py::array_t<std::int64_t> out(static_cast<py::ssize_t>(b.blocks + 1));
  if (b.blocks > 0 && b.offsets[0] == 0) {
    moe::factor_offsets(b.offsets, b.blocks, out.mutable_data());
  }
  return out;
}

}  // namespace

void bind_moe(py::module_& m) {
  m.def(
      "fit_blocks",
      [](const py::array& codes, const py::array& params, const py::array& X, const py::array& y,
         const py::array& offsets, const py::array& rows, const std::string& likelihood, bool optimize, int max_iter,
         double tol, double gtol, const py::object& noise_variance, const py::object& mean, bool fit_noise,
         bool fit_mean, const py::object& prior_loc, const py::object& prior_scale, const py::object& lower,
         const py::object& upper, double scale, double jitter, double max_jitter, int newton_max_iter,
         double newton_tol) {
        const moe::Likelihood lik = parse_likelihood(likelihood);
        const bool gaussian = lik == moe::Likelihood::Gaussian;
        const ConstMatrixView Xv = as_matrix(X, "X");
        const double* yv = as_vector(y, "y", Xv.rows);
        const BlocksArgs b = blocks_args(offsets, rows);
        const KernelArgs k = kernel_args(codes, params, b.blocks, Xv.cols);
        const index_t P = k.spec.n_params;
        moe::Start start;
        start.params = k.params;
        start.params_stride = k.stride;
        double noise_store = 0.0, mean_store = 0.0;
        start.noise_variance = per_block(noise_variance, b.blocks, "noise_variance", noise_store, start.noise_stride);
        start.mean = per_block(mean, b.blocks, "mean", mean_store, start.mean_stride);
        moe::FitOptions o;
        o.likelihood = lik;
        o.optimize = optimize;
        o.fit_noise = fit_noise;
        o.fit_mean = fit_mean;
        o.lbfgs.max_iter = max_iter;
        o.lbfgs.ftol = tol;
        o.lbfgs.gtol = gtol;
        o.prior_loc = optional_vector(prior_loc, "prior_loc", P + 2);
        o.prior_scale = optional_vector(prior_scale, "prior_scale", P + 2);
        if ((o.prior_loc == nullptr) != (o.prior_scale == nullptr))
          throw std::invalid_argument("prior_loc and prior_scale must be given together");
        o.lower = optional_vector(lower, "lower", P + 2);
        o.upper = optional_vector(upper, "upper", P + 2);
        o.scale = scale;
        o.jitter.initial = jitter;
        o.jitter.max = max_jitter;
        o.laplace.max_iter = newton_max_iter;
        o.laplace.tol = newton_tol;

        py::array_t<double> p_out = new_matrix(b.blocks, P), noise_out = new_vector(b.blocks),
                            mean_out = new_vector(b.blocks), logev = new_vector(b.blocks),
                            logprior = new_vector(b.blocks), objective = new_vector(b.blocks),
                            jit = new_vector(b.blocks), alpha = new_vector(b.total), factor = new_vector(b.factor_size);
        py::array_t<std::int32_t> iters(static_cast<py::ssize_t>(b.blocks)), evals(static_cast<py::ssize_t>(b.blocks)),
            status(static_cast<py::ssize_t>(b.blocks));
        py::array_t<double> f_out = new_vector(gaussian ? 0 : b.total), W_out = new_vector(gaussian ? 0 : b.total);
        moe::FitOutputs out;
        out.params = p_out.mutable_data();
        out.noise_variance = noise_out.mutable_data();
        out.mean = mean_out.mutable_data();
        out.log_evidence = logev.mutable_data();
        out.log_prior = logprior.mutable_data();
        out.objective = objective.mutable_data();
        out.jitter = jit.mutable_data();
        out.iterations = iters.mutable_data();
        out.evaluations = evals.mutable_data();
        out.status = status.mutable_data();
        out.alpha = alpha.mutable_data();
        out.factor = factor.mutable_data();
        if (!gaussian) {
          out.f = f_out.mutable_data();
          out.W = W_out.mutable_data();
        }
        {
          py::gil_scoped_release release;
          moe::fit_blocks(k.spec, start, Xv, yv, b.offsets, b.rows, b.blocks, o, out);
        }
        py::dict d;
        d["params"] = p_out;
        d["log_evidence"] = logev;
        d["log_prior"] = logprior;
        d["objective"] = objective;
        d["jitter"] = jit;
        d["iterations"] = iters;
        d["evaluations"] = evals;
        d["status"] = status;
        d["alpha"] = alpha;
        d["factor"] = factor;
        d["factor_offsets"] = factor_offsets_array(b);
        if (gaussian) {
          d["noise_variance"] = noise_out;
          d["mean"] = mean_out;
        } else {
          d["f"] = f_out;
          d["W"] = W_out;
        }
        return d;
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::arg("y"), py::arg("offsets"), py::arg("rows"),
      py::kw_only(), py::arg("likelihood") = "gaussian", py::arg("optimize") = true, py::arg("max_iter") = 200,
      py::arg("tol") = 1e-10, py::arg("gtol") = 1e-6, py::arg("noise_variance") = 1.0, py::arg("mean") = 0.0,
      py::arg("fit_noise") = true, py::arg("fit_mean") = false, py::arg("prior_loc") = py::none(),
      py::arg("prior_scale") = py::none(), py::arg("lower") = py::none(), py::arg("upper") = py::none(),
      py::arg("scale") = 1.0, py::arg("jitter") = 1e-10, py::arg("max_jitter") = 1e-4,
      py::arg("newton_max_iter") = 100, py::arg("newton_tol") = 1e-10,
      "Fits every block (rows[offsets[p]:offsets[p+1]] of X [N, D], y [N]) on OpenMP threads. params: kernel "
      "parameters [P] shared or [blocks, P] per block (the start, or the values used when optimize=False); "
      "noise_variance, mean: float or [blocks] (Gaussian). Optimisation in u = (log params, log noise, mean) "
      "maximises scale * log_evidence + log prior; prior_loc, prior_scale, lower, upper: [P + 2] in u (prior "
      "scale 0: none). Returns a dict: params [blocks, P], log_evidence, log_prior, objective, jitter [blocks], "
      "iterations, evaluations, status (int32 [blocks]; -1: not optimised), alpha [offsets[-1]], factor "
      "[sum n_p^2] with factor_offsets [blocks + 1]; noise_variance, mean [blocks] (Gaussian) or f, W "
      "[offsets[-1]] (probit, logit).");

  m.def(
      "predict_blocks",
      [](const py::array& codes, const py::array& params, const py::array& X, const py::array& offsets,
         const py::array& rows, const py::array& Xnew, const py::array& alpha, const py::array& factor,
         const std::string& likelihood, const py::object& noise_variance, const py::object& mean,
         const py::object& W, const py::object& test_offsets, const py::object& test_rows) {
        const moe::Likelihood lik = parse_likelihood(likelihood);
        const bool gaussian = lik == moe::Likelihood::Gaussian;
        const ConstMatrixView Xv = as_matrix(X, "X"), Xn = as_matrix(Xnew, "Xnew");
        const BlocksArgs b = blocks_args(offsets, rows);
        const KernelArgs k = kernel_args(codes, params, b.blocks, Xv.cols);
        moe::Start fitted;
        fitted.params = k.params;
        fitted.params_stride = k.stride;
        double noise_store = 0.0, mean_store = 0.0;
        if (gaussian) {
          if (noise_variance.is_none()) throw std::invalid_argument("noise_variance is required for 'gaussian'");
          fitted.noise_variance = per_block(noise_variance, b.blocks, "noise_variance", noise_store, fitted.noise_stride);
          fitted.mean = per_block(mean.is_none() ? py::float_(0.0) : mean, b.blocks, "mean", mean_store, fitted.mean_stride);
        }
        const double* a = as_vector(alpha, "alpha", b.total);
        const double* L = as_vector(factor, "factor", b.factor_size);
        const double* w = nullptr;
        if (!gaussian) {
          if (W.is_none()) throw std::invalid_argument("W is required for 'probit' and 'logit'");
          w = optional_vector(W, "W", b.total);
        }
        const index_t T = Xn.rows;
        if (test_offsets.is_none() != test_rows.is_none())
          throw std::invalid_argument("test_offsets and test_rows go together");
        moe::TestRows test;
        if (!test_offsets.is_none()) {
          const py::array to = test_offsets, tr = test_rows;
          if (to.ndim() != 1 || to.shape(0) != b.blocks + 1)
            throw std::invalid_argument("test_offsets must have blocks + 1 = " + std::to_string(b.blocks + 1) +
                                        " entries");
          test.offsets = as_index_vector(to, "test_offsets");
          if (tr.ndim() != 1 || tr.shape(0) != test.offsets[b.blocks])
            throw std::invalid_argument("test_rows must have test_offsets[-1] entries");
          test.rows = as_index_vector(tr, "test_rows");
        }
        py::array_t<double> mu = new_matrix(T, b.blocks), var = new_matrix(T, b.blocks), extra = new_matrix(T, b.blocks);
        if (test.offsets != nullptr) {  // (the pairs not listed: finite placeholders)
          std::fill(mu.mutable_data(), mu.mutable_data() + T * b.blocks, 0.0);
          std::fill(var.mutable_data(), var.mutable_data() + T * b.blocks, 0.0);
          std::fill(extra.mutable_data(), extra.mutable_data() + T * b.blocks, gaussian ? 1.0 : 0.5);
        }
        moe::PredictOutputs out;
        out.mean = mu.mutable_data();
        out.var = var.mutable_data();
        if (gaussian)
          out.var_y = extra.mutable_data();
        else
          out.prob = extra.mutable_data();
        {
          py::gil_scoped_release release;
          moe::predict_blocks(k.spec, fitted, Xv, b.offsets, b.rows, b.blocks, lik, a, L, w, Xn, out, test);
        }
        py::dict d;
        d["mean"] = mu;
        d["var"] = var;
        d[gaussian ? "var_y" : "prob"] = extra;
        return d;
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::arg("offsets"), py::arg("rows"), py::arg("Xnew"),
      py::arg("alpha"), py::arg("factor"), py::kw_only(), py::arg("likelihood") = "gaussian",
      py::arg("noise_variance") = py::none(), py::arg("mean") = py::none(), py::arg("W") = py::none(),
      py::arg("test_offsets") = py::none(), py::arg("test_rows") = py::none(),
      "Per block and test point of Xnew [T, D], from fit_blocks' outputs: a dict of mean and var (latent) "
      "[T, blocks], and var_y (Gaussian, noise included) or prob (P(y = 1): probit in closed form, logit by "
      "Gauss-Hermite quadrature) [T, blocks]. params as fitted ([P] or [blocks, P]); noise_variance, mean: "
      "float or [blocks] (Gaussian); W [offsets[-1]] (probit, logit). test_offsets [blocks + 1] and test_rows "
      "(by block, as offsets and rows): only those (test row, block) pairs; the others hold mean 0, var 0, "
      "var_y 1, prob 0.5.");

  m.def(
      "block_evidence",
      [](const py::array& codes, const py::array& params, const py::array& X, const py::array& y,
         const std::string& likelihood, double noise_variance, double mean, bool with_grad, double jitter,
         double max_jitter, int newton_max_iter, double newton_tol) {
        const moe::Likelihood lik = parse_likelihood(likelihood);
        const ConstMatrixView Xv = as_matrix(X, "X");
        const double* yv = as_vector(y, "y", Xv.rows);
        const KernelArgs k = kernel_args(codes, params, 1, Xv.cols);
        if (k.stride != 0) throw std::invalid_argument("params must be 1-D");
        const index_t n = Xv.rows, P = k.spec.n_params;
        moe::JitterOptions jo{jitter, max_jitter};
        moe::LaplaceOptions lo{newton_max_iter, newton_tol};
        moe::BlockWorkspace ws;
        py::array_t<double> d_params = new_vector(P);
        double d_noise = 0.0, d_mean = 0.0;
        moe::EvidenceResult r;
        {
          py::gil_scoped_release release;
          double* dp = with_grad ? d_params.mutable_data() : nullptr;
          if (lik == moe::Likelihood::Gaussian)
            r = moe::gaussian_evidence(k.spec, k.params, Xv, yv, noise_variance, mean, jo, ws, dp,
                                       with_grad ? &d_noise : nullptr, with_grad ? &d_mean : nullptr);
          else
            r = moe::laplace_evidence(k.spec, k.params, Xv, yv, lik, jo, lo, ws, dp);
        }
        auto copy = [](const std::vector<double>& v, index_t count) {
          py::array_t<double> a = new_vector(count);
          std::copy(v.begin(), v.begin() + count, a.mutable_data());
          return a;
        };
        py::dict d;
        d["log_evidence"] = r.log_evidence;
        d["jitter"] = r.jitter;
        d["alpha"] = copy(ws.alpha, n);
        py::array_t<double> L = new_matrix(n, n);
        std::copy(ws.L.begin(), ws.L.begin() + n * n, L.mutable_data());
        d["factor"] = L;
        if (with_grad) d["d_params"] = d_params;
        if (lik == moe::Likelihood::Gaussian) {
          if (with_grad) {
            d["d_noise_variance"] = d_noise;
            d["d_mean"] = d_mean;
          }
        } else {
          d["f"] = copy(ws.f, n);
          d["W"] = copy(ws.W, n);
          d["a"] = copy(ws.a, n);
          d["newton_iterations"] = r.newton_iterations;
        }
        return d;
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::arg("y"), py::kw_only(),
      py::arg("likelihood") = "gaussian", py::arg("noise_variance") = 1.0, py::arg("mean") = 0.0,
      py::arg("with_grad") = true, py::arg("jitter") = 1e-10, py::arg("max_jitter") = 1e-4,
      py::arg("newton_max_iter") = 100, py::arg("newton_tol") = 1e-10,
      "One block's evidence (X [n, D], y [n]): exact Gaussian log N(y | mean, K + noise_variance I), or "
      "Laplace's approximation for 'probit'/'logit' (y in {0, 1}). Returns a dict: log_evidence, jitter, "
      "alpha [n], factor [n, n], and with with_grad d_params [P] (positive parameters), d_noise_variance and "
      "d_mean (Gaussian); f (mode), W, a (f = K a) [n] and newton_iterations (Laplace).");
}

}  // namespace pygpfast::bind
