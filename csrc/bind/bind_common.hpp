// Helpers shared by the binding files: array checks and conversions. No algorithm here.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "pygpfast/kernels.hpp"
#include "pygpfast/likelihoods.hpp"
#include "pygpfast/piecewise.hpp"
#include "pygpfast/view.hpp"

namespace pygpfast::bind {

namespace py = pybind11;

// An array whose data do not start at a multiple of its item size (a view into a byte buffer
// at an odd offset) is refused: reading it through a typed pointer is undefined behaviour.
inline void check_aligned(const py::array& a, const char* name) {
  if (!(a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_))
    throw std::invalid_argument(std::string(name) +
                                " must be aligned to its item size; copy it with "
                                "numpy.require(a, requirements='CA')");
}

// The core takes float64 C-contiguous aligned arrays without copying; anything else is refused
// with a ValueError that says how to convert (the public Python layer converts first).
inline void check_float64_c(const py::array& a, const char* name) {
  if (!py::array_t<double>::check_(a))
    throw std::invalid_argument(std::string(name) + " must have dtype float64, got " +
                                std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style))
    throw std::invalid_argument(std::string(name) +
                                " must be C-contiguous; use numpy.ascontiguousarray");
  check_aligned(a, name);
}

inline ConstMatrixView as_matrix(const py::array& a, const char* name) {
  check_float64_c(a, name);
  if (a.ndim() != 2)
    throw std::invalid_argument(std::string(name) + " must be 2-D, got " + std::to_string(a.ndim()) +
                                "-D");
  return ConstMatrixView(static_cast<const double*>(a.data()), a.shape(0), a.shape(1));
}

inline MatrixView as_mutable_matrix(py::array& a, const char* name) {
  check_float64_c(a, name);
  if (a.ndim() != 2)
    throw std::invalid_argument(std::string(name) + " must be 2-D, got " + std::to_string(a.ndim()) +
                                "-D");
  if (!a.writeable()) throw std::invalid_argument(std::string(name) + " must be writeable");
  return MatrixView(static_cast<double*>(a.mutable_data()), a.shape(0), a.shape(1));
}

// A 1-D float64 array; expected_size < 0 accepts any length.
inline const double* as_vector(const py::array& a, const char* name, index_t expected_size = -1) {
  check_float64_c(a, name);
  if (a.ndim() != 1)
    throw std::invalid_argument(std::string(name) + " must be 1-D, got " + std::to_string(a.ndim()) +
                                "-D");
  if (expected_size >= 0 && a.shape(0) != expected_size)
    throw std::invalid_argument(std::string(name) + " must have length " +
                                std::to_string(expected_size) + ", got " + std::to_string(a.shape(0)));
  return static_cast<const double*>(a.data());
}

inline py::array_t<double> new_matrix(index_t rows, index_t cols) {
  return py::array_t<double>({static_cast<py::ssize_t>(rows), static_cast<py::ssize_t>(cols)});
}

inline py::array_t<double> new_vector(index_t n) {
  return py::array_t<double>(static_cast<py::ssize_t>(n));
}

// A new C-ordered float64 array [n0, n1, n2] (e.g. L matrices [N, N]).
inline py::array_t<double> new_array3(index_t n0, index_t n1, index_t n2) {
  return py::array_t<double>(
      {static_cast<py::ssize_t>(n0), static_cast<py::ssize_t>(n1), static_cast<py::ssize_t>(n2)});
}

inline MatrixView view_of(py::array_t<double>& a) {
  return MatrixView(a.mutable_data(), a.shape(0), a.shape(1));
}

