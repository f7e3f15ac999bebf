// How a matrix product's operand lies in memory: a pointer and a stride per axis, read off any
// Eigen expression with direct access (a Ref, a Map, a block of either, or the transpose of one).
// The packed GEMM (gemm_avx512.hpp) takes its operands in this form, so one packing routine serves
// x W^T (forward), dy W (backward-data) and dy^T x (backward-weights) alike.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "attn/tensor.hpp"

namespace attn::kernels::detail {

/// The GEMM epilogue's gate (Epilogue::gate in kernels/epilogue.hpp) on one element: c scaled where
/// the gate passed (g > 0), else 0; the one formula of the paths that gate after the product.
template <class T>
T gated(T c, T g, T scale) {
  return g > T(0) ? c * scale : T(0);
}

/// The widest register tile of any kernel, in columns (AVX-512's kNR; each kernel asserts it is no
/// wider): a packed B [K, N] takes at most K * packed_width(N) floats, whichever kernel runs.
inline constexpr int kWidestNR = 32;

/// Columns of a packed operand of `cols` columns in panels of kWidestNR, the last padded.
inline Index packed_width(Index cols) { return (cols + kWidestNR - 1) / kWidestNR * kWidestNR; }

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

/// Whether x and y share an element. Views of one row-major buffer with the same row stride and
/// unit column strides (column blocks of one activation matrix, as Q, K and V are of the fused
/// projection's output) share one only if both their rows and their columns meet; other views, if
/// their address ranges meet; a view with a negative stride (which Eigen allows) is taken to share
/// one.
template <class T, class U>
bool share_an_element(const StridedMatrix<T>& x, const StridedMatrix<U>& y) {
  static_assert(sizeof(T) == sizeof(U), "views of one element type");
  if (x.rows == 0 || x.cols == 0 || y.rows == 0 || y.cols == 0) return false;
  if (x.row_stride < 0 || x.col_stride < 0 || y.row_stride < 0 || y.col_stride < 0) return true;
  const auto first = [](const auto& m) { return reinterpret_cast<std::uintptr_t>(m.data); };
  const auto last = [](const auto& m) {
    return reinterpret_cast<std::uintptr_t>(&m(m.rows - 1, m.cols - 1));
  };
  if (last(x) < first(y) || last(y) < first(x)) return false;
  const Index rs = x.row_stride;
  const bool blocks =
      x.col_stride == 1 && y.col_stride == 1 && y.row_stride == rs && rs >= x.cols && rs >= y.cols;
  const bool y_later = first(y) >= first(x);
  const std::uintptr_t bytes = y_later ? first(y) - first(x) : first(x) - first(y);
  if (!blocks || bytes % sizeof(T) != 0) return true;
  // The later view's (i, k) is the earlier one's (i + r, q + k), or (i + r + 1, q + k - rs) past
  // the end of a row.
  const Index d = static_cast<Index>(bytes / sizeof(T)), r = d / rs, q = d % rs;
  const Index early_rows = y_later ? x.rows : y.rows, early_cols = y_later ? x.cols : y.cols;
  const Index late_rows = y_later ? y.rows : x.rows, late_cols = y_later ? y.cols : x.cols;
  const auto meet = [](Index a0, Index a1, Index b0, Index b1) { return a0 < b1 && b0 < a1; };
  return (meet(q, q + late_cols, 0, early_cols) && meet(r, r + late_rows, 0, early_rows)) ||
         (meet(q, q + late_cols, rs, rs + early_cols) &&
          meet(r + 1, r + 1 + late_rows, 0, early_rows));
}

}  // namespace attn::kernels::detail
