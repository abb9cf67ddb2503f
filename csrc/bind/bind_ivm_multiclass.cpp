// _core.ivm: the joint multi-class IVM (csrc/include/pygpfast/ivm/multiclass.hpp). Thin: checks
// shapes, converts, releases the GIL, calls the core, wraps the results in dicts.
#include <cstdint>
#include <string>
#include <vector>

#include "bind_common.hpp"
#include "pygpfast/ivm/cubature.hpp"
#include "pygpfast/ivm/multiclass.hpp"

namespace pygpfast::bind {

namespace {

using ivm::ClassKernels;

// One kernel (params [P]) shared by every class, or one per class (params [C, P], the same codes).
struct KernelSet {
  std::vector<kernels::Kernel> owned;
  ClassKernels ptrs;
};

KernelSet make_kernels(const py::array& codes, const py::array& params, index_t input_dim, int num_classes) {
  KernelSet ks;
  check_float64_c(params, "params");
  const std::int32_t* c = as_int32_vector(codes, "codes");
  const auto* p = static_cast<const double*>(params.data());
  if (params.ndim() == 1) {
    ks.owned.emplace_back(c, codes.shape(0), p, params.shape(0), input_dim);
  } else if (params.ndim() == 2) {
    if (params.shape(0) != num_classes)
      throw std::invalid_argument("params [C, P] must have one row per class (" + std::to_string(num_classes) +
                                  "), got " + std::to_string(params.shape(0)));
    for (int k = 0; k < num_classes; ++k)
      ks.owned.emplace_back(c, codes.shape(0), p + k * params.shape(1), params.shape(1), input_dim);
  } else {
    throw std::invalid_argument("params must be [P] (one shared kernel) or [C, P] (one kernel per class)");
  }
  for (auto& k : ks.owned) ks.ptrs.push_back(&k);
  return ks;
}

py::array_t<double> new_array(std::vector<py::ssize_t> shape) { return py::array_t<double>(shape); }

// [m, C] and [m, C, C] inputs of the per-point routines.
void check_marginals(const py::array& h, const py::array& A, index_t& m, int& C) {
  const auto hv = as_matrix(h, "h");
  check_float64_c(A, "A");
  m = hv.rows;
  C = static_cast<int>(hv.cols);
  if (A.ndim() != 3 || A.shape(0) != m || A.shape(1) != C || A.shape(2) != C)
    throw std::invalid_argument("A must be [m, C, C] with h [m, C]");
  if (C < 2) throw std::invalid_argument("C must be >= 2");
}

const double* beta_or_zero(const py::object& beta, int C, std::vector<double>& storage);

// The per-point routines' inputs, checked: cavities N(h [m, C], A [m, C, C]) with A's Cholesky
// factors L [m, C, C], labels y [m] in 0..C-1, intercepts beta [C] (None: 0) and the rule.
struct PointBatch {
  index_t m = 0;
  int C = 0;
  const double* h = nullptr;
  const double* y = nullptr;
  std::vector<double> beta, L;
  ivm::Cubature rule;

