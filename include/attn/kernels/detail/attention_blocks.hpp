// What attention's fast kernel (kernels/attention.hpp) is built of: per-thread scratch buffers,
// the row passes of the softmax with masks, and the walk over (batch row, head) pairs in blocks of
// query rows, one pair per thread at a time.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>

#include "attn/kernels/attention_common.hpp"
#include "attn/kernels/detail/attention_tile_avx512.hpp"
#include "attn/kernels/detail/gemm_pack_buffers.hpp"
#include "attn/kernels/detail/growing_buffer.hpp"
#include "attn/kernels/detail/softmax_avx2.hpp"
#include "attn/kernels/detail/softmax_avx512.hpp"
#include "attn/kernels/softmax.hpp"
#include "attn/parallel.hpp"

namespace attn::kernels {

/// Query rows per block. Blocks in register tiles transpose their K and V again (the GEMMs pack
/// them once per head, gemm_pack_buffers.hpp), so taller blocks amortise that (128 rows measured
/// ~8% faster than 64 at L = 512, 1024, when the products were Eigen's, which packed per block;
/// 256 no better in backward), while backward's [128, S] float buffers (three with dropout) still
/// fit in L2 up to S of about 1024.
inline constexpr Index kAttentionQueryBlock = 128;

/// Below this many multiply-adds of Q K^T (B*H*T*S*K) the kernels run on the calling thread:
/// waking a thread team costs more than such a call (one decoding step, a gradient check), and
/// on a loaded machine a team's barrier can wait for a descheduled thread for milliseconds.
inline constexpr Index kAttentionParallelMinWork = Index(1) << 16;

namespace detail {

/// Everything one thread reuses across the (b, h) pairs it computes: [rows, S] buffers with rows S
/// apart, kept per thread from call to call and only ever grown, so that a training loop allocates
/// them in its first step and never again.
template <class T>
struct AttentionScratch {
  GrowingBuffer<T> p;    // [block, S] logits, then probabilities
  GrowingBuffer<T> dp;   // [block, S] dO V^T, then dlogits (backward)
  GrowingBuffer<T> pd;   // [block, S] dropped probabilities (backward with dropout)
  GrowingBuffer<T> pad;  // [S] key padding bias of the current batch row: 0 or -infinity
  GrowingBuffer<T> kt;   // [head_dim, 64] a block's K^T (register tiles)
  GrowingBuffer<T> vt;   // [head_dim, 64] a block's V^T (register tiles, backward)
  Index S = 0;
  Index pad_batch = -1;
  std::uint64_t tiled = 0;  // blocks of this call run in register tiles (see tile_blocks)

