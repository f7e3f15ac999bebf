// Position information added to the embeddings (paper section 3.5):
//   SinusoidalPositionalEncoding  PE(pos, 2i) = sin(pos / 10000^(2i / D)),
//                                 PE(pos, 2i+1) = cos(pos / 10000^(2i / D)); no parameters.
//   LearnedPositionalEmbedding    a learned [max_len, D] table, the variant of Table 3 row (E).
// Both take a `start` offset so incremental decoding can add the encoding of position t alone.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/nn/layer_options.hpp"  // ConfigLimits
#include "attn/nn/module.hpp"

namespace attn {

namespace detail {

/// Throws ShapeError unless x is [B, L, d_model].
template <class T>
void check_positional_input(const Tensor<T>& x, Index d_model, const char* who) {
  ATTN_CHECK(x.rank() == 3 && x.size(2) == d_model, ShapeError, who, ": expected input [B, L, ",
             d_model, "], got ", x.shape());
}

}  // namespace detail

template <class T>
class SinusoidalPositionalEncoding : public Module<T> {
 public:
  explicit SinusoidalPositionalEncoding(Index d_model) : d_(d_model) {
    ATTN_CHECK(d_model > 0, ConfigError, "SinusoidalPositionalEncoding: d_model must be > 0, got ",
               d_model);
  }

  /// x [B, L, D] -> y [B, L, D] = x + PE[start : start + L].
  const Tensor<T>& forward(const Tensor<T>& x, Index start = 0) {
    detail::check_positional_input(x, d_, "SinusoidalPositionalEncoding");
    const Index B = x.size(0), L = x.size(1);
    ATTN_CHECK(start >= 0, IndexError, "SinusoidalPositionalEncoding: start must be >= 0, got ",
               start);
    ATTN_CHECK(start <= kMaxLength - L, IndexError, "SinusoidalPositionalEncoding: ", L,
               " positions from ", start, " go past the ", kMaxLength, " it tabulates");
    ensure(start + L);
    y_.resize(x.shape());
    const auto pe = cache_.matrix().middleRows(start, L);
    for (Index b = 0; b < B; ++b) y_.slice(b).matrix() = x.slice(b).matrix() + pe;
    return y_;
  }

  /// Backward of y = x + PE: dx = dy, returned as a handle to dy itself.
  const Tensor<T>& backward(const Tensor<T>& dy) {
    ATTN_CHECK(dy.shape() == y_.shape(), ShapeError,
               "SinusoidalPositionalEncoding::backward: expected dy of shape ", y_.shape(),
               ", got ", dy.shape());
    dx_ = dy;
    return dx_;
  }

  /// PE[0 : length] as a [length, D] view of the cache (grown if needed).
  const Tensor<T>& table(Index length) {
    ATTN_CHECK(length >= 0 && length <= kMaxLength, IndexError,
               "SinusoidalPositionalEncoding: length must be in [0, ", kMaxLength, "], got ",
               length);
    ensure(length);
    table_view_ = cache_.slice(0, length);
    return table_view_;
  }

  /// The most positions tabulated: as many as a model's learned positions may have.
  static constexpr Index kMaxLength = ConfigLimits::kMaxPositions;

  /// Rows the cache currently holds.
  Index cached_length() const { return cache_.rank() == 2 ? cache_.size(0) : 0; }
  Index d_model() const { return d_; }

 private:
  /// Grows the cache to at least `length` rows, doubling so that growth is amortised O(1) per
  /// position. Angles are computed in double: at pos 5000 a float angle would already be off
  /// by ~1e-4 rad.
  void ensure(Index length) {
    const Index have = cached_length();
    if (length <= have) return;
    const Index rows = std::min(std::max(length, 2 * have), kMaxLength);
    // 10000^(2i / D) per column, once per growth rather than once per element.
    std::vector<double> denom(static_cast<std::size_t>(d_));
    for (Index j = 0; j < d_; ++j)
      denom[static_cast<std::size_t>(j)] =
          std::pow(10000.0, static_cast<double>(j - j % 2) / static_cast<double>(d_));
    Tensor<T> grown({rows, d_});
    for (Index pos = 0; pos < rows; ++pos)
      for (Index j = 0; j < d_; ++j) {
        const double angle = static_cast<double>(pos) / denom[static_cast<std::size_t>(j)];
        grown(pos, j) = static_cast<T>(j % 2 == 0 ? std::sin(angle) : std::cos(angle));
      }
    cache_ = grown;
  }

