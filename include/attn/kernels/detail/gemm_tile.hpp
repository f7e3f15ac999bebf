// What attn's own GEMM kernels share, whatever their instruction set (gemm_avx512.hpp: a 12 x 32
// tile in zmm registers; gemm_avx2.hpp: 6 x 16 in ymm): the epilogue, how a tile reads A, the
// depth of the packed blocks, the packed panels of B, the loop of tiles over one depth block, and
// the struct by which the driver takes a kernel (ATTN_GEMM_ISA).
//
// Every kernel sums each element of C in the same order (k ascending within a depth block, blocks
// ascending, one FMA chain from 0 or from C) and applies the same epilogue, so the two kernels
// give the same bits, and each gives the same bits on any thread count.
#pragma once

#include <xmmintrin.h>

#include <algorithm>
#include <cstdint>

#include "attn/kernels/detail/gemm_operand.hpp"
#include "attn/kernels/epilogue.hpp"

namespace attn::kernels::detail {

inline constexpr Index kWideN = 4096;  // C at least this wide: see depth_block

/// The depth of the packed blocks of a product of depth K and width N for kernel Isa: Isa::kKC,
/// or all of K when Isa::kKC < K <= 2 Isa::kKC and C is at least kWideN columns wide (the
/// projection onto the vocabulary and its gradients). Each block after the first reads C back,
/// and a C that wide is far larger than the caches: at 2048 x 512 x 8000 one 512-deep block
/// instead of two took 43.1-43.9 instead of 44.4-45.1 ms (A B, A B^T) and 44.7-45.6 instead of
/// 47.2-47.5 (A^T B) on 2 threads, while at 2048 x 512 x 2048 it lost 3-4% (AVX-512, kKC 256).
/// A read in place with its columns contiguous (`a_columns_in_place`: dy^T in a weight gradient of
/// a few hundred rows) touches a new cache line at every step of k, so its blocks are at most
/// kKCColumnsOfA deep whatever the kernel: with the AVX2 kernel's 512, such products (512 x 2048
/// x 512 and x 2048, 256 x 2048 x 256, 2 threads) were 3-8% slower than with 256 on Zen 3.
/// The block depth never changes a result: each element's FMA chain runs on through C from one
/// block to the next, whatever the blocks.
inline constexpr Index kKCColumnsOfA = 256;
template <class Isa>
Index depth_block(Index K, Index N, bool a_columns_in_place = false) {
  const Index kc = a_columns_in_place ? std::min(Isa::kKC, kKCColumnsOfA) : Isa::kKC;
  return K > kc && K <= 2 * kc && N >= kWideN ? K : kc;
}

/// What is applied to each element of C after its last block, while the tile is in registers.
using GemmEpilogue = Epilogue<float>;

/// How a micro-kernel reads its MR rows of A over the kc steps of k: element (i, k) of the panel
/// is at data[i * row_step + k * k_step].
///   packed:  pack_a's panel, row_step 1, k_step MR;
///   columns: A's columns contiguous (A = dy^T in a weight gradient), read in place: row_step 1;
///   rows:    A's rows contiguous (A = x, dy), read in place: k_step 1.
/// Reading A in place spares packing it, which costs as much as 8% of a step whose products are
/// only 256 deep; A's rows of one block (96 x 256 floats) stay in L2 either way.
enum class ALayout { packed, columns, rows };
struct APanel {
  const float* data;
  Index row_step, k_step;
};

/// The packed form of panels [q_base, q_base + panels) of B's `rows` rows, NR columns each:
/// `depth`-deep blocks (depth_block), each `panels` panels of kc x NR (kc = depth, or what is left
/// of `rows` in the last block). A product may read fewer rows and panels than were packed (a
/// leading block of B, gemm_packed_slice): row k of a panel is at the same place either way.
template <int NR>
struct PackedB {
  const float* data;
  Index rows;
  Index panels;
  Index depth;
  Index q_base = 0;
  /// Panel q of the block that starts at row k0.
  const float* panel(Index k0, Index q) const {
    return data + k0 * panels * NR + (q - q_base) * std::min(depth, rows - k0) * NR;
  }
};

/// The block of C a task computes: rows [i0, i0 + mc), B panels [q0, q1) (columns q0 NR ...).
struct CBlock {
  Index i0, mc, q0, q1;
};

/// Where a block of C is computed: C itself, or a per-thread copy (gemm_packed.hpp's gemm_block).
/// `data` is the block's first element, (blk.i0, blk.q0 NR) of C.
template <int NR>
struct CTarget {
  float* data;
  Index ld;
  float* tile(const CBlock& blk, Index p, Index q) const {
    return data + p * ld + (q - blk.q0) * NR;
  }
};

/// Prefetches into L1 the rows of the tile after tile (p, q) of `blk` (the next row panel, or the
/// first of the next column panel) in a [rows, N] matrix whose block starts at `first` (element
/// (blk.i0, blk.q0 NR)), rows `ld` apart: C where it is read back, and the epilogue's gate. Where
/// C is read back, its rows wait in L3 or memory (a whole depth block of the task has passed
/// since), and the tile's loads stalled its FMAs: with this, A^T B at 2048 x 512 x 8000 went from
/// 48-52 to 43-46 ms, at 2048 x 512 x 2048 from 12.6-13.3 to 11.6-12.7 ms (AVX-512, 2 threads,
/// alternating runs).
template <int MR, int NR>
inline void prefetch_next_tile(const float* first, Index ld, const CBlock& blk, Index p, Index q) {
  const bool same_q = p + MR < blk.mc;
  const Index np = same_q ? p + MR : 0, nq = same_q ? q : q + 1;
  if (nq >= blk.q1) return;
  const float* row = first + np * ld + (nq - blk.q0) * NR;
  for (Index r = 0, rows = std::min<Index>(MR, blk.mc - np); r < rows; ++r, row += ld)
    for (int line = 0; line < NR; line += 16)
      _mm_prefetch(reinterpret_cast<const char*>(row + line), _MM_HINT_T0);
}

/// The MR-row panels of one depth block of C's block: each A panel (in place or packed) against
/// each of the block's B panels, by Isa's micro-kernel. Always inlined into each kernel's own
/// block_depth, which carries the kernel's target attribute, so that the micro-kernel inlines
/// into the loop (a call per tile cost up to 8% on the 64-deep tiles of attention).
template <class Isa, ALayout L>
__attribute__((always_inline)) inline void tiles_of_depth_block(
    const StridedMatrix<const float>& a, const PackedB<Isa::kNR>& b, const CTarget<Isa::kNR>& c,
    Index N, const CBlock& blk, Index k0, Index kc, bool from_zero, bool last,
    const GemmEpilogue& epi, const float* packed_a) {
  constexpr int MR = Isa::kMR, NR = Isa::kNR;
  for (Index q = blk.q0; q < blk.q1; ++q) {
    const Index j0 = q * NR, nc = std::min<Index>(NR, N - j0);
    const float* bq = b.panel(k0, q);
    for (Index p = 0; p < blk.mc; p += MR) {
      // C is read back (a later depth block, or accumulating): fetch the next tile's rows while
      // this one computes, so that its first FMAs need not wait for them.
      if (!from_zero) prefetch_next_tile<MR, NR>(c.data, c.ld, blk, p, q);
      // The gate (the backward of a ReLU and a dropout) is the forward's output, long out of
      // cache: its rows are fetched a tile ahead too.
      if (last && epi.gate != nullptr)
        prefetch_next_tile<MR, NR>(epi.gate + blk.i0 * epi.gate_stride + blk.q0 * NR,
                                   epi.gate_stride, blk, p, q);
      const APanel ap = L == ALayout::packed
                            ? APanel{packed_a + p * kc, 1, MR}
                            : APanel{&a(blk.i0 + p, k0), a.row_stride, a.col_stride};
      Isa::template tile<L>(static_cast<int>(std::min<Index>(MR, blk.mc - p)), kc, ap, bq,
                            c.tile(blk, p, q), c.ld, nc, from_zero, last, epi, blk.i0 + p, j0);
    }
  }
}

}  // namespace attn::kernels::detail

