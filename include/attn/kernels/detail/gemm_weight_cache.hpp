// Packed weights kept for the length of a decoding call. Decoding runs every decoder weight through
// a product of a few dozen rows per step (one row per sentence or beam); packing the weight (B)
// for each such product costs more than the product itself. While a ConstantWeightsScope
// (kernels/gemm.hpp) lives on the calling thread, a product whose B is marked as a weight keeps a
// packed copy from the weight's second use on. A weight met once (the encoder's) is packed into the
// usual buffer, since a copy would cost an allocation and its page faults for nothing (measured: it
// made batch-1 greedy decoding 2.3x slower). The end of the scope frees the copies. Only decoding
// opens a scope: it never changes a weight, whereas training changes them every step.
#pragma once

#include <cstdlib>
#include <new>
#include <vector>

#include "attn/kernels/detail/gemm_operand.hpp"

namespace attn::kernels::detail {

/// One packed copy and the operand it was packed from.
struct PackedWeight {
  StridedMatrix<const float> source;
  Index panel_width;        // the kernel's: a weight packed for another kernel is another entry
  float* packed = nullptr;  // 64-byte aligned, owned by the cache; null while seen only once
  bool written = false;     // set by the product that packed it, once it has returned (KeptCopy)
};

/// The calling thread's open scopes and packed copies.
struct WeightCache {
  int depth = 0;
  std::vector<PackedWeight> entries;
  WeightCache() = default;
  WeightCache(const WeightCache&) = delete;
  WeightCache& operator=(const WeightCache&) = delete;
  ~WeightCache() { clear(); }
  void clear() {
    for (auto& e : entries) std::free(e.packed);
    entries.clear();
  }
};

inline WeightCache& weight_cache() {
  thread_local WeightCache cache;
  return cache;
}

/// Where the packed form (`floats` numbers, in panels `panel_width` wide) of weight operand b lives
/// while a scope is open, and whether it still has to be written (its second use, or a use after
/// one that did not finish); no copy when no scope is open or on the weight's first use (the
/// caller packs into its own buffer).
inline KeptCopy cached_packing(const StridedMatrix<const float>& b, Index floats,
                               Index panel_width) {
  WeightCache& cache = weight_cache();
  if (cache.depth == 0) return {};
  for (PackedWeight& e : cache.entries) {
    if (!same_view(e.source, b) || e.panel_width != panel_width) continue;
    if (e.packed == nullptr) {
      const std::size_t bytes = (static_cast<std::size_t>(floats) * sizeof(float) + 63) / 64 * 64;
      e.packed = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (e.packed == nullptr) throw std::bad_alloc();
    }
    return {e.packed, e.written ? nullptr : &e.written};
  }
  cache.entries.push_back({b, panel_width, nullptr});
  return {};
}

}  // namespace attn::kernels::detail
