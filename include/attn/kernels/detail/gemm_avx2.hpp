// attn's own fp32 GEMM for CPUs with AVX2 and FMA but no AVX-512 (Zen 1-3, Haswell to Comet
// Lake): the scheme of gemm_avx512.hpp (B packed once and shared, A read in place, the epilogue
// applied in registers) with a register tile of 6 rows by 16 columns: 12 of the 16 ymm registers
// hold C, per step of k two loads of B and six broadcasts of A feed 12 FMAs (BLIS's Haswell
// shape). Each element is summed in gemm_tile.hpp's order, so the results are the AVX-512
// kernel's bits.
//
// The functions carry target attributes, so this compiles without -mavx2; kernels/gemm.hpp calls
// them only when the CPU has AVX2 and FMA (cpu_has_avx2_fma()).
#pragma once

#include "attn/kernels/detail/avx2.hpp"

#if defined(ATTN_HAVE_AVX512)

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "attn/kernels/detail/gemm_tile.hpp"

namespace attn::kernels::detail {

namespace avx2 {

inline constexpr int kMR = 6;   // rows of the register tile
inline constexpr int kNR = 16;  // columns of the register tile: two ymm vectors
static_assert(kNR <= kWidestNR, "gemm_operand.hpp's kWidestNR bounds every kernel's panels");
inline constexpr Index kMC = 96;    // rows of A per thread's block (16 panels)
inline constexpr Index kNC = 1024;  // columns of C per task at most
// Depth of a packed block (but see depth_block): a B panel is then 32 KiB, all of Zen 3's L1, yet
// products 512 deep, stored once instead of read back, ran 3-5% faster than with 256 (2048 x 512
// x 2048 and 2048 x 512 x 512 on 1 and 2 threads), and deeper ones 1-3% (fewer readbacks of C):
// five alternating pairs each, Zen 3. 128 and 192 lost 2-4%.
inline constexpr Index kKC = 512;
// A with contiguous columns (dy^T, a weight gradient) is packed: read in place, a panel's 6
// numbers per step of k sit a row of dy apart, and its 256 cache lines with the 16 KiB B panel
// of a 256-deep block filled the 32 KiB L1 (A^T B ran at 0.67-0.79x OpenBLAS, A B at
// 1.04-1.24x; measured before blocks were 512 deep, which makes the B panel 32 KiB).
inline constexpr bool kPackColumnsOfA = true;

/// c[MR, nc] (nc <= kNR, row stride ldc) = (from_zero ? 0 : c) + a_panel b_panel over kc steps,
/// then the epilogue when `last`: avx512::micro_tile's contract and order with 8-lane vectors.
template <int MR, ALayout L>
ATTN_TARGET_AVX2 void micro_tile(Index kc, const APanel& a, const float* b, float* c, Index ldc,
                                 Index nc, bool from_zero, bool last, const GemmEpilogue& epi,
                                 Index row0, Index col0) {
  const bool full = nc == kNR;
  const __m256i m0 = lane_mask(nc), m1 = lane_mask(nc - 8);
  __m256 acc0[MR], acc1[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    if (from_zero) {
      acc0[i] = acc1[i] = _mm256_setzero_ps();
    } else if (full) {
      acc0[i] = _mm256_loadu_ps(c + i * ldc);
      acc1[i] = _mm256_loadu_ps(c + i * ldc + 8);
    } else {
      acc0[i] = _mm256_maskload_ps(c + i * ldc, m0);
      acc1[i] = _mm256_maskload_ps(c + i * ldc + 8, m1);
    }
  }
  const Index rs = L == ALayout::rows ? a.row_step : 1;
  const Index ks = L == ALayout::packed ? kMR : L == ALayout::columns ? a.k_step : 1;
  const float* ap = a.data;
#pragma GCC unroll 2
  for (Index k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(ap + i * rs);
      acc0[i] = _mm256_fmadd_ps(ai, b0, acc0[i]);
      acc1[i] = _mm256_fmadd_ps(ai, b1, acc1[i]);
    }
    ap += ks;
    b += kNR;
  }
  if (last && (epi.bias != nullptr || epi.relu)) {
    __m256 bias0 = _mm256_setzero_ps(), bias1 = _mm256_setzero_ps();
    if (epi.bias != nullptr) {
      bias0 = _mm256_maskload_ps(epi.bias + col0, m0);
      bias1 = _mm256_maskload_ps(epi.bias + col0 + 8, m1);
    }
    const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      acc0[i] = _mm256_add_ps(acc0[i], bias0);
      acc1[i] = _mm256_add_ps(acc1[i], bias1);
      if (epi.relu) {  // max(c, 0): 0 for a NaN c, as the AVX-512 kernel's max
        acc0[i] = _mm256_max_ps(acc0[i], zero);
        acc1[i] = _mm256_max_ps(acc1[i], zero);
      }
    }
  }
  if (last && epi.gate != nullptr) {
    const float* g = epi.gate + row0 * epi.gate_stride + col0;
    const __m256 scale = _mm256_set1_ps(epi.gate_scale), zero = _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 g0 = _mm256_maskload_ps(g + i * epi.gate_stride, m0);
      const __m256 g1 = _mm256_maskload_ps(g + i * epi.gate_stride + 8, m1);
      acc0[i] = _mm256_and_ps(_mm256_cmp_ps(g0, zero, _CMP_GT_OQ), _mm256_mul_ps(acc0[i], scale));
      acc1[i] = _mm256_and_ps(_mm256_cmp_ps(g1, zero, _CMP_GT_OQ), _mm256_mul_ps(acc1[i], scale));
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    if (full) {
      _mm256_storeu_ps(c + i * ldc, acc0[i]);
      _mm256_storeu_ps(c + i * ldc + 8, acc1[i]);
    } else {
      _mm256_maskstore_ps(c + i * ldc, m0, acc0[i]);
      _mm256_maskstore_ps(c + i * ldc + 8, m1, acc1[i]);
    }
  }
}

