// Non-owning views of row-major (C-contiguous) float64 matrices.
//
// The core never owns user data: numpy arrays arrive as views, results are written
// into views that the caller allocated. Row-major matches numpy; blas.hpp maps it to
// the column-major BLAS convention.
#pragma once

#include <cstdint>

namespace pygpfast {

using index_t = std::int64_t;

struct ConstMatrixView {
  const double* data = nullptr;
  index_t rows = 0;
  index_t cols = 0;
  index_t ld = 0;  // distance between the starts of consecutive rows (>= cols)

  ConstMatrixView() = default;
  ConstMatrixView(const double* d, index_t r, index_t c) : data(d), rows(r), cols(c), ld(c) {}
  ConstMatrixView(const double* d, index_t r, index_t c, index_t l) : data(d), rows(r), cols(c), ld(l) {}

  const double& operator()(index_t i, index_t j) const { return data[i * ld + j]; }
  const double* row(index_t i) const { return data + i * ld; }
};

struct MatrixView {
  double* data = nullptr;
  index_t rows = 0;
  index_t cols = 0;
  index_t ld = 0;

  MatrixView() = default;
  MatrixView(double* d, index_t r, index_t c) : data(d), rows(r), cols(c), ld(c) {}
  MatrixView(double* d, index_t r, index_t c, index_t l) : data(d), rows(r), cols(c), ld(l) {}

  double& operator()(index_t i, index_t j) const { return data[i * ld + j]; }
  double* row(index_t i) const { return data + i * ld; }
  operator ConstMatrixView() const { return ConstMatrixView(data, rows, cols, ld); }
};

}  // namespace pygpfast
