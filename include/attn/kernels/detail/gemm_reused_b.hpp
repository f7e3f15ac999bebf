// Packed right-hand sides kept for the length of a scope on one thread. Attention multiplies every
// block of a head's queries by the same K^T and V (forward) and K^T, V^T and K (backward), and
// packed them again for each block. At 512 keys, in blocks of 128 queries, that packing held 8.4%
// of the kernel's samples on Zen 3 (1 thread, the benchmark's peak probe left out), and 4.9% when
// packed once per head: less saved than the three packings of four, most likely because the one
// left, a head's first, reads K and V from memory, where the later ones found them in cache.
// Forward + backward, 2 threads, alternating rounds: 1.10x faster at 1 x 1024 tokens, 1.04x and
// 1.10x at 4 x 512 (two runs), 1.06x at 8 x 256 (0.97x in a shorter first run), level at 128 and
// 64 (one block per head: nothing is reused).
//
// While a ReusedBScope lives on the calling thread, a product whose B is marked as reusable packs
// it into one of a few per-thread buffers the first time and reads that packed copy the next
// times. Unlike gemm_weight_cache.hpp's copies of a decoding call's weights, these buffers only
// ever grow and are kept when the scope ends (marked empty), so that a training loop allocates
// them in its first step and never again. B must not change while the scope is open.
#pragma once

#include <cstdint>
#include <utility>

#include "attn/kernels/detail/gemm_operand.hpp"
#include "attn/kernels/detail/growing_buffer.hpp"

namespace attn::kernels::detail {

/// One packed copy, the operand it was packed from and how (panel width and depth of blocks).
struct ReusedB {
  StridedMatrix<const float> source;
  Index panel_width = 0, depth = 0;
  bool valid = false;
  GrowingBuffer<float> packed;

  bool holds(const StridedMatrix<const float>& b, Index width, Index block_depth) const {
    const StridedMatrix<const float>& s = source;
    return valid && s.data == b.data && s.rows == b.rows && s.cols == b.cols &&
           s.row_stride == b.row_stride && s.col_stride == b.col_stride && panel_width == width &&
           depth == block_depth;
  }
};

/// The calling thread's open scopes and packed copies. Four copies: attention's backward reuses
/// three per head; a fourth operand (a causal block's keys, whose count changes from block to
/// block) replaces the copy least recently packed.
struct ReusedBCache {
  static constexpr int kCopies = 4;
  int depth = 0;  // open scopes
  int next = 0;   // the copy the next new operand replaces
  ReusedB copies[kCopies];
  std::uint64_t reuses = 0;  // products that found their B packed (what shows a test it worked)
};

inline ReusedBCache& reused_b_cache() {
  thread_local ReusedBCache cache;
  return cache;
}

/// Where the packed form (`floats` numbers, in panels `panel_width` wide, blocks `depth` deep) of
/// b lives while a scope is open, and whether it still has to be written: {copy, false} when b was
/// packed so before in this scope, {copy, true} for a new operand, {nullptr, false} when no scope
/// is open (the caller packs into its own buffer).
inline std::pair<float*, bool> reused_packing(const StridedMatrix<const float>& b, Index floats,
                                              Index panel_width, Index depth) {
  ReusedBCache& cache = reused_b_cache();
  if (cache.depth == 0) return {nullptr, false};
  for (ReusedB& copy : cache.copies)
    if (copy.holds(b, panel_width, depth)) {
      ++cache.reuses;
      return {copy.packed.data(), false};
    }
  ReusedB& copy = cache.copies[cache.next];
  cache.next = (cache.next + 1) % ReusedBCache::kCopies;
  copy.valid = false;  // until grow has succeeded
  copy.packed.grow(floats);
  copy.source = b;
  copy.panel_width = panel_width;
  copy.depth = depth;
  copy.valid = true;
  return {copy.packed.data(), true};
}

/// While one lives on the calling thread, products there whose B is marked reusable
/// (gemm_packed_order's `reuse_b`) pack it once. When the outermost scope ends, every copy is
/// marked empty: the next scope may see other data at the same addresses.
class ReusedBScope {
 public:
  ReusedBScope() { ++reused_b_cache().depth; }
  ~ReusedBScope() {
    ReusedBCache& cache = reused_b_cache();
    if (--cache.depth > 0) return;
    for (ReusedB& copy : cache.copies) copy.valid = false;
    cache.next = 0;
  }
  ReusedBScope(const ReusedBScope&) = delete;
  ReusedBScope& operator=(const ReusedBScope&) = delete;
};

}  // namespace attn::kernels::detail
