// Attention's blocks in AVX-512 register tiles (attention_tile_avx512.hpp): when they apply, and
// the drivers that run a forward block, a backward block's scores and its gradient products in
// them instead of in packed GEMMs (the same bits).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attn/kernels/detail/attention_blocks.hpp"
#include "attn/kernels/detail/attention_tile_avx512.hpp"
#include "attn/kernels/detail/gemm_operand.hpp"
#include "attn/kernels/gemm.hpp"

namespace attn::kernels::detail {

/// Queries a block needs (and, in backward, keys) to run in register tiles, and from which the
/// blocks that do not run in them take the packed kernel's order (block_product). Fewer take the
/// few-row GEMM, which reads each key once, in place: a decoding step's one query per head, where
/// a tile would first transpose the block's keys. Measured (session 33, attention forward and
/// backward, 4 heads of 32, B x L = 4,096 tokens, 2 threads): with tiles from 2 rows, backward at
/// L = 2 took 1.8 ms against 1.3; on AVX2 the packed order from 4 rows made L = 4 1.3-1.4x slower
/// than the few-row kernels, and it breaks even at 8.
inline constexpr Index kTileMinRows = 8;

/// Whether a forward block of nt queries against ns keys runs in register tiles
/// (attention_tile_avx512.hpp): float on a CPU with AVX-512 whose products take the AVX-512 GEMM
/// (whose bits the tiles give), heads of 16 to 64 dimensions (a multiple of 16), 1 to 64 keys and
/// at least kTileMinRows queries.
template <class T>
bool forward_tiles_apply(const AttentionShape& shape, Index nt, Index ns) {
#if defined(ATTN_HAVE_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    const Index dk = shape.head_dim;
    return gemm_path() == GemmPath::avx512 && dk >= 16 && dk % 16 == 0 && dk <= kTileHeadDim &&
           ns >= 1 && ns <= kTileKeys && nt >= kTileMinRows;
  }
#endif
  (void)shape, (void)nt, (void)ns;
  return false;
}

/// The same for a backward block, whose products dV = P^T dO and dK = dS^T Q have ns rows: at
/// least kTileMinRows keys too.
template <class T>
bool backward_tiles_apply(const AttentionShape& shape, Index nt, Index ns) {
  return forward_tiles_apply<T>(shape, nt, ns) && ns >= kTileMinRows;
}

/// c (=, or += when accumulating) a b, a product of an attention block that does not run in
/// register tiles: in the packed kernel's order when c has kTileMinRows rows or more; with fewer,
/// as gemm computes it (the few-row kernels). On AVX2, a block the AVX-512 path runs in tiles
/// thus gets the tiles' bits; blocks no path tiles (more than 64 keys, heads the tiles do not
/// take, a backward block of fewer than 8 keys) follow the same rule on both, so that the choice
/// of kernel never depends on the instruction set.
/// `head_operand`: b is one of the head's K^T, V, V^T or K with all its keys, whose packed form
/// the head's later blocks reuse (for_each_query_block's ReusedBScope), and the product takes its
/// leading [a.cols(), c.cols()] block: the keys the block sees, all of them unless causal.
template <class C, class A, class B>
void block_product(C&& c, const A& a, const B& b, bool accumulate, bool head_operand = false) {
  if (c.rows() >= kTileMinRows)
    gemm_packed_order(c, a, b, accumulate, head_operand);
  else
    gemm(c, a, b.topLeftCorner(a.cols(), c.cols()), accumulate);
}

/// Runs one forward query block in register tiles if forward_tiles_apply, and says whether it
/// did; after_softmax(QueryRow) then runs on each row's probabilities before they meet V.
template <class T, class AfterSoftmax>
bool forward_in_tiles(AttentionScratch<T>& scratch, const QueryBlock<T>& blk,
                      const AttentionInputs<T>& in, T* out, Index ldo, T* lse, T scale,
                      const AttentionMask<T>& mask, AfterSoftmax after_softmax) {
#if defined(ATTN_HAVE_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    const AttentionShape& shape = blk.head.shape;
    const Index dk = shape.head_dim, ns = blk.ns, S = scratch.S;
    if (!forward_tiles_apply<T>(shape, blk.nt, ns)) return false;
    ++scratch.tiled;
    float* kt = scratch.kt.data();
    transpose_keys(blk.head.keys(in.k, in.ldk).data(), in.ldk, ns, dk, kt);
    const float* qb = blk.queries(in.q, in.ldq).data();
    float* ob = blk.queries(out, ldo).data();
    const float* vb = blk.head.keys(in.v, in.ldv).data();
    const Index nt = blk.nt;
    for (Index i0 = 0; i0 < nt; i0 += kTileRows) {
      TileRows rows;
      QueryRow row[kTileRows];
      rows.count = static_cast<int>(std::min<Index>(kTileRows, nt - i0));
      for (int r = 0; r < rows.count; ++r) {
        row[r] = query_row(blk, i0 + r, mask.causal);
        rows.n[r] = row[r].n;
        rows.additive[r] = mask.additive.row(row[r].t);
      }
      // The next tile's queries, and a share of V, come from L3 while this tile computes.
      prefetch_next_tile(qb, in.ldq, i0, nt, dk);
      const Index v0 = i0 * ns / nt, v1 = std::min<Index>(nt, i0 + kTileRows) * ns / nt;
      prefetch_rows(vb + v0 * in.ldv, v1 - v0, in.ldv, dk);
      probabilities_tile(qb + i0 * in.ldq, in.ldq, dk, kt, ns, scale, blk.pad, rows,
                         scratch.p.data() + i0 * S, S);
      for (int r = 0; r < rows.count; ++r) {
        lse[row[r].bht] = rows.lse[r];
        after_softmax(row[r]);
      }
    }
    tiled_product(scratch.p.data(), S, 1, nt, ns, vb, in.ldv, dk, ob, ldo, false);  // P V
    return true;
  }
