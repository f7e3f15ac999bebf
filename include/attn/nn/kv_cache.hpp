// KVCache: the projected keys and values one attention layer has seen while decoding step by step.
//
// Self-attention appends one position per step: keys and values are reserved once for the longest
// output (allocate) and never reallocated while decoding. Cross-attention fills the cache once, on
// its first step, with the projection of the whole memory (the encoder output does not change
// while decoding), and reuses it on every later step. clear() forgets the content and keeps the
// storage, for the next batch.
#pragma once

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn {

template <class T>
struct KVCache {
  Tensor<T> keys;    // [B, capacity, D] projected keys of positions [0, length), heads in columns
  Tensor<T> values;  // [B, capacity, D] projected values, same layout
  Index length = 0;  // positions filled

  /// Reserves `capacity` positions of `batch` rows of width `d_model`, and empties the cache.
  void allocate(Index batch, Index capacity, Index d_model) {
    ATTN_CHECK(batch > 0 && capacity > 0 && d_model > 0, ShapeError,
               "KVCache::allocate: batch, capacity and d_model must be > 0, got ", batch, ", ",
               capacity, ", ", d_model);
    keys.resize({batch, capacity, d_model});
    values.resize({batch, capacity, d_model});
    length = 0;
  }
  /// Empties the cache; the storage stays for the next batch.
  void clear() { length = 0; }

  bool allocated() const { return keys.rank() == 3; }
  Index batch() const { return allocated() ? keys.size(0) : 0; }
  Index capacity() const { return allocated() ? keys.size(1) : 0; }
};

}  // namespace attn
