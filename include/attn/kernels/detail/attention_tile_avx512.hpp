// Attention's blocks in AVX-512 registers, for heads of 16, 32, 48 or 64 dimensions against at
// most 64 keys (every head of a training batch of sentences up to 64 tokens), six query rows at a
// time:
//   - forward: the scores of six rows go from Q K^T to the softmax in registers, which writes only
//     the probabilities, and P V reads V where it lies;
//   - backward: Q K^T and dO V^T in registers against K^T and V^T transposed once per block, and
//     the gradient products dV = P^T dO, dQ = dS K, dK = dS^T Q with their right-hand sides read
//     where they lie.
// This replaces, for such blocks, a packed GEMM per product (its B copied into panels, a driver
// around each) and, forward, a softmax of three passes over memory per row.
//
// The bits are those of the path it replaces (the GEMMs of attention.hpp and the rows of
// softmax_avx512.hpp): every element is one FMA chain, from zero (or from C when accumulating), k
// ascending, as in gemm_avx512.hpp's micro-tile, and each row's softmax runs the operations of
// softmax_row_avx512 on the same numbers. tests/test_attention_kernels.cpp checks it bit for bit
// against that path (on the AVX2 GEMM, which gives the AVX-512 GEMM's bits).
#pragma once

#include "attn/kernels/detail/gemm_avx512.hpp"
#include "attn/kernels/detail/softmax_avx512.hpp"

#if defined(ATTN_HAVE_AVX512)

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

namespace attn::kernels::detail {

inline constexpr int kTileRows = 6;        // query rows per tile
inline constexpr Index kTileKeys = 64;     // keys at most: four registers of scores per row
inline constexpr Index kTileHeadDim = 64;  // head dimensions at most: four registers of output

/// Calls f(std::integral_constant<int, W>{}) for W = ceil(n / 16) registers of 16 floats, 1..4
/// (n past 64 counts as 4): the kernels below for the width at hand.
template <int W = 1, class F>
void with_registers(Index n, F f) {
  if constexpr (W < 4) {
    if (n > 16 * W) return with_registers<W + 1>(n, f);
  }
  f(std::integral_constant<int, W>{});
}

/// The query rows of one tile: how many (1..kTileRows); per row the keys [0, n) it may see before
/// padding and bias (n <= the block's ns) and its additive mask row (or null). The tile writes
/// each row's log-sum-exp into lse.
struct TileRows {
  int count = 0;
  Index n[kTileRows] = {};
  const float* additive[kTileRows] = {};
  float lse[kTileRows] = {};
};

/// Asks for `rows` rows of `floats` numbers, `ld` apart, to be brought into L1.
inline void prefetch_rows(const float* x, Index rows, Index ld, Index floats) {
  for (Index r = 0; r < rows; ++r)
    for (Index j = 0; j < floats; j += 16)
      _mm_prefetch(reinterpret_cast<const char*>(x + r * ld + j), _MM_HINT_T0);
}

/// Asks the rows of the tile after the one at row i0 (of a block of nt rows, ld apart, `floats`
/// numbers each) into L1, if there is one: what a tile's first broadcasts would otherwise wait on.
inline void prefetch_next_tile(const float* x, Index ld, Index i0, Index nt, Index floats) {
  const Index next = std::min<Index>(kTileRows, nt - i0 - kTileRows);
  if (next > 0) prefetch_rows(x + (i0 + kTileRows) * ld, next, ld, floats);
}

/// kt[d * kTileKeys + s] = k[s * ldk + d] for the keys s < ns (<= kTileKeys) and d < dk; zeros
/// for the keys past ns up to the next multiple of 16.
ATTN_TARGET_AVX512 inline void transpose_keys(const float* k, Index ldk, Index ns, Index dk,
                                              float* kt) {
  for (Index s = 0; s < ns; s += 16)
    avx512::transpose_16_rows(k + s * ldk, ldk, dk, kt + s, kTileKeys, std::min<Index>(16, ns - s));
}

/// One row's softmax on its KR registers of scores s (keys 16 c ...), as softmax_row_avx512 runs
/// it (a copy of its steps on registers: a change to one must go to the other, and the tile test
/// compares their bits): p[0, n) <- softmax(scale s + additive + pad), p[n, ns) <- 0; returns the
/// log-sum-exp
/// (+infinity, and a zero row, when every key is blocked).
template <int KR>
ATTN_TARGET_AVX512 __attribute__((always_inline)) inline float softmax_tile_row(
    const __m512 (&s)[KR], Index n, Index ns, float scale, const float* additive, const float* pad,
    float* p) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 v[KR];
  __m512 vmax = _mm512_set1_ps(-kInf);
  __mmask16 nan = 0;
#pragma GCC unroll 4
  for (int c = 0; c < KR; ++c) {
    const __mmask16 m = lane_mask(n - 16 * c);
    v[c] = masked_logits_of(_mm512_maskz_mov_ps(m, s[c]), additive, pad, 16 * c, m, vscale);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, v[c]);
    nan |= _mm512_mask_cmp_ps_mask(m, v[c], v[c], _CMP_UNORD_Q);
  }
  const float mx = nan != 0 ? std::numeric_limits<float>::quiet_NaN() : lane_max(vmax);
  if (n == 0 || mx == -kInf) {
#pragma GCC unroll 4
    for (int c = 0; c < KR; ++c)
      _mm512_mask_storeu_ps(p + 16 * c, lane_mask(ns - 16 * c), _mm512_setzero_ps());
    return kInf;
  }
  const __m512 vm = _mm512_set1_ps(mx);
  __m512 e[KR];
  __m512 vsum = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int c = 0; c < KR; ++c) {
    const __mmask16 m = lane_mask(n - 16 * c);
    e[c] = exp16_flushed(_mm512_sub_ps(_mm512_maskz_mov_ps(m, v[c]), vm));
    vsum = _mm512_mask_add_ps(vsum, m, vsum, e[c]);
  }
  const float sum = lane_sum(vsum);
  const __m512 inv = _mm512_set1_ps(1.0f / sum);
