// attn's own fp32 GEMM for AVX-512: C (=, +=) A B, C row-major, A and B of any strides. What
// every kernel shares (epilogue, A layouts, block depth, the loop of tiles) is in gemm_tile.hpp;
// the AVX2 kernel (gemm_avx2.hpp) has the same structure with a 6 x 16 tile.
//
// The Goto/BLIS scheme, written for the products of a Transformer step ([B*L, D] x [D, 3D],
// [D, F], [F, D], [D, V] and their transposes in backward):
//   - B is packed once per product, in blocks of depth kKC (see depth_block) of kNR-column panels,
//     and the packed copy is shared by every thread (they pack it together, then meet at one
//     barrier);
//   - C is cut into tasks of kMC rows by at most kNC columns, column blocks outermost, so that the
//     threads sweep all rows against one block of packed B (kept in L2/L3) before the next; each
//     thread takes tasks as they come free and, for each depth block, passes every kMR-row panel
//     of its rows of A over each B panel of its columns (each kept in L1 meanwhile);
//   - the micro-kernel reads A in place when A's rows or columns are contiguous (ALayout below),
//     else from panels packed per task (or, A^T of a wide product, packed once: packs_a_once);
//   - the micro-kernel keeps a kMR x kNR tile of C in 24 of the 32 zmm registers: per step of k it
//     loads two vectors of B and broadcasts kMR numbers of A into 24 FMAs.
// Every element of C is summed in the same order (k ascending within a depth block, blocks
// ascending, one FMA chain) whichever thread, tile shape or edge kernel computes it, so results are
// bitwise independent of the thread count. The epilogue (bias, ReLU) is applied to the tile in
// registers after its last block, before it is stored.
//
// The functions carry target attributes (avx512.hpp), so this compiles without -mavx512f;
// kernels/gemm.hpp calls them only when the CPU has AVX-512 (cpu_has_avx512()).
#pragma once

#include "attn/kernels/detail/avx512.hpp"
#include "attn/kernels/detail/gemm_avx2.hpp"  // avx2::pack_b_panels

#if defined(ATTN_HAVE_AVX512)
#define ATTN_HAVE_AVX512_GEMM 1

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "attn/kernels/detail/gemm_tile.hpp"

namespace attn::kernels::detail {

namespace avx512 {

inline constexpr int kMR = 12;  // rows of the register tile
inline constexpr int kNR = 32;  // columns of the register tile: two zmm vectors
static_assert(kNR <= kWidestNR, "gemm_operand.hpp's kWidestNR bounds every kernel's panels");
inline constexpr Index kMC = 96;    // rows of A per thread's block (8 panels, 96 KiB packed: L2)
inline constexpr Index kNC = 1024;  // columns of C per task at most (B block kKC x kNC: 1 MiB)
inline constexpr Index kKC = 256;   // depth of a packed block (but see depth_block)
inline constexpr bool kPackColumnsOfA = false;  // dy^T read in place (12 floats per step of k)

/// c[MR, nc] (nc <= kNR, row stride ldc) = (from_zero ? 0 : c) + a_panel b_panel over kc steps,
/// then the epilogue when `last`. a: MR rows as `L` says, b: kc x kNR (k-major; the lanes past nc,
/// zeros or further columns of a larger kept B, are computed but never stored).
template <int MR, ALayout L>
ATTN_TARGET_AVX512 void micro_tile(Index kc, const APanel& a, const float* b, float* c, Index ldc,
                                   Index nc, bool from_zero, bool last, const GemmEpilogue& epi,
                                   Index row0, Index col0) {
  const __mmask16 m0 = lane_mask(nc), m1 = lane_mask(nc - 16);
  __m512 acc0[MR], acc1[MR];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    acc0[i] = from_zero ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, c + i * ldc);
    acc1[i] = from_zero ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, c + i * ldc + 16);
  }
  // Rows i of A from three pointers (rows 0, 4, 8) at offsets (i % 4) row_step, so that the
  // twelve addresses need few registers when the rows are in place.
  const Index rs = L == ALayout::rows ? a.row_step : 1;
  const Index ks = L == ALayout::packed ? kMR : L == ALayout::columns ? a.k_step : 1;
  const float* ap[3] = {a.data, MR > 4 ? a.data + 4 * rs : a.data,
                        MR > 8 ? a.data + 8 * rs : a.data};