  /// The buffers for one call: [rows, S] each (dp in backward, pd in backward with dropout).
  void prepare(Index rows, Index keys, bool backward, bool dropout) {
    S = keys;
    pad_batch = -1;
    tiled = 0;
    p.grow(rows * keys);
    if (backward) dp.grow(rows * keys);
    if (backward && dropout) pd.grow(rows * keys);
    pad.grow(keys);
#if defined(ATTN_HAVE_AVX512)
    if constexpr (std::is_same_v<T, float>) {
      kt.grow(kTileHeadDim * kTileKeys);
      if (backward) vt.grow(kTileHeadDim * kTileKeys);
    }
#endif
  }
  /// The first nt rows and ns columns of buffer `buf`.
  StridedMap<T> block(GrowingBuffer<T>& buf, Index nt, Index ns) {
    return StridedMap<T>(buf.data(), nt, ns, Eigen::OuterStride<>(S));
  }
};

/// The calling thread's scratch.
template <class T>
AttentionScratch<T>& thread_scratch() {
  thread_local AttentionScratch<T> scratch;
  return scratch;
}

/// Fills scratch.pad for batch row b, once per b rather than once per row.
template <class T>
const T* key_padding_bias(AttentionScratch<T>& scratch, const KeyPaddingMask& mask, Index b) {
  if (mask.empty()) return nullptr;
  if (scratch.pad_batch != b) {
    const std::uint8_t* real = mask.row(b);
    for (Index s = 0; s < scratch.S; ++s)
      scratch.pad.data()[s] = real[s] ? T(0) : -std::numeric_limits<T>::infinity();
    scratch.pad_batch = b;
  }
  return scratch.pad.data();
}

/// row[0, n) <- scale * row + additive + pad (the last two optional).
template <class T>
void scale_and_mask(T* row, Index n, T scale, const T* additive, const T* pad) {
  ArrayMap<T> r(row, n);
  if (additive != nullptr && pad != nullptr)
    r = r * scale + ArrayMap<const T>(additive, n) + ArrayMap<const T>(pad, n);
  else if (additive != nullptr)
    r = r * scale + ArrayMap<const T>(additive, n);
  else if (pad != nullptr)
    r = r * scale + ArrayMap<const T>(pad, n);
  else
    r *= scale;
}

/// In place: row[0, n) <- softmax(scale row + additive + pad); returns the log-sum-exp. The
/// AVX-512 or AVX2 rows for float (detail/softmax_avx512.hpp, softmax_avx2.hpp: the same bits),
/// else two Eigen passes.
template <class T>
T softmax_masked_row(T* row, Index n, T scale, const T* additive, const T* pad) {
#if defined(ATTN_HAVE_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_has_avx512()) return softmax_row_avx512(row, n, scale, additive, pad);
    if (cpu_has_avx2_fma()) return avx2::softmax_row(row, n, scale, additive, pad);
  }
#endif
  scale_and_mask(row, n, scale, additive, pad);
  return softmax_row_forward(row, n);
}

/// In place: row[0, n) <- exp(scale row + additive + pad - lse), flushed (softmax.hpp): the
/// probabilities backward recomputes from the saved log-sum-exp.
template <class T>
void recompute_probabilities(T* row, Index n, T scale, const T* additive, const T* pad, T lse) {
#if defined(ATTN_HAVE_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_has_avx512()) return probabilities_avx512(row, n, scale, additive, pad, lse);
    if (cpu_has_avx2_fma()) return avx2::probabilities(row, n, scale, additive, pad, lse);
  }
#endif
  scale_and_mask(row, n, scale, additive, pad);
  ArrayMap<T>(row, n) -= lse;
  exp_flush_denormals(row, n);
}

/// Keys [0, n) that query t may see before masking by padding or bias: the causal prefix.
inline Index visible_keys(bool causal, Index t, Index Tq, Index S) {
  return causal ? t + 1 + (S - Tq) : S;
}

/// A block of query rows [t0, t0 + nt) of one head and the keys [0, ns) its last row may see (S
/// unless causal): what one step of the kernels below computes. pad is the batch row's key padding
/// bias (nullptr without padding).
template <class T>
struct QueryBlock {
  const AttentionHead& head;
  const T* pad;
  Index t0, nt, ns;

  /// The block's rows of a matrix of B*T query rows (Q, O, dQ, dO): [nt, K].
  template <class U>
  StridedMap<U> queries(U* x, Index ld) const {
    return head.queries(x, ld, t0, nt);
  }
  /// The keys the block sees in a matrix of B*S key rows (K, V, dK, dV): [ns, K].
  template <class U>
  auto keys(U* x, Index ld) const {
    return head.keys(x, ld).topRows(ns);
  }
};

/// One query row of a block: i its row in the block's [nt, S] buffers, t its position, bht its
/// index in [B, H, T] arrays, n the keys [0, n) it may see before padding and bias.
struct QueryRow {
  Index i, t, bht, n;
};

/// Row i of `block`.
template <class T>
QueryRow query_row(const QueryBlock<T>& block, Index i, bool causal) {
  const AttentionShape& shape = block.head.shape;
  const Index t = block.t0 + i;
  return {i, t, block.head.query_index(t), visible_keys(causal, t, shape.queries, shape.keys)};
}