/// Defines struct `Name`: the kernel of namespace `ns` as gemm_packed.hpp's driver takes it. `ns`
/// holds the kernel's sizes (kMR, kNR, kMC, kNC, kKC), kPackColumnsOfA, micro_tile<MR, L>, pack_a,
/// add_row_sums, pack_b_panel and pack_b_panels<NR>; `target` is its target attribute, which
/// tile and block_depth carry so that the micro-kernel inlines into the loop of tiles. A macro:
/// a template over the kernel could not take its target attribute from a parameter (avx2.hpp).
/// tile runs the micro-kernel for `rows` (1..kMR) rows of A laid out as L, one instantiation per
/// edge height; the packing and the row sums are called once per panel or block, not per tile.
#define ATTN_GEMM_ISA(Name, ns, target)                                                          \
  struct Name {                                                                                  \
    static constexpr int kMR = ns::kMR, kNR = ns::kNR;                                           \
    static constexpr Index kMC = ns::kMC, kNC = ns::kNC, kKC = ns::kKC;                          \
    static constexpr const char* kName = #ns;                                                    \
    static constexpr bool kPackColumnsOfA = ns::kPackColumnsOfA;                                 \
                                                                                                 \
    template <ALayout L>                                                                         \
    target static void tile(int rows, Index kc, const APanel& a, const float* b, float* c,       \
                            Index ldc, Index nc, bool from_zero, bool last,                      \
                            const GemmEpilogue& epi, Index row0, Index col0) {                   \
      static_assert(kMR <= 12, "a case per tile height below");                                  \
      switch (rows) {                                                                            \
        ATTN_GEMM_TILE_ROWS(ns, 12);                                                             \
        ATTN_GEMM_TILE_ROWS(ns, 11);                                                             \
        ATTN_GEMM_TILE_ROWS(ns, 10);                                                             \
        ATTN_GEMM_TILE_ROWS(ns, 9);                                                              \
        ATTN_GEMM_TILE_ROWS(ns, 8);                                                              \
        ATTN_GEMM_TILE_ROWS(ns, 7);                                                              \
        ATTN_GEMM_TILE_ROWS(ns, 6);                                                              \
        ATTN_GEMM_TILE_ROWS(ns, 5);                                                              \
        ATTN_GEMM_TILE_ROWS(ns, 4);                                                              \
        ATTN_GEMM_TILE_ROWS(ns, 3);                                                              \
        ATTN_GEMM_TILE_ROWS(ns, 2);                                                              \
        ATTN_GEMM_TILE_ROWS(ns, 1);                                                              \
        default:                                                                                 \
          return;                                                                                \
      }                                                                                          \
    }                                                                                            \
    template <ALayout L>                                                                         \
    target static void block_depth(const StridedMatrix<const float>& a, const PackedB<kNR>& b,   \
                                   const CTarget<kNR>& c, Index N, const CBlock& blk, Index k0,  \
                                   Index kc, bool from_zero, bool last, const GemmEpilogue& epi, \
                                   const float* packed_a) {                                      \
      tiles_of_depth_block<Name, L>(a, b, c, N, blk, k0, kc, from_zero, last, epi, packed_a);    \
    }                                                                                            \
    static constexpr auto pack_a = &ns::pack_a;                                                  \
    static constexpr auto add_row_sums = &ns::add_row_sums;                                      \
    static constexpr auto pack_b_panel = &ns::pack_b_panel;                                      \
    static constexpr auto pack_b_panels = &ns::pack_b_panels<kNR>;                               \
  }

/// ATTN_GEMM_ISA's case for tiles of R rows (none where R > kMR).
#define ATTN_GEMM_TILE_ROWS(ns, R)                                                         \
  case R:                                                                                  \
    if constexpr (R <= kMR)                                                                \
      return ns::micro_tile<R, L>(kc, a, b, c, ldc, nc, from_zero, last, epi, row0, col0); \
    return