/// Packs A[i0 : i0+mc, k0 : k0+kc] as panels of kMR rows, each kc x kMR (k-major): A with
/// contiguous columns (kPackColumnsOfA), or with neither rows nor columns contiguous.
/// Rows past mc in the last panel are left unset: the edge kernel never reads them. With
/// contiguous columns the full panels are filled kPackSteps steps of k at a time, all panels in
/// turn (six numbers per panel and step, as four and two), so each of A's columns is read once
/// while in L1. Panel after panel, all kc steps each, read every column again for each panel:
/// in a weight gradient of 1024 or 2048 rows those columns lie a multiple of 4 KiB apart, share
/// L1 sets, and were gone by the next panel. Alternating pairs on Zen 3, 2 threads (A^T B, M x K
/// x N): 1024 x 2048 x 256 10% faster, 2048 x 2048 x 512 5%, 768 x 2048 x 256 and 1536 x 2048 x
/// 512 2%, others within +-1%. 8 steps: 4 did as well, 16 worse.
inline constexpr Index kPackSteps = 8;
ATTN_TARGET_AVX2 inline void pack_a(const StridedMatrix<const float>& a, Index i0, Index mc,
                                    Index k0, Index kc, float* dst) {
  static_assert(kMR == 6, "the column copy below moves 4 + 2 floats");
  Index p = 0;
  if (a.row_stride == 1) {
    const Index full = mc / kMR * kMR;
    for (Index kb = 0; kb < kc; kb += kPackSteps) {
      const Index steps = std::min(kPackSteps, kc - kb);
      for (Index q = 0; q < full; q += kMR) {
        float* out = dst + q * kc + kb * kMR;
        for (Index k = kb; k < kb + steps; ++k, out += kMR) {
          const float* src = &a(i0 + q, k0 + k);
          _mm_storeu_ps(out, _mm_loadu_ps(src));
          _mm_storeu_si64(out + 4, _mm_loadu_si64(src + 4));
        }
      }
    }
    p = full;
    dst += full * kc;
  }
  for (; p < mc; p += kMR, dst += kc * kMR) {
    const Index rows = std::min<Index>(kMR, mc - p);
    for (Index k = 0; k < kc; ++k) {
      const float* src = &a(i0 + p, k0 + k);
      for (Index i = 0; i < rows; ++i) dst[k * kMR + i] = src[i * a.row_stride];
    }
  }
}