#pragma GCC unroll 2
  for (Index k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(ap[i / 4][(i % 4) * rs]);
      acc0[i] = _mm512_fmadd_ps(ai, b0, acc0[i]);
      acc1[i] = _mm512_fmadd_ps(ai, b1, acc1[i]);
    }
#pragma GCC unroll 3
    for (int q = 0; q < 3; ++q) ap[q] += ks;
    b += kNR;
  }
  if (last && (epi.bias != nullptr || epi.relu)) {
    const __m512 bias0 =
        epi.bias ? _mm512_maskz_loadu_ps(m0, epi.bias + col0) : _mm512_setzero_ps();
    const __m512 bias1 =
        epi.bias ? _mm512_maskz_loadu_ps(m1, epi.bias + col0 + 16) : _mm512_setzero_ps();
    const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      acc0[i] = _mm512_add_ps(acc0[i], bias0);
      acc1[i] = _mm512_add_ps(acc1[i], bias1);
      if (epi.relu) {
        acc0[i] = _mm512_maskz_max_ps(0xFFFF, acc0[i], zero);
        acc1[i] = _mm512_maskz_max_ps(0xFFFF, acc1[i], zero);
      }
    }
  }
  if (last && epi.gate != nullptr) {
    const float* g = epi.gate + row0 * epi.gate_stride + col0;
    const __m512 scale = _mm512_set1_ps(epi.gate_scale), zero = _mm512_setzero_ps();
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const __m512 g0 = _mm512_maskz_loadu_ps(m0, g + i * epi.gate_stride);
      const __m512 g1 = _mm512_maskz_loadu_ps(m1, g + i * epi.gate_stride + 16);
      acc0[i] = _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(g0, zero, _CMP_GT_OQ), acc0[i], scale);
      acc1[i] = _mm512_maskz_mul_ps(_mm512_cmp_ps_mask(g1, zero, _CMP_GT_OQ), acc1[i], scale);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, acc0[i]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc1[i]);
  }
}

/// dst[k * dst_stride + i] = src[i * ld + k] for i < rows (at most 16), and 0 for rows <= i < 16,
/// k < kc: sixteen rows in registers, 16 steps of k at a time (masked loads past kc). Two rounds
/// of unpacks give, in 128-bit lane L of u[4 g + c], rows 4g..4g+3 at step 4L + c; two rounds of
/// 128-bit lane shuffles gather the four groups, and each step of k is one full store. On a 32 x 64
/// panel (attention's K^T) this took 182 ns against 305 for transpose_into's four-row path with its
/// masked 4-float stores.
ATTN_TARGET_AVX512 inline void transpose_16_rows(const float* src, Index ld, Index kc, float* dst,
                                                 Index dst_stride, Index rows = 16) {
  for (Index k = 0; k < kc; k += 16) {
    const __mmask16 m = lane_mask(kc - k);
    __m512 r[16], t[16], u[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      if (i >= rows) {
        r[i] = _mm512_setzero_ps();
        continue;
      }
      r[i] = _mm512_maskz_loadu_ps(m, src + i * ld + k);
      _mm_prefetch(reinterpret_cast<const char*>(src + i * ld + k + 64), _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_maskz_unpacklo_ps(0xFFFF, r[i], r[i + 1]);
      t[i + 1] = _mm512_maskz_unpackhi_ps(0xFFFF, r[i], r[i + 1]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 16; g += 4) {
      const __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 2]);
      const __m512d c = _mm512_castps_pd(t[g + 1]), d = _mm512_castps_pd(t[g + 3]);
      u[g] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, a, b));
      u[g + 1] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, a, b));
      u[g + 2] = _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, c, d));
      u[g + 3] = _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, c, d));
    }
    const Index steps = std::min<Index>(16, kc - k);
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      constexpr __mmask16 all = 0xFFFF;  // masked forms: GCC 12 warns on the unmasked ones
      const __m512 x0 = _mm512_maskz_shuffle_f32x4(all, u[c], u[4 + c], 0x44);  // lanes 0, 1
      const __m512 x1 = _mm512_maskz_shuffle_f32x4(all, u[c], u[4 + c], 0xEE);  // lanes 2, 3
      const __m512 x2 = _mm512_maskz_shuffle_f32x4(all, u[8 + c], u[12 + c], 0x44);
      const __m512 x3 = _mm512_maskz_shuffle_f32x4(all, u[8 + c], u[12 + c], 0xEE);
      const __m512 o[4] = {_mm512_maskz_shuffle_f32x4(all, x0, x2, 0x88),
                           _mm512_maskz_shuffle_f32x4(all, x0, x2, 0xDD),
                           _mm512_maskz_shuffle_f32x4(all, x1, x3, 0x88),
                           _mm512_maskz_shuffle_f32x4(all, x1, x3, 0xDD)};
