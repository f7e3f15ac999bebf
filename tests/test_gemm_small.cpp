// The few-row kernels of detail/gemm_small.hpp (decoding: one row of C per sentence or beam), on
// each of attn's own paths the CPU runs: checked bit for bit against a scalar model of the order
// in which the AVX-512 kernels sum, so that a CPU with only AVX2 also shows its kernels are the
// AVX-512 ones' twins.
#include "attn/kernels/gemm.hpp"
#include "pch.hpp"

namespace attn {
namespace {

#if defined(ATTN_HAVE_AVX512_GEMM)

using kernels::detail::GemmEpilogue;
using kernels::detail::StridedMatrix;

RowMatrix<float> random_matrix(Index rows, Index cols, std::uint64_t seed) {
  RowMatrix<float> m(rows, cols);
  Rng rng(seed);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(rng.uniform() * 2 - 1);
  return m;
}

// The 16 lanes of an AVX-512 accumulator folded as lane_fold does: the upper eight onto the lower,
// then the upper four, the upper two, the upper one.
float fold16(std::array<float, 16> v) {
  for (int width = 8; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) v[l] = v[l] + v[l + width];
  return v[0];
}

// One dot product of x and w [K] as small_rows_dot_block sums it (blocked: 16 lanes of k, lane l
// holding k = l mod 16) or small_rows_dot_single (32 lanes of k in two accumulators, a last 16 or
// fewer into the first; then the two added lane by lane). Lanes past K add fma(0, 0, acc), as the
// masked loads give zeros.
float model_dot(const float* x, const float* w, Index K, bool blocked) {
  std::array<float, 16> acc0{}, acc1{};
  const auto step = [&](std::array<float, 16>& acc, Index k) {
    for (int l = 0; l < 16; ++l)
      acc[l] = k + l < K ? std::fma(x[k + l], w[k + l], acc[l]) : std::fma(0.0f, 0.0f, acc[l]);
  };
  Index k = 0;
  if (!blocked)
    for (; k + 32 <= K; k += 32) {
      step(acc0, k);
      step(acc1, k + 16);
    }
  for (; k < K; k += 16) step(acc0, k);
  if (!blocked)
    for (int l = 0; l < 16; ++l) acc0[l] = acc0[l] + acc1[l];
  return fold16(acc0);
}

float model_finish(float start, float sum, const float* bias, Index j) {
  float v = start + sum;
  v += bias[j];
  return std::max(v, 0.0f);
}

std::vector<bool> own_paths() {
  std::vector<bool> paths;  // true: AVX-512
  if (kernels::gemm_path_available(kernels::GemmPath::avx512)) paths.push_back(true);
  if (kernels::gemm_path_available(kernels::GemmPath::avx2)) paths.push_back(false);
  return paths;
}

// c = (c +) x W^T + bias, ReLU, with W [N, K] row-major (B's columns contiguous: the dot kernels),
// and c = (c +) x B + bias, ReLU, with B [K, N] row-major (the axpy kernel: k ascending per
// element).
TEST(GemmSmall, FewRowProductsAreSummedInTheAvx512KernelsOrder) {
  if (own_paths().empty()) GTEST_SKIP() << "this CPU runs none of attn's own kernels";
  for (bool avx512 : own_paths())
    for (Index M : {1, 2, 3, 4, 5, 7, 9, 15})
      for (Index N : {1, 3, 5, 66})
        for (Index K : {1, 15, 16, 17, 33, 100, 512})
          for (bool accumulate : {false, true}) {
            SCOPED_TRACE(::testing::Message() << (avx512 ? "avx512" : "avx2") << " M=" << M
                                              << " N=" << N << " K=" << K << " acc=" << accumulate);
            const auto x = random_matrix(M, K, 31), w = random_matrix(N, K, 32);
            const auto b = random_matrix(K, N, 33), bias = random_matrix(1, N, 34);
            const auto start = random_matrix(M, N, 35);
            const GemmEpilogue epi{bias.data(), true};
            const StridedMatrix<const float> xs{x.data(), M, K, K, 1};
            RowMatrix<float> dot = start, axpy = start;
            ASSERT_TRUE(kernels::detail::gemm_small_rows(
                xs, {w.data(), K, N, 1, K}, {dot.data(), M, N, N, 1}, accumulate, epi, 1, avx512));
            ASSERT_TRUE(kernels::detail::gemm_small_rows(
                xs, {b.data(), K, N, N, 1}, {axpy.data(), M, N, N, 1}, accumulate, epi, 1, avx512));
            const Index blocked_rows = M / 4 * 4;
            int differ_dot = 0, differ_axpy = 0;
            for (Index i = 0; i < M; ++i)
              for (Index j = 0; j < N; ++j) {
                const float s = accumulate ? start(i, j) : 0.0f;
                const float d = model_dot(&x(i, 0), &w(j, 0), K, i < blocked_rows);
                differ_dot += dot(i, j) != model_finish(s, d, bias.data(), j);
                float acc = 0;
                for (Index k = 0; k < K; ++k) acc = std::fma(x(i, k), b(k, j), acc);
                differ_axpy += axpy(i, j) != model_finish(s, acc, bias.data(), j);
              }
            EXPECT_EQ(differ_dot, 0);
            EXPECT_EQ(differ_axpy, 0);
          }
}

TEST(GemmSmall, Avx512AndAvx2KernelsGiveTheSameBits) {
  if (own_paths().size() < 2) GTEST_SKIP() << "this CPU cannot run both kernels";
  const Index M = 13, K = 700, N = 300;
  const auto x = random_matrix(M, K, 41), w = random_matrix(N, K, 42);
  const auto bias = random_matrix(1, N, 43);
  const GemmEpilogue epi{bias.data(), false};
  RowMatrix<float> wide(M, N), narrow(M, N);
  const StridedMatrix<const float> xs{x.data(), M, K, K, 1}, ws{w.data(), K, N, 1, K};
  kernels::detail::gemm_small_rows(xs, ws, {wide.data(), M, N, N, 1}, false, epi, 2, true);
  kernels::detail::gemm_small_rows(xs, ws, {narrow.data(), M, N, N, 1}, false, epi, 2, false);
  EXPECT_TRUE((wide.array() == narrow.array()).all());
}

#endif  // ATTN_HAVE_AVX512_GEMM

}  // namespace
}  // namespace attn
