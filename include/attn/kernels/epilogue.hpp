// What attn's own GEMM applies to each element of C as it is stored (the Eigen path applies it
// after the product): one struct for the public gemm() and for the kernels of every instruction
// set (kernels/detail/gemm_tile.hpp), so a field cannot be added to one and lost on the way.
#pragma once

#include "attn/random.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

template <class T>
struct Epilogue {
  const T* bias = nullptr;  // [N] added to every row of c, or null
  bool relu = false;        // c = max(0, c) after the bias
  DropoutMask dropout{};    // then dropout (kernels/dropout.hpp), element (i, j) of c being
                            // element i N + j of the mask (p = 0: none)
  // Or (not with the above) a gate: c(i, j) = gate(i, j) > 0 ? c(i, j) gate_scale : 0, for gate
  // [M, N] with row stride gate_stride. It is the backward of y = dropout(max(0, x)) from y (y > 0
  // exactly where the ReLU passed and the dropout kept; gate_scale 1 / (1 - p), or 1 without
  // dropout), applied as dx = dy W is stored instead of in two passes of its own.
  const T* gate = nullptr;
  Index gate_stride = 0;
  T gate_scale = 1;
  // And (with any of the above) a by-product: row_sums_of_a [M] += each row of a, one number at a
  // time, k ascending, on every path and thread count. For a weight gradient dy^T x it is the
  // bias gradient (the column sums of dy), read while a's blocks are in cache.
  T* row_sums_of_a = nullptr;
};

}  // namespace attn::kernels
