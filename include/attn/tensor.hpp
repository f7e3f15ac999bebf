// Tensor<T>: an N-dimensional, row-major, 64-byte aligned array with shared storage.
//
// Dimension letters, used in every shape comment across attn:
//   B batch          S source length     T target length    L a length that may be either
//   D d_model        H heads             K d_k = d_v = D/H  F d_ff
//   V vocabulary     N rows of a flattened activation (B*S or B*T)
//   W beam width (beam search; K is taken by d_k)
// Two places use letters of their own, and say so where they do: the GEMM kernels (kernels/
// gemm*.hpp) name C [M, N] = A [M, K] B [K, N] as BLAS does, so K there is the depth of the
// product; and the paper's N (6 layers) is encoder_layers / decoder_layers in code.
//
// A Tensor is a handle, like torch.Tensor: copying it copies the handle, not the numbers, and
// reshape()/slice() return views of the same storage. clone() makes a deep copy. Activations are
// [B, L, D] tensors whose matrix() is the [B*L, D] row-major matrix every projection multiplies
// in one GEMM.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/error.hpp"

namespace attn {

using Index = std::int64_t;
/// Token ids, as the embedding and the loss take them (Tensor<TokenId>).
using TokenId = std::int32_t;

/// The shape of a tensor: up to kMaxRank extents, each >= 0, whose product fits in Index even
/// ignoring zero extents (so numel() never overflows, whatever the order of the extents).
class Shape {
 public:
  static constexpr int kMaxRank = 6;

  Shape() = default;
  Shape(std::initializer_list<Index> dims) { assign(dims.begin(), dims.end()); }
  explicit Shape(const std::vector<Index>& dims) { assign(dims.begin(), dims.end()); }
  /// The extents [first, last), e.g. another shape's begin() + 1 to end(); allocates nothing.
  Shape(const Index* first, const Index* last) { assign(first, last); }

  int rank() const { return rank_; }
  Index operator[](int axis) const { return dims_[static_cast<std::size_t>(axis)]; }
  Index numel() const {
    Index n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }
  const Index* begin() const { return dims_.data(); }
  const Index* end() const { return dims_.data() + rank_; }
  std::vector<Index> to_vector() const { return {begin(), end()}; }
  /// This shape with its last extent replaced by `extent` (a Linear's output from its input).
  Shape with_last(Index extent) const {
    ATTN_CHECK(rank_ >= 1, ShapeError, "with_last: needs rank >= 1, got a scalar shape");
    std::array<Index, kMaxRank> dims = dims_;
    dims[static_cast<std::size_t>(rank_ - 1)] = extent;
    return Shape(dims.data(), dims.data() + rank_);
  }

  friend bool operator==(const Shape& a, const Shape& b) {
    return a.rank_ == b.rank_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank_; ++i) {
      if (i) s += ", ";
      s += std::to_string(dims_[static_cast<std::size_t>(i)]);
    }
    return s + "]";
  }
  friend std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

 private:
  template <class It>
  void assign(It first, It last) {
    const auto n = std::distance(first, last);
    ATTN_CHECK(n <= kMaxRank, ShapeError, "tensor rank must be at most ", kMaxRank, ", got ", n);
    rank_ = static_cast<int>(n);
    int i = 0;
    Index product = 1;  // of the non-zero extents
    for (It it = first; it != last; ++it, ++i) {
      ATTN_CHECK(*it >= 0, ShapeError, "tensor extents must be >= 0, got ", *it, " on axis ", i);
      dims_[static_cast<std::size_t>(i)] = *it;
      if (*it != 0 && __builtin_mul_overflow(product, *it, &product)) {
        std::string dims;
        for (It d = first; d != last; ++d) dims += (d == first ? "" : ", ") + std::to_string(*d);
        throw ShapeError("tensor shape [" + dims + "] has more elements than an Index can count");
      }
    }
  }

  std::array<Index, kMaxRank> dims_{};
  int rank_ = 0;
};