// Registers of rows per step of add_row_sums (gemm_row_sums.inc): 32 rows in four.
inline constexpr int kRowSumVectors = 4;
#define ATTN_ISA_TARGET ATTN_TARGET_AVX2
#include "attn/kernels/detail/gemm_row_sums.inc"  // add_row_sums
#undef ATTN_ISA_TARGET

/// dst[i * dst_ld + r] = src[r * ld + i] for r, i < 8: an 8 x 8 block transposed in registers.
ATTN_TARGET_AVX2 inline void transpose_8x8(const float* src, Index ld, float* dst, Index dst_ld) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * ld);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4)
    for (int h = 0; h < 2; ++h) {
      r[i + 2 * h] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[i + 2 * h + 1] = _mm256_shuffle_ps(t[i + h], t[i + h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(dst + i * dst_ld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * dst_ld, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

/// Packs panel q (columns q*kNR ...) of B[k0 : k0+kc, :] as kc x kNR (k-major), zero past the last
/// column; for B whose rows are not contiguous (B = W^T: column j of B is row j of W, read front
/// to back). A full panel of B = W^T goes 8 x 8 blocks at a time through registers (attention's
/// K^T and the weights' W^T: a scalar transpose was a third of the packing time in a small
/// training step).
ATTN_TARGET_AVX2 inline void pack_b_panel(const StridedMatrix<const float>& b, Index k0, Index kc,
                                          Index q, float* dst) {
  const Index j0 = q * kNR, cols = std::min<Index>(kNR, b.cols - j0);
  Index k = 0;
  if (cols == kNR && b.row_stride == 1) {
    for (; k + 8 <= kc; k += 8)
      for (Index h = 0; h < kNR; h += 8)
        transpose_8x8(&b(k0 + k, j0 + h), b.col_stride, dst + k * kNR + h, kNR);
  }
  if (cols < kNR) std::memset(dst, 0, sizeof(float) * static_cast<size_t>(kc * kNR));
  for (Index j = 0; j < cols; ++j)
    for (Index kk = k; kk < kc; ++kk) dst[kk * kNR + j] = b(k0 + kk, j0 + j);
}

/// Packs panels [q0, q1) of NR columns each (a multiple of 8) of the kc-deep block of B that starts
/// at row k0 (first: where panel q0 goes, the others after it), for B with contiguous rows: row by
/// row, each row's (q1 - q0) NR numbers read front to back, zero past the last column. Packing a
/// panel at a time instead reads NR numbers per row, one page per row when rows are 4 KiB or more
/// apart, which the prefetchers do not follow: a cold [2048, 1024] activation (a weight gradient's
/// B) packed in about 1.0 ms that way, 0.53 ms four panels at a time (measured with the AVX-512
/// kernel's own 16-lane copy of this loop, NR 32). Both kernels now pack with this one loop: it
/// moves memory, so 8-lane moves should serve the AVX-512 kernel as well (not yet measured on an
/// AVX-512 machine).
template <int NR>
ATTN_TARGET_AVX2 void pack_b_panels(const StridedMatrix<const float>& b, Index k0, Index kc,
                                    Index q0, Index q1, float* first) {
  static_assert(NR % 8 == 0, "a panel is whole 8-lane vectors");
  for (Index k = 0; k < kc; ++k) {
    const float* src = &b(k0 + k, 0);
    for (Index q = q0; q < q1; ++q) {
      float* dst = first + ((q - q0) * kc + k) * NR;
      const Index j0 = q * NR, cols = b.cols - j0;
      if (cols >= NR) {
        for (int h = 0; h < NR; h += 8) _mm256_store_ps(dst + h, _mm256_loadu_ps(src + j0 + h));
      } else {
        for (int h = 0; h < NR; h += 8)
          _mm256_store_ps(dst + h, _mm256_maskload_ps(src + j0 + h, lane_mask(cols - h)));
      }
    }
  }
}

}  // namespace avx2

/// The AVX2 kernel as gemm_packed.hpp's driver takes it.
ATTN_GEMM_ISA(Avx2Isa, avx2, ATTN_TARGET_AVX2);

}  // namespace attn::kernels::detail

#endif  // ATTN_HAVE_AVX512