#pragma GCC unroll 4
      for (int L = 0; L < 4; ++L)  // o[L]: rows 0..15 at step k + 4L + c
        if (4 * L + c < steps) _mm512_storeu_ps(dst + (k + 4 * L + c) * dst_stride, o[L]);
    }
  }
}

/// dst[k * dst_stride + r] = src[r * ld + k] for r < rows, k < kc: the transposition both packings
/// need when the operand's rows are contiguous. Sixteen rows at a time by transpose_16_rows; then
/// four rows and sixteen steps of k at a time through registers (two rounds of unpacks give, in
/// each 128-bit lane, four rows at one k), each lane written with a masked store; the edges are
/// copied one number at a time.
ATTN_TARGET_AVX512 inline void transpose_into(const float* src, Index ld, Index rows, Index kc,
                                              float* dst, Index dst_stride) {
  Index r = 0;
  for (; r + 16 <= rows; r += 16) transpose_16_rows(src + r * ld, ld, kc, dst + r, dst_stride);
  for (; r + 4 <= rows; r += 4) {
    const float* s0 = src + r * ld;
    Index k = 0;
    for (; k + 16 <= kc; k += 16) {
      const __m512 a0 = _mm512_loadu_ps(s0 + k), a1 = _mm512_loadu_ps(s0 + ld + k);
      const __m512 a2 = _mm512_loadu_ps(s0 + 2 * ld + k), a3 = _mm512_loadu_ps(s0 + 3 * ld + k);
      const __m512d t0 = _mm512_castps_pd(_mm512_maskz_unpacklo_ps(0xFFFF, a0, a1));
      const __m512d t1 = _mm512_castps_pd(_mm512_maskz_unpackhi_ps(0xFFFF, a0, a1));
      const __m512d t2 = _mm512_castps_pd(_mm512_maskz_unpacklo_ps(0xFFFF, a2, a3));
      const __m512d t3 = _mm512_castps_pd(_mm512_maskz_unpackhi_ps(0xFFFF, a2, a3));
      // o[j], lane L: rows r..r+3 at step k + 4L + j.
      const __m512 o[4] = {_mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, t0, t2)),
                           _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, t0, t2)),
                           _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, t1, t3)),
                           _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, t1, t3))};