namespace detail {

inline constexpr std::size_t kAlignment = 64;

/// An aligned, zero-initialised buffer of `capacity` elements. It comes from calloc, which hands
/// out a large block as fresh pages from the kernel without writing them: a buffer takes no memory
/// until it is written (a model built for translation never writes its gradients).
template <class T>
struct Storage {
  explicit Storage(Index n) : capacity(n) {
    ATTN_CHECK(n >= 0 && static_cast<std::uint64_t>(n) <=
                             (std::numeric_limits<std::size_t>::max() - kAlignment) / sizeof(T),
               ShapeError, "a tensor of ", n, " elements of ", sizeof(T),
               " bytes is too large to allocate");
    const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(T);
    if (bytes > 0) {
      raw = std::calloc(bytes + kAlignment, 1);  // the first kAlignment boundary within
      if (raw == nullptr) throw std::bad_alloc();
      const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(raw);
      data = reinterpret_cast<T*>((at + kAlignment - 1) / kAlignment * kAlignment);
    }
  }
  ~Storage() { std::free(raw); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  T* data = nullptr;
  Index capacity = 0;

 private:
  void* raw = nullptr;
};

}  // namespace detail

/// Row-major dynamic matrix, and the Ref types kernels take so that maps of tensors and strided
/// blocks of them (one head's columns of a [N, D] matrix) bind without copies.
template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MatrixRef = Eigen::Ref<RowMatrix<T>>;
template <class T>
using ConstMatrixRef = Eigen::Ref<const RowMatrix<T>>;
/// n contiguous elements as an Eigen array, for elementwise kernels over raw rows; const when T is
/// (`ArrayMap<const T>(p, n)`).
template <class T>
using ArrayMap =
    Eigen::Map<std::conditional_t<std::is_const_v<T>,
                                  const Eigen::Array<std::remove_const_t<T>, 1, Eigen::Dynamic>,
                                  Eigen::Array<T, 1, Eigen::Dynamic>>>;

template <class T>
class Tensor {
 public:
  using Matrix = RowMatrix<T>;
  using Vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
  using MatrixMap = Eigen::Map<Matrix>;
  using ConstMatrixMap = Eigen::Map<const Matrix>;
  using VectorMap = Eigen::Map<Vector>;
  using ConstVectorMap = Eigen::Map<const Vector>;

  /// An empty tensor of rank 0 and no storage.
  Tensor() = default;

  /// A zero-filled tensor of the given shape.
  explicit Tensor(const Shape& shape)
      : storage_(std::make_shared<detail::Storage<T>>(shape.numel())), shape_(shape) {}

  static Tensor zeros(const Shape& shape) { return Tensor(shape); }
  static Tensor full(const Shape& shape, T value) {
    Tensor t(shape);
    t.fill(value);
    return t;
  }
  /// A tensor holding `values` in row-major order; their count must match the shape.
  static Tensor from(const Shape& shape, const std::vector<T>& values) {
    ATTN_CHECK(static_cast<Index>(values.size()) == shape.numel(), ShapeError,
               "Tensor::from: shape ", shape, " holds ", shape.numel(), " values, got ",
               values.size());
    Tensor t(shape);
    std::copy(values.begin(), values.end(), t.data());
    return t;
  }

  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  Index size(int axis) const {
    ATTN_CHECK(axis >= 0 && axis < rank(), IndexError, "axis ", axis, " out of range for shape ",
               shape_);
    return shape_[axis];
  }
  /// Elements held: 0 for a tensor without storage (default-constructed), even of rank 0.
  Index numel() const { return storage_ ? shape_.numel() : 0; }
  bool empty() const { return numel() == 0; }
  /// Whether the tensor was ever allocated (a default-constructed one was not; a zero-size one
  /// made from a shape was).
  bool has_storage() const { return storage_ != nullptr; }

  T* data() { return storage_ ? storage_->data + offset_ : nullptr; }
  const T* data() const { return storage_ ? storage_->data + offset_ : nullptr; }
  T* begin() { return data(); }
  T* end() { return data() + numel(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + numel(); }

  /// Unchecked element access by N indices (checked by ATTN_ASSERT in debug builds).
  template <class... I>
  T& operator()(I... idx) {
    return data()[flat_index({static_cast<Index>(idx)...})];
  }
  template <class... I>
  const T& operator()(I... idx) const {
    return data()[flat_index({static_cast<Index>(idx)...})];
  }
  /// Bounds-checked element access; throws IndexError.
  T& at(std::initializer_list<Index> idx) { return data()[checked_index(idx)]; }
  const T& at(std::initializer_list<Index> idx) const { return data()[checked_index(idx)]; }

  /// A view with another shape of the same numel; one extent may be -1 and is inferred.
  Tensor reshape(std::initializer_list<Index> dims) const {
    return reshape(std::vector<Index>(dims));
  }
  Tensor reshape(std::vector<Index> dims) const {
    const auto requested = [&] {
      std::string r;
      for (std::size_t i = 0; i < dims.size(); ++i) r += (i ? ", " : "") + std::to_string(dims[i]);
      return "[" + r + "]";
    };
    Index known = 1;  // the product of the other extents; overflow is Shape's error below
    bool overflow = false;
    int infer = -1;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (dims[i] == -1) {
        ATTN_CHECK(infer < 0, ShapeError, "reshape: at most one extent may be -1, got ",
                   requested());
        infer = static_cast<int>(i);
      } else {
        ATTN_CHECK(dims[i] >= 0, ShapeError, "reshape: extents must be >= 0 (or one -1), got ",
                   requested());
        overflow = overflow || __builtin_mul_overflow(known, dims[i], &known);
      }
    }
    if (infer >= 0) {
      ATTN_CHECK(!overflow && known > 0 && numel() % known == 0, ShapeError,
                 "reshape: cannot view shape ", shape_, " (", numel(), " elements) as ",
                 requested());
      dims[static_cast<std::size_t>(infer)] = numel() / known;
    }
    Shape s(dims);
    ATTN_CHECK(s.numel() == numel(), ShapeError, "reshape: cannot view shape ", shape_, " (",
               numel(), " elements) as ", s, " (", s.numel(), " elements)");
    Tensor v = *this;
    v.shape_ = s;
    return v;
  }

