// Affine map over the rows of a matrix: y = x W^T + b, PyTorch's nn.Linear layout (W is [O, I]).
#pragma once

#include "attn/kernels/gemm.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

/// y[N, O] = x[N, I] W[O, I]^T + b[O]. `b` may be null (no bias). Shapes are the caller's to check.
template <class T>
void linear_forward(MatrixRef<T> y, const ConstMatrixRef<T>& x, const ConstMatrixRef<T>& w,
                    const T* b) {
  gemm(y, x, w.transpose(), false, Epilogue<T>{b});
}

/// Backward of y = x W^T + b:
///   dx  = dy W          (overwritten; skipped when dx has no rows, i.e. not wanted)
///   dW += dy^T x        (accumulated)
///   db += sum_rows(dy)  (accumulated; skipped when db is null)
template <class T>
void linear_backward(MatrixRef<T> dx, MatrixRef<T> dw, T* db, const ConstMatrixRef<T>& dy,
                     const ConstMatrixRef<T>& x, const ConstMatrixRef<T>& w) {
  if (dx.rows() > 0) gemm(dx, dy, w, false);
  gemm(dw, dy.transpose(), x, true);
  if (db != nullptr)
    Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(db, dw.rows()).noalias() += dy.colwise().sum();
}

}  // namespace attn::kernels