#endif
  (void)scratch, (void)blk, (void)in;
  (void)out, (void)ldo, (void)lse, (void)scale, (void)mask, (void)after_softmax;
  return false;
}

/// What backward_scores reads: the forward's inputs Q, K, V and dO; and its output O, whose rows
/// it asks into cache for the row sums D = rowsum(dO * O) that follow it.
template <class T>
struct BackwardOperands {
  AttentionInputs<T> in;
  const T* dout;
  Index lddo;
  const T* out;
  Index ldo;
};

/// A backward block's scores, unscaled and unmasked, into scratch.p (Q K^T) and scratch.dp
/// (dO V^T): in register tiles (K^T and V^T transposed once, the rows of Q and dO read in place)
/// or by two GEMMs.
template <class T>
void backward_scores(AttentionScratch<T>& scratch, const QueryBlock<T>& blk,
                     const BackwardOperands<T>& x, bool tiles) {
  const Index ns = blk.ns;
#if defined(ATTN_HAVE_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    if (tiles) {
      ++scratch.tiled;
      const Index S = scratch.S, head_dim = blk.head.shape.head_dim;
      float* kt = scratch.kt.data();
      float* vt = scratch.vt.data();
      transpose_keys(blk.head.keys(x.in.k, x.in.ldk).data(), x.in.ldk, ns, head_dim, kt);
      transpose_keys(blk.head.keys(x.in.v, x.in.ldv).data(), x.in.ldv, ns, head_dim, vt);
      const float* qb = blk.queries(x.in.q, x.in.ldq).data();
      const float* dob = blk.queries(x.dout, x.lddo).data();
      const float* ob = blk.queries(x.out, x.ldo).data();
      // The next tile's rows of Q and dO, and the rows of O that the row sums D read after this
      // pass, come from L3 while a tile computes (session 34: attention forward + backward at
      // 32 x 64, one thread, 3.7% faster with Q and dO, about 1% more with O).
      prefetch_rows(ob, std::min<Index>(kTileRows, blk.nt), x.ldo, head_dim);
      for (Index i0 = 0; i0 < blk.nt; i0 += kTileRows) {
        const int count = static_cast<int>(std::min<Index>(kTileRows, blk.nt - i0));
        prefetch_next_tile(qb, x.in.ldq, i0, blk.nt, head_dim);
        prefetch_next_tile(dob, x.lddo, i0, blk.nt, head_dim);
        prefetch_next_tile(ob, x.ldo, i0, blk.nt, head_dim);
        scores_tile(qb + i0 * x.in.ldq, x.in.ldq, count, head_dim, kt, ns,
                    scratch.p.data() + i0 * S, S);
        scores_tile(dob + i0 * x.lddo, x.lddo, count, head_dim, vt, ns, scratch.dp.data() + i0 * S,
                    S);
      }
      return;
    }
  }
#endif
  (void)tiles;
  block_product(scratch.block(scratch.p, blk.nt, ns), blk.queries(x.in.q, x.in.ldq),
                blk.head.keys(x.in.k, x.in.ldk).transpose(), false, /*head_operand=*/true);
  block_product(scratch.block(scratch.dp, blk.nt, ns), blk.queries(x.dout, x.lddo),
                blk.head.keys(x.in.v, x.in.ldv).transpose(), false, /*head_operand=*/true);
}

/// C (=, or += when accumulating) A B for attention_backward's gradient products, A [M, K] a
/// block of a scratch buffer: in register tiles (tiled_product, B read in place) or by a GEMM
/// (`head_operand` as block_product's: b may then have more rows than the product's depth).
template <class T, class A, class B, class C>
void gradient_product(C&& c, const A& a, const B& b, bool accumulate, bool tiles,
                      bool head_operand = false) {
#if defined(ATTN_HAVE_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    if (tiles) {
      const auto av = strided_view(a);
      const auto bv = strided_view(b);
      auto cv = strided_view(c);
      ATTN_ASSERT(av && bv && cv && bv->col_stride == 1 && cv->col_stride == 1);
      return tiled_product(av->data, av->row_stride, av->col_stride, cv->rows, av->cols, bv->data,
                           bv->row_stride, cv->cols, cv->data, cv->row_stride, accumulate);
    }
  }
#endif
  (void)tiles;
  block_product(c, a, b, accumulate, head_operand);
}

}  // namespace attn::kernels::detail
