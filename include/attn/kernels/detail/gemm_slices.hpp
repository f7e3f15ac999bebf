// The entry point of attn's own GEMM: a product deeper than 1.5 kDepthSlice runs as a sum of
// products over slices of K (gemm_packed.hpp's gemm_packed_slice each), so that the packed operand
// a block of C's rows sweeps stays in cache however deep the product.
#pragma once

#include "attn/kernels/detail/gemm_packed.hpp"

#if defined(ATTN_HAVE_AVX512_GEMM)

namespace attn::kernels::detail {

/// Products deeper than 1.5 kDepthSlice run in slices of K about kDepthSlice deep. Unsliced,
/// every block of C's rows reads all of packed B, which outgrows the caches as K grows: a weight
/// gradient summed over 25,000 tokens (2048 x 25000 x 512) packed a 51 MB B and read it from
/// memory once per 96 rows, and one of 512 rows gave each task a single panel (GemmTasks). Sliced,
/// each slice's B stays in L3 (a task's own panels in L2 or L3) while the rows sweep it, and C is
/// read back once a slice. Scratch timings (session 35; 2 threads, medians of 3 alternating runs,
/// GFLOP/s), A^T B: 512 x 8192 x 2048 from 271 to 309, 512 x 16384 x 512 from 212 to 292,
/// 512 x 25000 x 2048 from 216 to 330, 2048 x 25000 x 512 from 267 to 310, 128 x 25000 x 512
/// from 174 to 240, 512 x 4096 x 2048 from 318 to 331; A B: 2048 x 32000 x 512 (the input
/// gradient of a 32,000-token vocabulary) from 296 to 319. Slices of 1024 and 1536 were within a
/// few percent of 2048.
inline constexpr Index kDepthSlice = 2048;

/// The depth of the next slice of a product with `rest` steps of k left: all of them up to
/// 1.5 kDepthSlice, else kDepthSlice. So every slice but the last is kDepthSlice deep, the last
/// between 0.5 and 1.5 times that, and a product up to 1.5 kDepthSlice deep is one slice. The
/// slices never change a bit: each element of C is one FMA chain through C, and each row sum of A
/// one chain of adds through the sums, whatever the cut (kDepthSlice is a whole number of each
/// kernel's depth blocks only so that no slice adds a short block).
inline Index depth_slice(Index rest) {
  return rest <= kDepthSlice + kDepthSlice / 2 ? rest : kDepthSlice;
}

/// c (=, or += when accumulate) a b, then the epilogue; c [M, N] must have unit column stride, and
/// b is B [K, N], or for `scope` an operand whose leading [K, N] block B is (gemm_packed_slice).
/// Runs on up to `threads` threads (1 inside a parallel region). `b_lifetime`: whether b's packed
/// form is kept (gemm_packed_slice); a weight's product, while a ConstantWeightsScope is open, is
/// not sliced (its packed copy is of all of b), and a sliced product keeps nothing. Else a deep
/// product runs in slices of depth (depth_slice), each accumulated onto the one before, the
/// epilogue with the last (but the row sums of A, which every slice adds to).
template <class Isa>
void gemm_packed(const StridedMatrix<const float>& a, const StridedMatrix<const float>& b,
                 StridedMatrix<float> c, bool accumulate, const GemmEpilogue& epi, int threads,
                 BLifetime b_lifetime = BLifetime::product) {
  static_assert(kDepthSlice % Isa::kKC == 0 && kDepthSlice % kKCColumnsOfA == 0,
                "slices are whole depth blocks");
  const Index K = a.cols;
  if (c.cols == 0) {  // no product, but the row sums of A still asked for
    if (epi.row_sums_of_a != nullptr) Isa::add_row_sums(a, 0, c.rows, 0, K, epi.row_sums_of_a);
    return;
  }
  const bool cached = b_lifetime == BLifetime::weight && weight_cache().depth > 0;
  if (cached || depth_slice(K) == K || c.rows == 0)
    return gemm_packed_slice<Isa>(a, b, c, accumulate, epi, threads, b_lifetime);
  GemmEpilogue sums_only;
  sums_only.row_sums_of_a = epi.row_sums_of_a;
  for (Index k0 = 0, kc = 0; k0 < K; k0 += kc) {
    kc = depth_slice(K - k0);
    const StridedMatrix<const float> a_slice{&a(0, k0), a.rows, kc, a.row_stride, a.col_stride};
    const StridedMatrix<const float> b_slice{&b(k0, 0), kc, c.cols, b.row_stride, b.col_stride};
    gemm_packed_slice<Isa>(a_slice, b_slice, c, accumulate || k0 > 0,
                           k0 + kc == K ? epi : sums_only, threads, BLifetime::product);
  }
}

}  // namespace attn::kernels::detail

#endif  // ATTN_HAVE_AVX512_GEMM