// A 1-D int32 C-contiguous array (kernel codes).
inline const std::int32_t* as_int32_vector(const py::array& a, const char* name) {
  if (!py::array_t<std::int32_t>::check_(a))
    throw std::invalid_argument(std::string(name) + " must have dtype int32, got " +
                                std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style))
    throw std::invalid_argument(std::string(name) +
                                " must be C-contiguous; use numpy.ascontiguousarray");
  check_aligned(a, name);
  if (a.ndim() != 1)
    throw std::invalid_argument(std::string(name) + " must be 1-D, got " + std::to_string(a.ndim()) +
                                "-D");
  return static_cast<const std::int32_t*>(a.data());
}

// A `distances` argument: None, or (r2 [rows, cols] C-contiguous, max_norm) as
// kernels.squared_distances gives them: (values or null, max_norm).
inline std::pair<const double*, double> given_distances(const py::object& distances, index_t rows, index_t cols) {
  if (distances.is_none()) return {nullptr, 0.0};
  const auto pair = distances.cast<py::tuple>();
  if (pair.size() != 2) throw std::invalid_argument("distances must be (r2 [d, n], max_norm)");
  const auto r2 = as_matrix(pair[0].cast<py::array>(), "distances' r2");
  if (r2.rows != rows || r2.cols != cols)
    throw std::invalid_argument("distances' r2 must be [d, n] for active [d] and X [n, D], got [" +
                                std::to_string(r2.rows) + ", " + std::to_string(r2.cols) + "]");
  return {r2.data, pair[1].cast<double>()};
}

// The core kernel described by (codes, params) for inputs with `input_dim` columns.
inline kernels::Kernel make_kernel(const py::array& codes, const py::array& params, index_t input_dim) {
  const std::int32_t* c = as_int32_vector(codes, "codes");
  const double* p = as_vector(params, "params");
  return kernels::Kernel(c, codes.shape(0), p, params.shape(0), input_dim);
}

// A copy of a 1-D float64 array.
inline std::vector<double> to_std_vector(const py::array& a, const char* name) {
  const double* p = as_vector(a, name);
  return std::vector<double>(p, p + a.shape(0));
}

// The piecewise bound with breakpoints `knots` [R + 1] and coefficients a, b, c [R] (copied;
// validated by the core functions that take it).
inline piecewise::Bound make_piecewise_bound(const py::array& knots, const py::array& a,
                                             const py::array& b, const py::array& c) {
  piecewise::Bound bound;
  bound.knots = to_std_vector(knots, "knots");
  bound.a = to_std_vector(a, "a");
  bound.b = to_std_vector(b, "b");
  bound.c = to_std_vector(c, "c");
  return bound;
}

// The core likelihood for (kind, param, n_gh, num_classes), validated (std::invalid_argument):
// param is the likelihood's one parameter, the Gaussian's variance or a Bernoulli's or
// robust-max's label_noise
// (ignored by the others); num_classes is 0 for the likelihoods of a scalar latent function.
inline likelihoods::Likelihood make_likelihood(int kind, double param, int n_gh, int num_classes) {
  likelihoods::Likelihood lik;
  lik.type = static_cast<likelihoods::LikelihoodType>(kind);
  if (lik.type == likelihoods::LikelihoodType::BernoulliProbit ||
      lik.type == likelihoods::LikelihoodType::BernoulliLogit ||
      lik.type == likelihoods::LikelihoodType::RobustMax)
    lik.label_noise = param;
  else
    lik.variance = param;
  lik.n_gh = n_gh;
  lik.num_classes = num_classes;
  likelihoods::validate(lik);
  return lik;
}

// Registration functions, one per area (each in its own bind_<area>.cpp).
void bind_blas(py::module_& m);
void bind_threads(py::module_& m);
void bind_linalg(py::module_& m);
void bind_kernels(py::module_& m);
void bind_likelihoods(py::module_& m);
void bind_svgp(py::module_& m);
void bind_piecewise(py::module_& m);
void bind_svgp_mf(py::module_& m);
void bind_cvi(py::module_& m);
void bind_ivm_binary(py::module_& m);
void bind_ivm_multiclass(py::module_& m);
void bind_moe(py::module_& m);

}  // namespace pygpfast::bind
