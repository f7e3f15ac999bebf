// KVCache: the projected keys and values one attention layer has seen while decoding step by step.
//
// Self-attention appends one position per step: keys and values are reserved once for the longest
// output (allocate) and never reallocated while decoding. Cross-attention fills the cache once, on
// its first step, with the projection of the whole memory (the encoder output does not change
// while decoding), and reuses it on every later step. clear() forgets the content and keeps the
// storage, for the next batch. reorder() follows beam search, whose surviving hypotheses continue
// from other rows' prefixes.
#pragma once

#include <algorithm>
#include <vector>

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
  /// The bytes this cache holds: keys, values and reorder()'s staging copy.
  double bytes() const {
    return static_cast<double>(keys.numel() + values.numel() + scratch_.numel()) * sizeof(T);
  }
  Index batch() const { return allocated() ? keys.size(0) : 0; }
  Index capacity() const { return allocated() ? keys.size(1) : 0; }

  /// `length` is a public field: ShapeError unless it is in [0, capacity], naming `who`.
  void check_length(const char* who) const {
    ATTN_CHECK(length >= 0 && length <= capacity(), ShapeError, who, ": length ", length,
               " outside [0, capacity ", capacity(), "]");
  }

  /// Row b takes the content of row rows[b] (rows may repeat or drop rows), positions
  /// [0, length): what a beam search does when hypothesis b extends the old hypothesis rows[b].
  void reorder(const std::vector<Index>& rows) {
    ATTN_CHECK(static_cast<Index>(rows.size()) == batch(), ShapeError,
               "KVCache::reorder: expected ", batch(), " row indices, got ", rows.size());
    for (Index r : rows)
      ATTN_CHECK(r >= 0 && r < batch(), IndexError, "KVCache::reorder: row ", r,
                 " out of range [0, ", batch(), ")");
    check_length("KVCache::reorder");
    reorder(keys, rows);
    reorder(values, rows);
  }

  /// Row b becomes row rows[b] of `from`, positions [0, from.length): what beam search does when
  /// the first step, run once per sentence, hands each sentence's cache to its beams. Keeps this
  /// cache's storage when it has the rows and the room, else takes from's capacity.
  void gather(const KVCache& from, const std::vector<Index>& rows) {
    ATTN_CHECK(from.allocated(), ShapeError, "KVCache::gather: the source cache is not allocated");
    from.check_length("KVCache::gather (the source)");
    // A copy of a cache is a handle to its storage: gathering from it overwrote rows still to be
    // read (and allocate() could replace the storage first).
    ATTN_CHECK(!keys.shares_storage(from.keys) && !values.shares_storage(from.values) &&
                   !keys.shares_storage(from.values) && !values.shares_storage(from.keys),
               ConfigError,
               "KVCache::gather: the source shares this cache's storage; reorder() rearranges a "
               "cache's own rows");
    for (Index r : rows)
      ATTN_CHECK(r >= 0 && r < from.batch(), IndexError, "KVCache::gather: row ", r,
                 " out of range [0, ", from.batch(), ")");
    const Index B = static_cast<Index>(rows.size()), D = from.keys.size(2);
    const bool fits = allocated() && batch() == B && capacity() >= from.length && keys.size(2) == D;
    const Index cap = fits ? capacity() : from.capacity();
    if (!fits) allocate(B, cap, D);
    const Index n = from.length * D;
    for (Index b = 0; b < B; ++b) {
      const Index src = rows[static_cast<std::size_t>(b)] * from.capacity() * D;
      std::copy_n(from.keys.data() + src, n, keys.data() + b * cap * D);
      std::copy_n(from.values.data() + src, n, values.data() + b * cap * D);
    }
    length = from.length;
  }

 private:
  void reorder(Tensor<T>& t, const std::vector<Index>& rows) {
    const Index B = t.size(0), cap = t.size(1), n = length * t.size(2);
    scratch_.resize({B, n});  // kept across calls: no allocation per decoding step
    for (Index b = 0; b < B; ++b) {
      const T* from = t.data() + rows[static_cast<std::size_t>(b)] * cap * t.size(2);
      std::copy(from, from + n, scratch_.data() + b * n);
    }
    for (Index b = 0; b < B; ++b)
      std::copy(scratch_.data() + b * n, scratch_.data() + (b + 1) * n,
                t.data() + b * cap * t.size(2));
  }

  Tensor<T> scratch_;  // [B, length * D] staging for reorder
};

}  // namespace attn