#pragma GCC unroll 4
  for (int c = 0; c < KR; ++c)
    _mm512_mask_storeu_ps(p + 16 * c, lane_mask(ns - 16 * c),
                          _mm512_maskz_mul_ps(lane_mask(n - 16 * c), e[c], inv));
  return mx + std::log(sum);
}

/// acc[r][j] += sum over k < depth of a_r[k * ks] b[k * ldb + 16 j + lanes], for the six rows'
/// pointers a_r: one FMA chain per element, k ascending, from what acc holds (the GEMM
/// micro-tile's order). The loop every tile below runs.
template <int W>
ATTN_TARGET_AVX512 __attribute__((always_inline)) inline void accumulate_rows(
    const float* const (&a)[kTileRows], Index ks, Index depth, const float* b, Index ldb,
    __m512 (&acc)[kTileRows][W]) {
  for (Index k = 0; k < depth; ++k) {
    __m512 bk[W];
#pragma GCC unroll 4
    for (int j = 0; j < W; ++j) bk[j] = _mm512_loadu_ps(b + k * ldb + 16 * j);
#pragma GCC unroll 6
    for (int r = 0; r < kTileRows; ++r) {
      const __m512 x = _mm512_set1_ps(a[r][k * ks]);
#pragma GCC unroll 4
      for (int j = 0; j < W; ++j) acc[r][j] = _mm512_fmadd_ps(x, bk[j], acc[r][j]);
    }
  }
}

/// s[r][c] = the products of query row r (of `count`, rows ldq apart, dk numbers each) with the
/// keys 16 c ... of kt (transpose_keys), from zero. Rows past count repeat the last one.
template <int KR>
ATTN_TARGET_AVX512 __attribute__((always_inline)) inline void score_registers(
    const float* q, Index ldq, int count, Index dk, const float* kt, __m512 (&s)[kTileRows][KR]) {
  const float* qr[kTileRows];
#pragma GCC unroll 6
  for (int r = 0; r < kTileRows; ++r) {
    qr[r] = q + std::min(r, count - 1) * ldq;
#pragma GCC unroll 4
    for (int c = 0; c < KR; ++c) s[r][c] = _mm512_setzero_ps();
  }
  accumulate_rows<KR>(qr, 1, dk, kt, kTileKeys, s);
}

/// The probabilities of a tile's rows: p[r * ldp + s] for s < ns (<= 16 KR) from the scores
/// Q K^T (score_registers), then the softmax of each row.
template <int KR>
ATTN_TARGET_AVX512 void probabilities_tile(const float* q, Index ldq, Index dk, const float* kt,
                                           Index ns, float scale, const float* pad, TileRows& rows,
                                           float* p, Index ldp) {
  __m512 s[kTileRows][KR];
  score_registers<KR>(q, ldq, rows.count, dk, kt, s);
#pragma GCC unroll 6
  for (int r = 0; r < kTileRows; ++r)
    if (r < rows.count)
      rows.lse[r] =
          softmax_tile_row<KR>(s[r], rows.n[r], ns, scale, rows.additive[r], pad, p + r * ldp);
}

