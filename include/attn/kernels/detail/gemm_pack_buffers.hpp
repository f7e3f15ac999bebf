// Where the packed GEMM packs: per-thread buffers that only ever grow, so that a training loop
// allocates them in its first step and never again. Two kinds:
//   - pack_buffer: the scratch a product packs B, A or a copy of C into, reused by the next one;
//   - packed copies of B kept for the length of a ReusedBScope on the thread (reused_packing).
//
// Why the copies: attention multiplies every block of a head's queries by the same K^T and V
// (forward) and K^T, V^T and K (backward), and packed them again for each block of 128 queries.
// On Zen 3, at 4 x 512 tokens (1 thread, the benchmark's peak probe left out), packing B held
// 8.4% of the benchmark's samples, and 4.9% with those four operands packed once per head (the
// rest packs each block's Q and dO, which differ from block to block). Forward + backward, 2
// threads, alternating rounds, the final code against the commit before: 1.09x faster at 4 x 512
// and 1.07x at 1 x 1024 (6 rounds each, faster in all); earlier runs: 0.97x and 1.06x at 8 x 256
// (6 and 10 rounds), level at 128 and 64 (one block per head: nothing is reused). Under a causal
// mask each block sees more keys than the one before: the first packs all of the head's keys,
// and each block reads the leading part it sees (gemm_packed_order's b larger than the product).
// Unlike gemm_weight_cache.hpp's copies of a decoding call's weights, the copies outlive the scope
// (marked empty at its end). B must not change while the scope is open.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <new>

#include "attn/kernels/detail/gemm_operand.hpp"
#include "attn/kernels/detail/growing_buffer.hpp"

namespace attn::kernels::detail {

/// A 64-byte aligned buffer per thread and purpose that only ever grows.
enum class PackSlot { b = 0, a = 1, c = 2, shared_a = 3 };
inline float* pack_buffer(PackSlot slot, Index floats) {
  struct Buffer {
    float* data = nullptr;
    Index capacity = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffers[4];
  Buffer& buf = buffers[static_cast<int>(slot)];
  if (buf.capacity < floats) {
    std::free(buf.data);
    buf.data = nullptr;
    buf.capacity = 0;
    const std::size_t bytes = (static_cast<std::size_t>(floats) * sizeof(float) + 63) / 64 * 64;
    buf.data = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (buf.data == nullptr) throw std::bad_alloc();
    buf.capacity = floats;
  }
  return buf.data;
}

/// One packed copy, the operand it was packed from and how (panel width and depth of blocks).
struct ReusedB {
  StridedMatrix<const float> source;
  Index panel_width = 0, depth = 0;
  bool valid = false;  // written (KeptCopy::mark_written) and not yet past its scope
  GrowingBuffer<float> packed;

  bool holds(const StridedMatrix<const float>& b, Index width, Index block_depth) const {
    return valid && same_view(source, b) && panel_width == width && depth == block_depth;
  }
};

/// The calling thread's open scopes and packed copies: three, what attention's backward reuses per
/// head. A new operand replaces the copy packed longest ago.
struct ReusedBCache {
  static constexpr int kCopies = 3;
  int open_scopes = 0;
  int next = 0;  // the copy the next new operand replaces
  ReusedB copies[kCopies];
  std::uint64_t reuses = 0;  // products that found their B packed (what shows a test it worked)
};

inline ReusedBCache& reused_b_cache() {
  thread_local ReusedBCache cache;
  return cache;
}

/// Where the packed form (`floats` numbers, in panels `panel_width` wide, blocks `depth` deep) of
/// b lives while a scope is open, and whether it still has to be written: written already when b
/// was packed so before in this scope, to be written for a new operand (the copy packed longest
/// ago is taken, and holds nothing until the product marks it written); no copy when no scope is
/// open (the caller packs into its own buffer).
inline KeptCopy reused_packing(const StridedMatrix<const float>& b, Index floats, Index panel_width,
                               Index depth) {
  ReusedBCache& cache = reused_b_cache();
  if (cache.open_scopes == 0) return {};
  for (ReusedB& copy : cache.copies)
    if (copy.holds(b, panel_width, depth)) {
      ++cache.reuses;
      return {copy.packed.data(), nullptr};
    }
  ReusedB& copy = cache.copies[cache.next];
  cache.next = (cache.next + 1) % ReusedBCache::kCopies;
  copy.valid = false;
  copy.packed.grow(floats);
  copy.source = b;
  copy.panel_width = panel_width;
  copy.depth = depth;
  return {copy.packed.data(), &copy.valid};
}

/// Grows each of the calling thread's copies to at least `floats` numbers, outside a scope (where
/// every copy is empty). A parallel region calls it on every thread before its tasks: a thread
/// that took no task of the largest shape in the first steps (its core held by another process)
/// allocated in a later step (Allocation.BatchesOfShapesSeenBeforeAllocateNothing, under load).
inline void reserve_reused_copies(Index floats) {
  if (reused_b_cache().open_scopes > 0) return;
  for (ReusedB& copy : reused_b_cache().copies) copy.packed.grow(floats);
}

/// While one lives on the calling thread, products there whose B is marked reusable
/// (gemm_packed_order's `reuse_b`) pack it once. When the outermost scope ends, every copy is
/// marked empty: the next scope may see other data at the same addresses.
class ReusedBScope {
 public:
  ReusedBScope() { ++reused_b_cache().open_scopes; }
  ~ReusedBScope() {
    ReusedBCache& cache = reused_b_cache();
    if (--cache.open_scopes > 0) return;
    for (ReusedB& copy : cache.copies) copy.valid = false;
    cache.next = 0;
  }
  ReusedBScope(const ReusedBScope&) = delete;
  ReusedBScope& operator=(const ReusedBScope&) = delete;
};

}  // namespace attn::kernels::detail
