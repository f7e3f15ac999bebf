// How a matrix product's operand lies in memory: a pointer and a stride per axis, read off any
// Eigen expression with direct access (a Ref, a Map, a block of either, or the transpose of one).
// The packed GEMM (gemm_avx512.hpp) takes its operands in this form, so one packing routine serves
// x W^T (forward), dy W (backward-data) and dy^T x (backward-weights) alike.
#pragma once

#include <Eigen/Core>
#include <optional>
#include <type_traits>

#include "attn/tensor.hpp"

namespace attn::kernels::detail {

/// The GEMM epilogue's gate (Epilogue::gate in kernels/gemm.hpp) on one element: c scaled where
/// the gate passed (g > 0), else 0; the one formula of the paths that gate after the product.
template <class T>
T gated(T c, T g, T scale) {
  return g > T(0) ? c * scale : T(0);
}

/// How long a product's B stays as it is, which decides whether its packed form is kept:
///   product: this product only (packed into the thread's buffer, as every B by default);
///   weight:  a weight, kept while a ConstantWeightsScope is open (gemm_weight_cache.hpp);
///   scope:   kept while a ReusedBScope is open (gemm_pack_buffers.hpp): a head's keys and values.
enum class BLifetime { product, weight, scope };

/// A [rows, cols] matrix whose element (i, k) is data[i * row_stride + k * col_stride].
template <class T>
struct StridedMatrix {
  T* data = nullptr;
  Index rows = 0, cols = 0;
  Index row_stride = 0, col_stride = 0;

  T& operator()(Index i, Index k) const { return data[i * row_stride + k * col_stride]; }
};

/// Whether two operands are the same view of the same memory: what the caches of packed B
/// (gemm_weight_cache.hpp, gemm_pack_buffers.hpp) key their copies on.
template <class T>
bool same_view(const StridedMatrix<T>& x, const StridedMatrix<T>& y) {
  return x.data == y.data && x.rows == y.rows && x.cols == y.cols && x.row_stride == y.row_stride &&
         x.col_stride == y.col_stride;
}

/// A kept packed copy of B as a product finds it in one of those caches: where it lives and, when
/// the product must write it, the copy's flag that says it is written. The product sets the flag
/// (mark_written) only once it has returned, so that a product left by an exception between the
/// lookup and the end of its packing (a later allocation failing) leaves the copy to be written
/// again by the next product, never an unwritten copy marked as packed.
struct KeptCopy {
  float* data = nullptr;    // null: no copy is kept (the product packs into its own buffer)
  bool* written = nullptr;  // null when the copy is written already

  bool to_write() const { return written != nullptr; }
  void mark_written() const {
    if (written != nullptr) *written = true;
  }
};

/// The strided form of an Eigen expression with direct access to its coefficients, or nothing for
/// an expression that must be evaluated first (a scaled product, a sum, ...).
template <class Xpr>
auto strided_view(Xpr&& x) {
  using Plain = std::remove_cv_t<std::remove_reference_t<Xpr>>;
  using Scalar = typename Plain::Scalar;
  constexpr bool direct = (Eigen::internal::traits<Plain>::Flags & Eigen::DirectAccessBit) != 0;
  constexpr bool writable = (Eigen::internal::traits<Plain>::Flags & Eigen::LvalueBit) != 0 &&
                            !std::is_const_v<std::remove_reference_t<Xpr>>;
  using Elem = std::conditional_t<writable, Scalar, const Scalar>;
  std::optional<StridedMatrix<Elem>> view;
  if constexpr (direct) {
    view = StridedMatrix<Elem>{const_cast<Elem*>(x.data()), x.rows(), x.cols(), x.rowStride(),
                               x.colStride()};
  }
  return view;
}

}  // namespace attn::kernels::detail