  PointBatch(const py::array& h_, const py::array& A, const py::array& y_, const py::object& beta_, int rule_) {
    check_marginals(h_, A, m, C);
    h = static_cast<const double*>(h_.data());
    y = as_vector(y_, "y", m);
    for (index_t i = 0; i < m; ++i)
      if (!(y[i] >= 0 && y[i] < C && y[i] == static_cast<double>(static_cast<int>(y[i]))))
        throw std::invalid_argument("y must hold class labels 0..C-1");
    beta_or_zero(beta_, C, beta);
    const auto* Ap = static_cast<const double*>(A.data());
    L.assign(static_cast<std::size_t>(m * C * C), 0.0);
    for (index_t i = 0; i < m; ++i)
      if (!ivm::small_cholesky(C, Ap + i * C * C, L.data() + i * C * C))
        throw std::invalid_argument("A must be positive definite");
    rule = ivm::make_cubature(ivm::cubature_rule_from_int(rule_), C);
  }
};

const double* beta_or_zero(const py::object& beta, int C, std::vector<double>& storage) {
  storage.assign(static_cast<std::size_t>(C), 0.0);
  if (beta.is_none()) return storage.data();
  if (!py::isinstance<py::array>(beta)) throw std::invalid_argument("beta must be a float64 ndarray [C] or None");
  const double* b = as_vector(py::reinterpret_borrow<py::array>(beta), "beta", C);
  storage.assign(b, b + C);
  return storage.data();
}

template <class T>
py::array_t<T> vector_to_array(const std::vector<T>& v, std::vector<py::ssize_t> shape) {
  py::array_t<T> a(shape);
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

}  // namespace

void bind_ivm_multiclass(py::module_& m) {
  m.def(
      "cubature",
      [](int rule, int C) {
        const auto q = ivm::make_cubature(ivm::cubature_rule_from_int(rule), C);
        return py::make_tuple(vector_to_array(q.nodes, {q.size, C}), vector_to_array(q.weights, {q.size}));
      },
      py::arg("rule"), py::arg("C"),
      "Cubature rule for N(0, I_C): (nodes [N, C], weights [N]). rule 0: 3-point Gauss-Hermite product (3^C "
      "nodes); 1: Stroud 5-2 (2 C^2 + 1 nodes).");

  m.def(
      "multiclass_tilted",
      [](const py::array& h, const py::array& A, const py::array& y, const py::object& beta, int rule) {
        const PointBatch in(h, A, y, beta, rule);
        const index_t mm = in.m;
        const int C = in.C;
        auto logZ = new_vector(mm), mean = new_matrix(mm, C), cov = new_array3(mm, C, C), pc = new_matrix(mm, C);
        py::array_t<bool> valid(mm);
        {
          py::gil_scoped_release release;
          std::vector<double> work(static_cast<std::size_t>(ivm::cubature_work_size(in.rule)));
          for (index_t i = 0; i < mm; ++i)
            valid.mutable_data()[i] = ivm::softmax_tilted_moments(
                in.rule, static_cast<int>(in.y[i]), in.h + i * C, in.L.data() + i * C * C, in.beta.data(),
                mean.mutable_data() + i * C, cov.mutable_data() + i * C * C, pc.mutable_data() + i * C,
                logZ.mutable_data() + i, work.data());
        }
        py::dict out;
        out["log_Z"] = logZ;
        out["mean"] = mean;
        out["cov"] = cov;
        out["p_cavity"] = pc;
        out["valid"] = valid;
        return out;
      },
      py::arg("h"), py::arg("A"), py::arg("y"), py::kw_only(), py::arg("beta") = py::none(), py::arg("rule") = 0,
      "Tilted moments of the softmax under cavities N(h [m, C], A [m, C, C]) by the rule: dict with log_Z [m], "
      "mean [m, C], cov [m, C, C], p_cavity [m, C] (E[softmax(u + beta)] under the cavity) and valid [m] (False "
      "when the moments are those of no positive measure, possible for rule 1 from C = 5 on: a non-positive Z, "
      "an indefinite cov, or a p_cavity entry outside (0, 1)).");

  m.def(
      "multiclass_expected_nll",
      [](const py::array& h, const py::array& A, const py::array& y, const py::object& beta, int rule) {
        const PointBatch in(h, A, y, beta, rule);
        const index_t mm = in.m;
        const int C = in.C;
        auto val = new_vector(mm), gh = new_matrix(mm, C), GA = new_array3(mm, C, C);
        {
          py::gil_scoped_release release;
          std::vector<double> work(static_cast<std::size_t>(ivm::cubature_work_size(in.rule)));
          for (index_t i = 0; i < mm; ++i)
            ivm::softmax_expected_nll(in.rule, static_cast<int>(in.y[i]), in.h + i * C, in.L.data() + i * C * C,
                                      in.beta.data(), val.mutable_data() + i, gh.mutable_data() + i * C,
                                      GA.mutable_data() + i * C * C, work.data());
        }
        py::dict out;
        out["value"] = val;
        out["g_h"] = gh;
        out["G_A"] = GA;
        return out;
      },
      py::arg("h"), py::arg("A"), py::arg("y"), py::kw_only(), py::arg("beta") = py::none(), py::arg("rule") = 0,
      "E[-log softmax(u + beta)_y] under N(h [m, C], A [m, C, C]) by the rule, with its exact derivatives: dict "
      "with value [m], g_h [m, C], G_A [m, C, C] (symmetric; d value = sum G_A * dA).");

  m.def(
      "multiclass_project",
      [](const py::array& h, const py::array& A, const py::array& h_hat, const py::array& A_hat, const py::array& pi0,
         int max_iterations) {
        const double* hv = as_vector(h, "h");
        const int C = static_cast<int>(h.shape(0));
        const double* hh = as_vector(h_hat, "h_hat", C);
        const double* p0 = as_vector(pi0, "pi0", C);
        const auto Av = as_matrix(A, "A");
        const auto Ahv = as_matrix(A_hat, "A_hat");
        if (Av.rows != C || Av.cols != C || Ahv.rows != C || Ahv.cols != C)
          throw std::invalid_argument("A and A_hat must be [C, C] with h [C]");
        ivm::ProjectionResult r;
        {
          py::gil_scoped_release release;
          r = ivm::project_constrained_site(C, hv, Av.data, hh, Ahv.data, p0, max_iterations);
        }
        py::dict out;
        out["pi"] = vector_to_array(r.pi, {C});
        out["b"] = vector_to_array(r.b, {C});
        out["g"] = vector_to_array(r.g, {C});
        out["objective"] = r.objective;
        out["iterations"] = r.iterations;
        out["majoriser_steps"] = r.majoriser_steps;
        out["converged"] = r.converged;
        return out;
      },
      py::arg("h"), py::arg("A"), py::arg("h_hat"), py::arg("A_hat"), py::arg("pi0"), py::kw_only(),
      py::arg("max_iterations") = 50,
      "Constrained ADF projection of tilted moments (h_hat [C], A_hat [C, C]) with cavity (h, A) onto a site "
      "Pi = diag(pi) - pi pi^T / sum(pi), b: dict with pi, b, g = A^-1 (h_hat - h), objective, iterations, "
      "majoriser_steps, converged.");

  m.def(
      "multiclass_projection_objective",
      [](const py::array& A, const py::array& A_hat, const py::array& pi) {
        const double* p = as_vector(pi, "pi");
        const int C = static_cast<int>(pi.shape(0));
        const auto Av = as_matrix(A, "A");
        const auto Ahv = as_matrix(A_hat, "A_hat");
        if (Av.rows != C || Av.cols != C || Ahv.rows != C || Ahv.cols != C)
          throw std::invalid_argument("A and A_hat must be [C, C] with pi [C]");
        auto grad = new_vector(C);
        auto hess = new_matrix(C, C);
        const double f = ivm::projection_objective(C, Av.data, Ahv.data, p, grad.mutable_data(), hess.mutable_data());
        return py::make_tuple(f, grad, hess);
      },
      py::arg("A"), py::arg("A_hat"), py::arg("pi"),
      "The projection objective f(pi) = [-log|A^-1 + Pi| + tr(Pi A_hat)] / 2 with its gradient [C] and Hessian "
      "[C, C].");

  m.def(
      "multiclass_select",
      [](const py::array& codes, const py::array& params, const py::array& X, const py::array& y, int num_classes,
         index_t active_size, index_t n_random, std::uint64_t seed, int rule, double keep_fraction,
         index_t selection_size, const py::object& beta, int max_newton, bool record_marginals) {
        const auto Xv = as_matrix(X, "X");
        const double* yv = as_vector(y, "y", Xv.rows);
        if (num_classes < 2) throw std::invalid_argument("num_classes must be >= 2");
        KernelSet ks = make_kernels(codes, params, Xv.cols, num_classes);
        std::vector<double> bs;
        const double* b = beta_or_zero(beta, num_classes, bs);
        ivm::MulticlassSelectOptions opt;
        opt.num_classes = num_classes;
        opt.active_size = active_size;
        opt.n_random = n_random;
        opt.seed = seed;
        opt.rule = ivm::cubature_rule_from_int(rule);
        opt.keep_fraction = keep_fraction;
        opt.selection_size = selection_size;
        opt.max_newton = max_newton;
        opt.record_marginals = record_marginals;
        ivm::Selection s;
        {
          py::gil_scoped_release release;
          s = ivm::multiclass_select(ks.ptrs, Xv, yv, b, opt);
        }
        const py::ssize_t n = s.n, d = s.d, C = s.C;
        py::dict out;
        std::vector<std::int64_t> act(s.active.begin(), s.active.end());
        out["active"] = vector_to_array(act, {d});
        out["pi"] = vector_to_array(s.pi, {d, C});
        out["b"] = vector_to_array(s.b, {d, C});
        out["h"] = vector_to_array(s.h, {n, C});
        out["A"] = vector_to_array(s.A, {n, C, C});
        out["scores"] = vector_to_array(s.scores, {d});
        out["log_Z"] = vector_to_array(s.log_Z, {d});
        out["newton_iterations"] = vector_to_array(s.newton_iterations, {d});
        out["newton_converged"] = vector_to_array(s.newton_converged, {d});
        out["score_seconds"] = vector_to_array(s.score_seconds, {d});
        out["update_seconds"] = vector_to_array(s.update_seconds, {d});
        out["quadrature_fallbacks"] = s.quadrature_fallbacks;
        out["invalid_moments"] = s.invalid_moments;
        if (record_marginals) {
          out["history_h"] = vector_to_array(s.history_h, {d, n, C});
          out["history_A"] = vector_to_array(s.history_A, {d, n, C, C});
        }
        return out;
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::arg("y"), py::kw_only(), py::arg("num_classes"),
      py::arg("active_size"), py::arg("n_random") = 2, py::arg("seed") = 0, py::arg("rule") = 0,
      py::arg("keep_fraction") = 0.5, py::arg("selection_size") = 0, py::arg("beta") = py::none(),
      py::arg("max_newton") = 50, py::arg("record_marginals") = false,
      "Greedy selection of the joint multi-class IVM on X [n, D], y [n] (labels 0..C-1 as float64); params [P] "
      "(one shared kernel) or [C, P] (one per class). Returns a dict: active [d] (int64, inclusion order), pi, b "
      "[d, C], h [n, C], A [n, C, C] (final marginals), scores, log_Z, newton_iterations, newton_converged, "
      "score_seconds, update_seconds [d], quadrature_fallbacks (moments the rule could not give and the 3-point "
      "Gauss-Hermite product gave), invalid_moments (moments no rule gave: those points skipped), and with record_marginals history_h [d, n, C], "
      "history_A [d, n, C, C] (the marginals after each inclusion).");

  m.def(
      "multiclass_predict",
      [](const py::array& codes, const py::array& params, const py::array& X_active, const py::array& pi,
         const py::array& b, const py::array& Xnew, const py::object& beta, int rule, bool with_cov, bool with_prob) {
        const auto XI = as_matrix(X_active, "X_active");
        const auto piv = as_matrix(pi, "pi");
        const auto bv = as_matrix(b, "b");
        const auto Xn = as_matrix(Xnew, "Xnew");
        const int C = static_cast<int>(piv.cols);
        if (piv.rows != XI.rows || bv.rows != XI.rows || bv.cols != C)
          throw std::invalid_argument("pi and b must be [d, C] with X_active [d, D]");
        if (C < 2) throw std::invalid_argument("pi must have C >= 2 columns");
        KernelSet ks = make_kernels(codes, params, XI.cols, C);
        std::vector<double> bs;
        const double* be = beta_or_zero(beta, C, bs);
        const auto rr = ivm::cubature_rule_from_int(rule);
        const index_t T = Xn.rows;
        auto mean = new_matrix(T, C);
        py::object cov_o = py::none(), prob_o = py::none();
        double* covp = nullptr;
        double* probp = nullptr;
        py::array_t<double> cov, prob;
        if (with_cov) {
          cov = new_array3(T, C, C);
          covp = cov.mutable_data();
          cov_o = cov;
        }
        if (with_prob) {
          prob = new_matrix(T, C);
          probp = prob.mutable_data();
          prob_o = prob;
        }
        {
          py::gil_scoped_release release;
          ivm::multiclass_predict(ks.ptrs, C, XI, piv.data, bv.data, be, Xn, rr, mean.mutable_data(), covp, probp);
        }
        py::dict out;
        out["mean"] = mean;
        out["cov"] = cov_o;
        out["prob"] = prob_o;
        return out;
      },
      py::arg("codes"), py::arg("params"), py::arg("X_active"), py::arg("pi"), py::arg("b"), py::arg("Xnew"),
      py::kw_only(), py::arg("beta") = py::none(), py::arg("rule") = 0, py::arg("with_cov") = true,
      py::arg("with_prob") = true,
      "Predictive latent marginals of the multi-class IVM with sites pi, b [d, C] on X_active [d, D] at Xnew [T, D]: "
      "dict with mean [T, C], cov [T, C, C] (or None) and prob [T, C] = E[softmax(u + beta)] by the rule (or None).");

  m.def(
      "multiclass_bound",
      [](const py::array& codes, const py::array& params, const py::array& X, const py::array& y,
         const py::array& active, const py::array& pi, const py::array& b, const py::object& beta, int rule,
         bool with_grad, const py::object& distances) {
        const auto Xv = as_matrix(X, "X");
        const double* yv = as_vector(y, "y", Xv.rows);
        const auto piv = as_matrix(pi, "pi");
        const auto bv = as_matrix(b, "b");
        const int C = static_cast<int>(piv.cols);
        if (C < 2) throw std::invalid_argument("pi must have C >= 2 columns");
        if (!py::array_t<std::int64_t>::check_(active) || active.ndim() != 1 || !(active.flags() & py::array::c_style))
          throw std::invalid_argument("active must be a 1-D C-contiguous int64 array");
        check_aligned(active, "active");
        const index_t d = active.shape(0);
        if (piv.rows != d || bv.rows != d || bv.cols != C)
          throw std::invalid_argument("pi and b must be [d, C] with active [d]");
        KernelSet ks = make_kernels(codes, params, Xv.cols, C);
        std::vector<double> bs;
        const double* be = beta_or_zero(beta, C, bs);
        const auto rr = ivm::cubature_rule_from_int(rule);
        std::vector<py::ssize_t> pshape(params.shape(), params.shape() + params.ndim());
        auto dparams = new_array(pshape);
        auto dbeta = new_vector(C);
        std::vector<double*> dk;
        const index_t P = ks.owned[0].num_params();
        for (std::size_t k = 0; k < ks.owned.size(); ++k) dk.push_back(dparams.mutable_data() + k * P);
        static_assert(sizeof(index_t) == sizeof(std::int64_t), "index_t is int64");
        const auto* act = static_cast<const index_t*>(active.data());
        const auto [r2, r2_max_norm] = given_distances(distances, d, Xv.rows);
        ivm::MulticlassBoundResult r;
        {
          py::gil_scoped_release release;
          r = ivm::multiclass_bound(ks.ptrs, C, Xv, yv, act, d, piv.data, bv.data, be, rr, with_grad ? &dk : nullptr,
                                    with_grad ? dbeta.mutable_data() : nullptr, r2, r2_max_norm);
        }
        py::dict out;
        out["value"] = r.value;
        out["expected_nll"] = r.expected_nll;
        out["kl"] = r.kl;
        out["d_params"] = with_grad ? py::object(dparams) : py::none();
        out["d_beta"] = with_grad ? py::object(dbeta) : py::none();
        return out;
      },
      py::arg("codes"), py::arg("params"), py::arg("X"), py::arg("y"), py::arg("active"), py::arg("pi"), py::arg("b"),
      py::kw_only(), py::arg("beta") = py::none(), py::arg("rule") = 0, py::arg("with_grad") = false,
      py::arg("distances") = py::none(),
      "Seed section-4 bound on -log P(y | theta) with the active set (int64 [d]) and the sites pi, b [d, C] fixed: "
      "dict with value = expected_nll + kl, expected_nll (sum over all n points, by the rule), kl, and with "
      "with_grad d_params (shaped like params) and d_beta [C] (else None). distances: None, or "
      "kernels.squared_distances(X[active], X) (computed once for a search's many evaluations).");
}

}  // namespace pygpfast::bind