  Index d_;
  Tensor<T> cache_;       // [>= longest length seen, D] PE table, computed in double
  Tensor<T> table_view_;  // [length, D] view returned by table()
  Tensor<T> y_;           // [B, L, D] output buffer
  Tensor<T> dx_;          // handle to the last dy (the gradient passes through unchanged)
};

template <class T>
class LearnedPositionalEmbedding : public Module<T> {
 public:
  LearnedPositionalEmbedding(Index max_len, Index d_model) : max_len_(max_len), d_(d_model) {
    ATTN_CHECK(max_len > 0, ConfigError, "LearnedPositionalEmbedding: max_len must be > 0, got ",
               max_len);
    ATTN_CHECK(d_model > 0, ConfigError, "LearnedPositionalEmbedding: d_model must be > 0, got ",
               d_model);
    weight.allocate({max_len_, d_});
    this->register_parameter("weight", &weight);
  }

  /// N(0, D^-1/2), the same scale as the token embeddings it is added to.
  void reset_parameters(Rng& rng) {
    fill_normal(weight.value, rng, 0.0, 1.0 / std::sqrt(static_cast<double>(d_)));
  }

  /// x [B, L, D] -> y [B, L, D] = x + weight[start : start + L].
  const Tensor<T>& forward(const Tensor<T>& x, Index start = 0) {
    detail::check_positional_input(x, d_, "LearnedPositionalEmbedding");
    const Index B = x.size(0), L = x.size(1);
    // Compared without start + L, which overflows for a start near Index's limit; the message's
    // end is computed in unsigned arithmetic for a start >= 0, where it cannot overflow.
    ATTN_CHECK(start >= 0 && start <= max_len_ - L, IndexError,
               "LearnedPositionalEmbedding: positions [", start, ", ",
               start < 0 ? std::to_string(start + L)
                         : std::to_string(static_cast<std::uint64_t>(start) +
                                          static_cast<std::uint64_t>(L)),
               ") (length ", L, " from start ", start, ") exceed max_len ", max_len_);
    start_ = start;
    y_.resize(x.shape());
    const auto pe = weight.value.matrix().middleRows(start, L);
    for (Index b = 0; b < B; ++b) y_.slice(b).matrix() = x.slice(b).matrix() + pe;
    return y_;
  }

  /// Backward of y = x + weight[start : start + L]: weight.grad[start + l] += sum_b dy[b, l];
  /// dx = dy, returned as a handle to dy itself.
  const Tensor<T>& backward(const Tensor<T>& dy) {
    // Before any forward y_ is a default tensor, whose shape [] a default dy matched.
    ATTN_CHECK(y_.rank() == 3, StateError,
               "LearnedPositionalEmbedding::backward: needs a forward first");
    ATTN_CHECK(dy.shape() == y_.shape(), ShapeError,
               "LearnedPositionalEmbedding::backward: expected dy of shape ", y_.shape(), ", got ",
               dy.shape());
    const Index B = dy.size(0), L = dy.size(1);
    auto g = weight.grad.matrix().middleRows(start_, L);
    for (Index b = 0; b < B; ++b) g += dy.slice(b).matrix();
    dx_ = dy;
    return dx_;
  }

  Index max_len() const { return max_len_; }
  Index d_model() const { return d_; }

  Parameter<T> weight;  // [max_len, D]

 private:
  Index max_len_, d_;
  Index start_ = 0;  // start of the last forward, kept for backward
  Tensor<T> y_;      // [B, L, D] output buffer
  Tensor<T> dx_;     // handle to the last dy
};

}  // namespace attn