/// The raw scores of a tile's `count` rows: c[r * ldc + s] for s < ns (<= 16 KR), from
/// score_registers (backward's Q K^T and dO V^T).
template <int KR>
ATTN_TARGET_AVX512 void scores_tile(const float* q, Index ldq, int count, Index dk, const float* kt,
                                    Index ns, float* c, Index ldc) {
  __m512 s[kTileRows][KR];
  score_registers<KR>(q, ldq, count, dk, kt, s);
#pragma GCC unroll 6
  for (int r = 0; r < kTileRows; ++r)
    if (r < count)
#pragma GCC unroll 4
      for (int j = 0; j < KR; ++j)
        _mm512_mask_storeu_ps(c + r * ldc + 16 * j, lane_mask(ns - 16 * j), s[r][j]);
}

/// C (=, or += when accumulating) A B for a tile's `count` rows and 16 OR columns: A's element
/// (r, k) at a[r * rs + k * ks] (rs 1: A read by columns, as P^T), B [depth, 16 OR] read in place
/// (rows ldb apart), C rows ldc apart. One FMA chain per element, from zero or from C, k
/// ascending: the GEMM micro-tile's order (the depth here, nt <= 128 or ns <= 64, is within one of
/// its blocks of kKC = 256; across blocks its chain runs on through C, the same sums).
template <int OR>
ATTN_TARGET_AVX512 void product_tile(const float* a, Index rs, Index ks, int count, Index depth,
                                     const float* b, Index ldb, float* c, Index ldc,
                                     bool accumulate) {
  __m512 acc[kTileRows][OR];
  const float* ar[kTileRows];
  // C's rows asked into cache for writing while the tile computes. Stored cold at its end (rows
  // of O, dQ, dK or dV in a buffer of all the batch's rows), they filled the store buffer, and the
  // next tile's first stores waited (session 34: attention forward + backward at 32 x 64, one
  // thread, 1.6% faster with the prefetch).
  if (!accumulate)
    for (int r = 0; r < count; ++r)
      for (int d = 0; d < OR; ++d)
        _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16 * d), _MM_HINT_ET0);
#pragma GCC unroll 6
  for (int r = 0; r < kTileRows; ++r) {
    ar[r] = a + std::min(r, count - 1) * rs;
#pragma GCC unroll 4
    for (int d = 0; d < OR; ++d)
      acc[r][d] =
          accumulate && r < count ? _mm512_loadu_ps(c + r * ldc + 16 * d) : _mm512_setzero_ps();
  }
  accumulate_rows<OR>(ar, ks, depth, b, ldb, acc);
#pragma GCC unroll 6
  for (int r = 0; r < kTileRows; ++r)
    if (r < count)
#pragma GCC unroll 4
      for (int d = 0; d < OR; ++d) _mm512_storeu_ps(c + r * ldc + 16 * d, acc[r][d]);
}

/// probabilities_tile for ceil(ns / 16) registers of keys (1..4).
inline void probabilities_tile(const float* q, Index ldq, Index dk, const float* kt, Index ns,
                               float scale, const float* pad, TileRows& rows, float* p, Index ldp) {
  with_registers(ns, [&](auto kr) {
    probabilities_tile<decltype(kr)::value>(q, ldq, dk, kt, ns, scale, pad, rows, p, ldp);
  });
}

/// scores_tile for ceil(ns / 16) registers of keys (1..4).
inline void scores_tile(const float* q, Index ldq, int count, Index dk, const float* kt, Index ns,
                        float* c, Index ldc) {
  with_registers(
      ns, [&](auto kr) { scores_tile<decltype(kr)::value>(q, ldq, count, dk, kt, ns, c, ldc); });
}

/// C [rows, dk] (=, or +=) A B in tiles of kTileRows rows (product_tile), dk = 16 .. 64.
inline void tiled_product(const float* a, Index rs, Index ks, Index rows, Index depth,
                          const float* b, Index ldb, Index dk, float* c, Index ldc,
                          bool accumulate) {
  with_registers(dk, [&](auto dr) {
    for (Index i0 = 0; i0 < rows; i0 += kTileRows) {
      const int count = static_cast<int>(std::min<Index>(kTileRows, rows - i0));
      product_tile<decltype(dr)::value>(a + i0 * rs, rs, ks, count, depth, b, ldb, c + i0 * ldc,
                                        ldc, accumulate);
    }
  });
}

}  // namespace attn::kernels::detail

#endif  // ATTN_HAVE_AVX512