#pragma GCC unroll 4
      for (int L = 0; L < 4; ++L)
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j)  // lane L lands at dst[(k + 4L + j) * dst_stride + r]
          _mm512_mask_storeu_ps(dst + (k + 4 * L + j) * dst_stride + r - 4 * L,
                                __mmask16(0xFu << (4 * L)), o[j]);
    }
    for (; k < kc; ++k)
      for (Index i = 0; i < 4; ++i) dst[k * dst_stride + r + i] = s0[i * ld + k];
  }
  for (; r < rows; ++r)
    for (Index k = 0; k < kc; ++k) dst[k * dst_stride + r] = src[r * ld + k];
}

/// Packs A[i0 : i0+mc, k0 : k0+kc] as panels of kMR rows, each kc x kMR (k-major). Rows past mc in
/// the last panel are left unset: the edge kernel never reads them.
ATTN_TARGET_AVX512 inline void pack_a(const StridedMatrix<const float>& a, Index i0, Index mc,
                                      Index k0, Index kc, float* dst) {
  if (a.row_stride == 1) {  // columns contiguous (A = dy^T): each step of k, mc numbers in a row
    for (Index k = 0; k < kc; ++k)
      for (Index p = 0; p < mc; p += kMR) {
        const __mmask16 m = lane_mask(std::min<Index>(kMR, mc - p));
        _mm512_mask_storeu_ps(dst + p * kc + k * kMR, m,
                              _mm512_maskz_loadu_ps(m, &a(i0 + p, k0 + k)));
      }
    return;
  }
  for (Index p = 0; p < mc; p += kMR, dst += kc * kMR) {
    const Index rows = std::min<Index>(kMR, mc - p);
    if (a.col_stride == 1) {  // rows contiguous (A = x, dy): transpose into the panel
      transpose_into(&a(i0 + p, k0), a.row_stride, rows, kc, dst, kMR);
    } else {
      for (Index i = 0; i < rows; ++i)
        for (Index k = 0; k < kc; ++k) dst[k * kMR + i] = a(i0 + p + i, k0 + k);
    }
  }
}

// Registers of rows per step of add_row_sums (gemm_row_sums.inc): 96 rows in six, six chains of
// adds in flight.
inline constexpr int kRowSumVectors = 6;
#define ATTN_ISA_TARGET ATTN_TARGET_AVX512
#include "attn/kernels/detail/gemm_row_sums.inc"  // add_row_sums
#undef ATTN_ISA_TARGET

/// Packs panel q (columns q*kNR ...) of B[k0 : k0+kc, :] as kc x kNR (k-major), zero past the last
/// column so the kernel's full-width FMAs add nothing there; for B whose rows are not contiguous
/// (those go through avx2::pack_b_panels).
ATTN_TARGET_AVX512 inline void pack_b_panel(const StridedMatrix<const float>& b, Index k0, Index kc,
                                            Index q, float* dst) {
  const Index j0 = q * kNR, cols = std::min<Index>(kNR, b.cols - j0);
  if (b.row_stride == 1) {  // B = W^T: column j of B is row j of W; zeros past the last column
    for (Index r = 0; r < kNR; r += 16)  // (K^T in attention, 22 x 32 at 22 keys: no edge loops)
      transpose_16_rows(r < cols ? &b(k0, j0 + r) : nullptr, b.col_stride, kc, dst + r, kNR,
                        std::clamp<Index>(cols - r, 0, 16));
    return;
  }
  if (cols < kNR) std::memset(dst, 0, sizeof(float) * static_cast<size_t>(kc * kNR));
  for (Index j = 0; j < cols; ++j)
    for (Index k = 0; k < kc; ++k) dst[k * kNR + j] = b(k0 + k, j0 + j);
}

// B with contiguous rows is packed by the AVX2 kernel's loop: it moves memory, 8-lane moves serve.
using avx2::pack_b_panels;

}  // namespace avx512

/// The AVX-512 kernel as gemm_packed.hpp's driver takes it.
ATTN_GEMM_ISA(Avx512Isa, avx512, ATTN_TARGET_AVX512);

}  // namespace attn::kernels::detail

#endif  // ATTN_HAVE_AVX512
