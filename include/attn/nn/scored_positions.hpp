// The target positions a loss scores: those whose target is not padding. A training step needs the
// projection onto the vocabulary (the largest product of a small model's step) only there, so
// Transformer::forward_scored gathers the decoder's output rows at these positions before the
// projection and scatters their gradient back after it. With batches of sentences sorted by
// length, 10-15% of the target positions are padding.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "attn/tensor.hpp"

namespace attn {

template <class T>
class ScoredPositions {
 public:
  /// Keeps the positions i of targets [B, T] (row-major) where targets[i] != pad_id, in order,
  /// and their targets.
  void select(const Tensor<TokenId>& targets, TokenId pad_id) {
    positions_.clear();
    positions_.reserve(static_cast<std::size_t>(targets.numel()));
    for (Index i = 0; i < targets.numel(); ++i)
      if (targets.data()[i] != pad_id) positions_.push_back(i);
    all_positions_ = targets.numel();
    targets_.resize({count()});
    for (Index r = 0; r < count(); ++r) targets_.data()[r] = targets.data()[at(r)];
  }

  /// The rows of h [B, T, D] at the positions: [n, D].
  const Tensor<T>& gather(const Tensor<T>& h) {
    ATTN_CHECK(h.rank() >= 2 && h.numel() == all_positions_ * h.size(h.rank() - 1), ShapeError,
               "ScoredPositions::gather: expected ", all_positions_, " rows, got ", h.shape());
    const Index D = h.size(h.rank() - 1);
    gathered_.resize({count(), D});
    for (Index r = 0; r < count(); ++r) copy_row(h.data() + at(r) * D, gathered_.data() + r * D, D);
    return gathered_;
  }

  /// dh at the positions [n, D] -> dh [B, T, D] (`shape`), zero at every other position.
  const Tensor<T>& scatter(const Tensor<T>& dh_scored, const Shape& shape) {
    const Index D = shape.rank() >= 2 ? shape[shape.rank() - 1] : 0;
    ATTN_CHECK(shape.numel() == all_positions_ * D && D > 0 && dh_scored.rank() == 2 &&
                   dh_scored.size(0) == count() && dh_scored.size(1) == D,
               ShapeError, "ScoredPositions::scatter: expected [", count(), ", ", D, "] for ",
               shape, ", got ", dh_scored.shape());
    scattered_.resize(shape);
    T* out = scattered_.data();
    Index next = 0;  // the position after the last one written
    for (Index r = 0; r < count(); ++r) {
      std::fill(out + next * D, out + at(r) * D, T(0));
      copy_row(dh_scored.data() + r * D, out + at(r) * D, D);
      next = at(r) + 1;
    }
    std::fill(out + next * D, out + all_positions_ * D, T(0));
    return scattered_;
  }

  Index count() const { return static_cast<Index>(positions_.size()); }
  /// The targets at the positions, [n].
  const Tensor<TokenId>& targets() const { return targets_; }

 private:
  Index at(Index r) const { return positions_[static_cast<std::size_t>(r)]; }
  static void copy_row(const T* from, T* to, Index D) {
    std::memcpy(to, from, sizeof(T) * static_cast<std::size_t>(D));
  }

  std::vector<Index> positions_;  // [n] flat indices into [B, T], ascending
  Index all_positions_ = 0;       // B T
  Tensor<TokenId> targets_;       // [n]
  Tensor<T> gathered_;            // [n, D]
  Tensor<T> scattered_;           // [B, T, D]
};

}  // namespace attn
