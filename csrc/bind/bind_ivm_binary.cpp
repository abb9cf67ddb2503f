// pygpfast._core.ivm: the binary IVM (ivm/binary.hpp). Thin: converts, checks shapes, releases
// the GIL, calls the core, wraps the results in dicts.
#include <cstdint>
#include <string>
#include <vector>

#include "bind_common.hpp"
#include "pygpfast/ivm/binary.hpp"

namespace pygpfast::bind {

namespace {

ivm::BinaryLikelihood make_binary_likelihood(const std::string& name, double bias, double noise_variance,
                                             int n_gh, double label_noise) {
  ivm::BinaryLikelihood lik;
  if (name == "probit")
    lik.kind = ivm::BinaryLikelihoodKind::Probit;
  else if (name == "gaussian")
    lik.kind = ivm::BinaryLikelihoodKind::Gaussian;
  else
    throw std::invalid_argument("likelihood must be 'probit' or 'gaussian', got '" + name + "'");
  lik.bias = bias;
  lik.noise_variance = noise_variance;
  lik.n_gh = n_gh;
  lik.label_noise = label_noise;
  ivm::validate(lik);
  return lik;
}

ivm::Criterion make_criterion(const std::string& name) {
  if (name == "entropy") return ivm::Criterion::Entropy;
  if (name == "kl") return ivm::Criterion::KL;
  throw std::invalid_argument("criterion must be 'entropy' or 'kl', got '" + name + "'");
}

// A 1-D integer array (any integer dtype) as int64 indices.
std::vector<index_t> as_indices(const py::array& a, const char* name) {
  if (a.ndim() != 1)
    throw std::invalid_argument(std::string(name) + " must be 1-D, got " + std::to_string(a.ndim()) + "-D");
  if (a.dtype().kind() != 'i' && a.dtype().kind() != 'u')
    throw std::invalid_argument(std::string(name) + " must have an integer dtype, got " +
                                std::string(py::str(a.dtype())));
  const auto c = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
  if (!c) throw std::invalid_argument(std::string(name) + " could not be converted to int64");
  check_aligned(c, name);
  return std::vector<index_t>(c.data(), c.data() + c.shape(0));
}

}  // namespace

void bind_ivm_binary(py::module_& m) {
  m.def(
      "binary_select",
      [](const py::array& codes, const py::array& params, const py::array& X, const py::array& y,
         index_t active_size, index_t n_random, std::uint64_t seed, const std::string& likelihood, double bias,
         double noise_variance, double label_noise, const std::string& criterion) {
        const auto Xv = as_matrix(X, "X");
        const double* yv = as_vector(y, "y", Xv.rows);
        const kernels::Kernel kernel = make_kernel(codes, params, Xv.cols);
        const auto lik = make_binary_likelihood(likelihood, bias, noise_variance, 32, label_noise);
        ivm::SelectOptions opt;
        opt.active_size = active_size;
        opt.n_random = n_random;
        opt.seed = seed;
        opt.criterion = make_criterion(criterion);
        if (active_size < 1 || active_size > Xv.rows)
          throw std::invalid_argument("active_size must be in [1, n] = [1, " + std::to_string(Xv.rows) +
                                      "], got " + std::to_string(active_size));
        const index_t n = Xv.rows, d = active_size;
        py::array_t<std::int32_t> active(static_cast<py::ssize_t>(d));
        py::array_t<double> site_b = new_vector(d), site_pi = new_vector(d), log_z = new_vector(d),
                            score = new_vector(d), beta = new_vector(d), xi = new_vector(d), h = new_vector(n),
                            a = new_vector(n), L = new_matrix(d, d), M = new_matrix(d, n);
        ivm::BinaryStats stats;
        {
          py::gil_scoped_release release;
          ivm::BinaryIVM model(kernel, Xv, yv, lik, d);
          ivm::select(model, opt);
          auto* act = active.mutable_data();
          for (index_t k = 0; k < d; ++k) {
            act[k] = static_cast<std::int32_t>(model.active()[k]);
            site_b.mutable_data()[k] = model.site_b()[k];
            site_pi.mutable_data()[k] = model.site_pi()[k];
            log_z.mutable_data()[k] = model.log_z()[k];
            score.mutable_data()[k] = model.scores()[k];
            beta.mutable_data()[k] = model.beta()[k];
            for (index_t l = 0; l < d; ++l) L.mutable_data()[k * d + l] = l <= k ? model.L()(k, l) : 0.0;
          }
          std::copy(model.mean(), model.mean() + n, h.mutable_data());
          std::copy(model.variance(), model.variance() + n, a.mutable_data());
          std::copy(model.M().data, model.M().data + d * n, M.mutable_data());
          model.xi(xi.mutable_data());
          stats = model.stats();
        }
        py::dict out;
        out["active"] = active;
        out["site_b"] = site_b;
        out["site_pi"] = site_pi;
        out["log_z"] = log_z;
        out["score"] = score;
        out["h"] = h;
        out["a"] = a;
        out["L"] = L;
        out["M"] = M;
        out["beta"] = beta;
        out["xi"] = xi;
        py::dict st;
        st["kernel_seconds"] = stats.kernel_seconds;
        st["stub_seconds"] = stats.stub_seconds;
        st["update_seconds"] = stats.update_seconds;
        st["score_seconds"] = stats.score_seconds;
        st["stub_flops"] = stats.stub_flops;
        out["stats"] = st;
        return out;
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::arg("y"), py::kw_only(), py::arg("active_size"),
      py::arg("n_random") = 2, py::arg("seed") = 0, py::arg("likelihood") = "probit", py::arg("bias") = 0.0,
      py::arg("noise_variance") = 1.0, py::arg("label_noise") = 0.0, py::arg("criterion") = "entropy",
      "Greedy IVM selection of an active set of `active_size` points from X [n, D], y [n] (+-1 for "
      "'probit', real for 'gaussian'): the first `n_random` at random, then by the largest information "
      "gain ('entropy': -1/2 log(a_new / a_old); 'kl'), ties and random picks from `seed`. Returns a dict: "
      "active int32 [d] (inclusion order), site_b, site_pi, log_z (ADF log normalisers), score [d]; the "
      "posterior marginals h, a [n]; L [d, d] (B = I + Pi^1/2 K_I Pi^1/2 = L L^T), M [d, n] (stubs "
      "L^-1 Pi^1/2 K_{I,.}), beta [d] (L^-1 Pi^-1/2 b), xi [d] (h = K_{.,I} xi); stats (seconds per phase, "
      "stub GEMV flops).");

  m.def(
      "binary_adf",
      [](const py::array& y, const py::array& h, const py::array& a, const std::string& likelihood, double bias,
         double noise_variance, double label_noise) {
        const double* yv = as_vector(y, "y");
        const index_t n = y.shape(0);
        const double* hv = as_vector(h, "h", n);
        const double* av = as_vector(a, "a", n);
        const auto lik = make_binary_likelihood(likelihood, bias, noise_variance, 32, label_noise);
        ivm::check_labels(lik, yv, n);
        for (index_t i = 0; i < n; ++i)
          if (!(av[i] >= 0.0) || !std::isfinite(av[i]) || !std::isfinite(hv[i]))
            throw std::invalid_argument("h must be finite and a finite and >= 0 (index " + std::to_string(i) + ")");
        py::array_t<double> log_z = new_vector(n), alpha = new_vector(n), nu = new_vector(n), b = new_vector(n),
                            pi = new_vector(n);
        {
          py::gil_scoped_release release;
          for (index_t i = 0; i < n; ++i) {
            const auto u = ivm::adf_update(lik, yv[i], hv[i], av[i]);
            log_z.mutable_data()[i] = u.log_z;
            alpha.mutable_data()[i] = u.alpha;
            nu.mutable_data()[i] = u.nu;
            b.mutable_data()[i] = u.site_b;
            pi.mutable_data()[i] = u.site_pi;
          }
        }
        py::dict out;
        out["log_z"] = log_z;
        out["alpha"] = alpha;
        out["nu"] = nu;
        out["site_b"] = b;
        out["site_pi"] = pi;
        return out;
      },
      py::arg("y"), py::arg("h"), py::arg("a"), py::kw_only(), py::arg("likelihood") = "probit",
      py::arg("bias") = 0.0, py::arg("noise_variance") = 1.0, py::arg("label_noise") = 0.0,
      "ADF updates of points with cavities N(h, a) ([n] each): dict of log_z = log E[P(y|u)], alpha = "
      "d log_z / dh, nu = -d^2 log_z / dh^2 (tilted mean h + a alpha, variance a (1 - a nu)) and the "
      "sites site_b, site_pi [n].");

  m.def(
      "binary_predict",
      [](const py::array& codes, const py::array& params, const py::array& X_active, const py::array& site_pi,
         const py::array& L, const py::array& beta, const py::array& Xnew, const std::string& likelihood,
         double bias, double noise_variance, double label_noise) {
        const auto XA = as_matrix(X_active, "X_active");
        const auto Xv = as_matrix(Xnew, "Xnew");
        const index_t d = XA.rows, T = Xv.rows;
        const double* pi = as_vector(site_pi, "site_pi", d);
        const double* bv = as_vector(beta, "beta", d);
        const auto Lv = as_matrix(L, "L");
        const kernels::Kernel kernel = make_kernel(codes, params, XA.cols);
        const auto lik = make_binary_likelihood(likelihood, bias, noise_variance, 32, label_noise);
        py::array_t<double> mean = new_vector(T), var = new_vector(T), proba = new_vector(T);
        {
          py::gil_scoped_release release;
          ivm::predict(kernel, XA, pi, Lv, bv, Xv, mean.mutable_data(), var.mutable_data());
          if (lik.kind == ivm::BinaryLikelihoodKind::Probit)
            ivm::probit_probability(lik, mean.data(), var.data(), T, proba.mutable_data());
        }
        py::dict out;
        out["mean"] = mean;
        out["var"] = var;
        if (lik.kind == ivm::BinaryLikelihoodKind::Probit) out["proba"] = proba;
        return out;
      },
      py::arg("codes"), py::arg("params"), py::arg("X_active"), py::kw_only(), py::arg("site_pi"), py::arg("L"),
      py::arg("beta"), py::arg("Xnew"), py::arg("likelihood") = "probit", py::arg("bias") = 0.0,
      py::arg("noise_variance") = 1.0, py::arg("label_noise") = 0.0,
      "Predictions at Xnew [T, D] from a selection (X_active = X[active] [d, D], site_pi [d], L [d, d], "
      "beta [d]): dict of the latent mean, var [T] (bias not included) and, for 'probit', proba [T] = "
      "P(y = +1) = eps + (1 - 2 eps) Phi((mean + bias) / sqrt(noise_variance + var)), eps = label_noise.");

  m.def(
      "binary_bound",
      [](const py::array& codes, const py::array& params, const py::array& X, const py::array& y,
         const py::array& active, const py::array& site_b, const py::array& site_pi, const std::string& likelihood,
         double bias, double noise_variance, double label_noise, int n_gh, bool with_grad,
         const py::object& distances) {
        const auto Xv = as_matrix(X, "X");
        const index_t n = Xv.rows;
        const double* yv = as_vector(y, "y", n);
        const std::vector<index_t> I = as_indices(active, "active");
        const index_t d = static_cast<index_t>(I.size());
        const double* bv = as_vector(site_b, "site_b", d);
        const double* pv = as_vector(site_pi, "site_pi", d);
        const kernels::Kernel kernel = make_kernel(codes, params, Xv.cols);
        const auto lik = make_binary_likelihood(likelihood, bias, noise_variance, n_gh, label_noise);
        const auto [r2, r2_max_norm] = given_distances(distances, d, n);
        py::array_t<double> h = new_vector(n), a = new_vector(n), dk = new_vector(kernel.num_params());
        ivm::BoundGradients g;
        g.kernel = dk.mutable_data();
        ivm::BoundResult r;
        {
          py::gil_scoped_release release;
          r = ivm::bound(kernel, lik, Xv, yv, I.data(), d, bv, pv, with_grad ? &g : nullptr, h.mutable_data(),
                         a.mutable_data(), r2, r2_max_norm);
        }
        py::dict out;
        out["value"] = r.value;
        out["expected_neg_log_lik"] = r.expected_neg_log_lik;
        out["kl"] = r.kl;
        out["h"] = h;
        out["a"] = a;
        if (with_grad) {
          out["grad_params"] = dk;
          out["grad_bias"] = g.bias;
          out["grad_noise_variance"] = g.noise_variance;
        }
        return out;
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::arg("y"), py::kw_only(), py::arg("active"),
      py::arg("site_b"), py::arg("site_pi"), py::arg("likelihood") = "probit", py::arg("bias") = 0.0,
      py::arg("noise_variance") = 1.0, py::arg("label_noise") = 0.0, py::arg("n_gh") = 32,
      py::arg("with_grad") = true,
      py::arg("distances") = py::none(),
      "Seed 002 section 4's bound F >= -log P(y | theta) for X [n, D], y [n] with the active set "
      "(active [d], any integer dtype) and its sites (site_b, site_pi [d]) fixed, the marginals rebuilt "
      "at the kernel's parameters. Returns a dict: value, expected_neg_log_lik, kl, the marginals h, a [n] "
      "and, with with_grad, grad_params [P] (in the layout of params), grad_bias, grad_noise_variance. "
      "distances: None, or kernels.squared_distances(X[active], X) (computed once for a search's many "
      "evaluations).");
}

}  // namespace pygpfast::bind