  /// Element i of the leading axis as a view of rank - 1.
  Tensor slice(Index i) const {
    ATTN_CHECK(rank() >= 1, ShapeError, "slice: needs rank >= 1, got shape ", shape_);
    ATTN_CHECK(i >= 0 && i < shape_[0], IndexError, "slice: index ", i, " out of range [0, ",
               shape_[0], ")");
    Tensor v = *this;
    v.shape_ = Shape(shape_.begin() + 1, shape_.end());
    v.offset_ = offset_ + i * v.shape_.numel();
    return v;
  }

  /// Rows [begin, end) of the leading axis as a view of the same rank.
  Tensor slice(Index begin, Index end) const {
    ATTN_CHECK(rank() >= 1, ShapeError, "slice: needs rank >= 1, got shape ", shape_);
    ATTN_CHECK(0 <= begin && begin <= end && end <= shape_[0], IndexError, "slice: range [", begin,
               ", ", end, ") out of range [0, ", shape_[0], "]");
    std::array<Index, Shape::kMaxRank> dims{};
    std::copy(shape_.begin(), shape_.end(), dims.begin());
    const Index inner = rank() > 1 ? numel() / std::max<Index>(shape_[0], 1) : 1;
    dims[0] = end - begin;
    Tensor v = *this;
    v.shape_ = Shape(dims.data(), dims.data() + rank());
    v.offset_ = offset_ + begin * inner;
    return v;
  }

  /// The tensor as a [numel / last, last] row-major matrix (a vector becomes one row).
  MatrixMap matrix() { return MatrixMap(data(), rows(), cols()); }
  ConstMatrixMap matrix() const { return ConstMatrixMap(data(), rows(), cols()); }
  /// All elements as one column vector.
  VectorMap vector() { return VectorMap(data(), numel()); }
  ConstVectorMap vector() const { return ConstVectorMap(data(), numel()); }

  /// A deep copy with storage of its own.
  Tensor clone() const {
    if (!storage_) return Tensor();
    Tensor t(shape_);
    std::copy(begin(), end(), t.data());
    return t;
  }

  /// Gives the tensor `shape`, reusing its storage when it owns enough of it (offset 0); else
  /// allocates new zeroed storage. Contents are unspecified after a reuse. This is how modules
  /// keep their output buffers across steps without allocating.
  void resize(const Shape& shape) {
    if (storage_ && offset_ == 0 && shape.numel() <= storage_->capacity) {
      shape_ = shape;
      return;
    }
    *this = Tensor(shape);
  }

  void fill(T value) { std::fill(begin(), end(), value); }
  void set_zero() { fill(T(0)); }

  /// True when both handles point at the same first element.
  bool same_data(const Tensor& other) const { return data() == other.data(); }
  /// True when both handles are views of one allocation (whatever their offsets).
  bool shares_storage(const Tensor& other) const {
    return storage_ != nullptr && storage_ == other.storage_;
  }

 private:
  Index rows() const {
    if (rank() == 0) return storage_ ? 1 : 0;
    const Index c = shape_[rank() - 1];
    return c == 0 ? 0 : numel() / c;
  }
  Index cols() const { return rank() == 0 ? (storage_ ? 1 : 0) : shape_[rank() - 1]; }

  Index flat_index(std::initializer_list<Index> idx) const {
    ATTN_ASSERT(static_cast<int>(idx.size()) == rank());
    Index flat = 0;
    int axis = 0;
    for (Index i : idx) {
      ATTN_ASSERT(i >= 0 && i < shape_[axis]);
      flat = flat * shape_[axis++] + i;
    }
    return flat;
  }
  Index checked_index(std::initializer_list<Index> idx) const {
    ATTN_CHECK(storage_ != nullptr, IndexError, "at: the tensor has no storage");
    ATTN_CHECK(static_cast<int>(idx.size()) == rank(), IndexError, "at: ", idx.size(),
               " indices given for a tensor of shape ", shape_);
    Index flat = 0;
    int axis = 0;
    for (Index i : idx) {
      ATTN_CHECK(i >= 0 && i < shape_[axis], IndexError, "at: index ", i, " out of range [0, ",
                 shape_[axis], ") on axis ", axis, " of shape ", shape_);
      flat = flat * shape_[axis++] + i;
    }
    return flat;
  }

  std::shared_ptr<detail::Storage<T>> storage_;
  Shape shape_;
  Index offset_ = 0;
};

/// Throws ShapeError unless `t` has exactly `expected` shape; `what` names the tensor.
template <class T>
void check_shape(const Tensor<T>& t, const Shape& expected, const char* what) {
  ATTN_CHECK(t.shape() == expected, ShapeError, what, ": expected shape ", expected, ", got ",
             t.shape());
}

}  // namespace attn
