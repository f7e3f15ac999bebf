// Affine map over the rows of a matrix: y = x W^T + b, PyTorch's nn.Linear layout (W is [O, I]).
#pragma once

#include <algorithm>
#include <cstdint>

#include "attn/kernels/gemm.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

/// y[N, O] = x[N, I] W[O, I]^T + b[O], then max(0, .) when `relu`, then `dropout` (y's elements
/// numbered row-major), all applied as y is stored.
/// `b` may be null (no bias). Shapes are the caller's to check. W is marked as a weight, so its
/// packed form is reused while a ConstantWeightsScope is open (decoding).
template <class T>
void linear_forward(MatrixRef<T> y, const ConstMatrixRef<T>& x, const ConstMatrixRef<T>& w,
                    const T* b, bool relu = false, const DropoutMask& dropout = {}) {
  gemm(y, x, w.transpose(), false, Epilogue<T>{b, relu, dropout}, /*constant_b=*/true);
}

/// Backward of y = x W^T + b:
///   dx  = dy W          (overwritten; skipped when dx has no rows, i.e. not wanted)
///   dW += dy^T x        (accumulated)
///   db += sum_rows(dy)  (accumulated; skipped when db is null)
/// With `dx_gate` (its gate fields only), dx is gated as it is stored (Epilogue::gate): the
/// backward of a ReLU and dropout in front of this layer, fused.
template <class T>
void linear_backward(MatrixRef<T> dx, MatrixRef<T> dw, T* db, const ConstMatrixRef<T>& dy,
                     const ConstMatrixRef<T>& x, const ConstMatrixRef<T>& w,
                     const Epilogue<T>& dx_gate = {}) {
  if (dx.rows() > 0) gemm(dx, dy, w, false, dx_gate);
  Epilogue<T> dw_epi;
  dw_epi.row_sums_of_a = db;  // db: the rows of dy^T summed while the product reads them
  gemm(dw, dy.transpose(), x, true, dw_epi);
}

}  // namespace attn::kernels