/// Calls row(QueryRow) for each row of `block`, in order.
template <class T, class Row>
void for_each_query_row(const QueryBlock<T>& block, bool causal, Row row) {
  for (Index i = 0; i < block.nt; ++i) row(query_row(block, i, causal));
}

/// How many query blocks have run in register tiles (forward, backward) since the process began:
/// what shows a test that the tiles were taken, as their results are the other path's bits. Each
/// thread counts a call's blocks in its scratch and adds them here once, at the end of the call,
/// so that the blocks do not share a counter's cache line.
inline std::atomic<std::uint64_t>& tile_blocks(bool backward) {
  static std::atomic<std::uint64_t> counts[2];
  return counts[backward ? 1 : 0];
}

/// Runs body(scratch, QueryBlock) for every block of kAttentionQueryBlock query rows of every
/// (batch row, head) pair, the blocks of a pair in order on one thread: in parallel over the
/// pairs (a StealingLoop), each thread with its own scratch, when the work is worth waking a
/// thread team.
template <class T, class Body>
void for_each_query_block(const AttentionShape& shape, const AttentionMask<T>& mask, bool backward,
                          bool drop, Body body) {
  const Index pairs = shape.batch * shape.heads;
  const Index work = pairs * shape.queries * shape.keys * shape.head_dim;
  const Index rows = std::min(kAttentionQueryBlock, shape.queries);
  RegionErrors errors;  // a scratch too large for memory is a std::bad_alloc for the caller
  const auto prepare = [&](AttentionScratch<T>& scratch) {
    errors.run([&] {
      scratch.prepare(rows, shape.keys, backward, drop);
      // The packed head operands the products keep: K^T and V^T [head_dim, S], V and K
      // [S, head_dim], in panels of whichever kernel runs.
      if constexpr (std::is_same_v<T, float>)
        reserve_reused_copies(std::max(shape.head_dim * packed_width(shape.keys),
                                       shape.keys * packed_width(shape.head_dim)));
    });
  };
  const auto finish = [&](const AttentionScratch<T>& scratch) {
    if (scratch.tiled > 0)
      tile_blocks(backward).fetch_add(scratch.tiled, std::memory_order_relaxed);
  };
  const auto pair = [&](AttentionScratch<T>& scratch, Index bh) {
    errors.run([&] {
      const AttentionHead head{shape, bh / shape.heads, bh % shape.heads};
      const T* pad = key_padding_bias(scratch, mask.key_padding, head.b);
      // The head's K^T, V, V^T and K packed once for all its blocks, all S keys, of which each
      // block reads those it sees (fewer in the earlier blocks under a causal mask).
      const ReusedBScope head_operands;
      for (Index t0 = 0; t0 < shape.queries; t0 += rows) {
        const Index nt = std::min(rows, shape.queries - t0);
        const Index ns = visible_keys(mask.causal, t0 + nt - 1, shape.queries, shape.keys);
        body(scratch, QueryBlock<T>{head, pad, t0, nt, ns});
      }
    });
  };
#if defined(_OPENMP)
  if (pairs > 1 && work >= kAttentionParallelMinWork && opens_team()) {
    StealingLoop loop(pairs, omp_get_max_threads(), work / pairs);
#pragma omp parallel
    {
      AttentionScratch<T>& scratch = thread_scratch<T>();
      prepare(scratch);
      loop.run(omp_get_thread_num(), [&](Index bh) { pair(scratch, bh); });
      finish(scratch);
    }
    return errors.rethrow();
  }
#endif
  // On the calling thread, without a region (opens_team says why).
  AttentionScratch<T>& scratch = thread_scratch<T>();
  prepare(scratch);
  for (Index bh = 0; bh < pairs; ++bh) pair(scratch, bh);
  finish(scratch);
  errors.rethrow();
}
}  // namespace detail
}  // namespace attn::kernels
