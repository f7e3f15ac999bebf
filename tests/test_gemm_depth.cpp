// attn's own GEMM on deep products, both kernels: a wide C in one block of depth K, and products
// deeper than 1.5 kDepthSlice, which run in slices of K (gemm_slices.hpp). Neither may change a
// bit: each is checked against the unblocked or unsliced product and against the definition.
#include "attn/kernels/gemm.hpp"
#include "gemm_testing.hpp"
#include "pch.hpp"

#if defined(ATTN_HAVE_AVX512_GEMM)
namespace attn {
namespace {

using testing::KernelName;
using testing::OwnGemm;
using testing::OwnKernels;
using testing::random_matrix;
using testing::reference_product;

TYPED_TEST_SUITE(OwnGemm, OwnKernels, KernelName);

// The operands of one of a Linear's three products, in that product's strides: layout 0 is A B
// (A from a [M, K], B from b [K, N]), 1 is A^T B (A from at [K, M]), 2 is A B^T (B from bt
// [N, K]). a_cols and b_rows give columns [k0, k0 + kc) of A and rows [k0, k0 + kc) of B.
struct LayoutOperands {
  int layout;
  const RowMatrix<float>& a;
  const RowMatrix<float>& at;
  const RowMatrix<float>& b;
  const RowMatrix<float>& bt;
  kernels::detail::StridedMatrix<const float> a_cols(Index k0, Index kc) const {
    const Index M = a.rows(), K = a.cols();
    if (layout == 1) return {at.data() + k0 * M, M, kc, 1, M};
    return {a.data() + k0, M, kc, K, 1};
  }
  kernels::detail::StridedMatrix<const float> b_rows(Index k0, Index kc) const {
    const Index K = b.rows(), N = b.cols();
    if (layout == 2) return {bt.data() + k0, kc, N, 1, K};
    return {b.data() + k0 * N, kc, N, N, 1};
  }
};

// A wide C (the projection onto the vocabulary) of depth kKC < K <= 2 kKC is computed in one block
// of depth K (depth_block). The block depth must not change a bit: the product equals the first
// kKC steps of k followed by the rest accumulated onto them, in all three operand layouts, on one
// and two threads, with the bias + ReLU epilogue on the finished sums.
TYPED_TEST(OwnGemm, WideProductsInOneDeepBlockHaveTheBitsOfTwoBlocks) {
  constexpr Index kKC = TypeParam::kKC;
  const Index M = 100;
  for (Index K : {kKC + 44, 2 * kKC})
    for (Index N : {Index(4096), Index(4100)}) {
      ASSERT_EQ(kernels::detail::depth_block<TypeParam>(K, N), K);
      ASSERT_EQ(kernels::detail::depth_block<TypeParam>(K, N - 100), kKC);
      const auto a = random_matrix<float>(M, K, 71), at = random_matrix<float>(K, M, 72);
      const auto b = random_matrix<float>(K, N, 73), bt = random_matrix<float>(N, K, 74);
      const auto bias = random_matrix<float>(1, N, 75);
      for (int layout = 0; layout < 3; ++layout)  // A B, A^T B, A B^T
        for (int threads : {1, 2}) {
          SCOPED_TRACE(::testing::Message() << "K=" << K << " N=" << N << " layout=" << layout
                                            << ", " << threads << " threads");
          const LayoutOperands ops{layout, a, at, b, bt};
          const kernels::detail::GemmEpilogue relu{bias.data(), true};
          RowMatrix<float> whole(M, N), split(M, N);
          kernels::detail::gemm_packed<TypeParam>(ops.a_cols(0, K), ops.b_rows(0, K),
                                                  {whole.data(), M, N, N, 1}, false, relu, threads);
          kernels::detail::gemm_packed<TypeParam>(ops.a_cols(0, kKC), ops.b_rows(0, kKC),
                                                  {split.data(), M, N, N, 1}, false, {}, threads);
          kernels::detail::gemm_packed<TypeParam>(ops.a_cols(kKC, K - kKC),
                                                  ops.b_rows(kKC, K - kKC),
                                                  {split.data(), M, N, N, 1}, true, relu, threads);
          EXPECT_TRUE((whole.array() == split.array()).all());
        }
    }
}

// A product deeper than 1.5 kDepthSlice runs in slices of depth (depth_slice), each accumulated
// onto the one before. In the three operand layouts of a Linear, on one and two threads, for few
// rows (own panels) and many (head and tail tasks), writing and accumulating: C and the row sums
// of A have the bits of the unsliced product (gemm_packed_slice over all of K) and of a chain of
// unsliced products cut elsewhere; the bias + ReLU epilogue is applied once, to the finished sums
// (C matches the definition); and the row sums count every slice. A weight operand (constant_b)
// outside a ConstantWeightsScope gives the same bits.
TYPED_TEST(OwnGemm, DeepProductsRunInSlicesWithTheBitsOfOneProduct) {
  using kernels::detail::BLifetime;
  using kernels::detail::depth_slice;
  using kernels::detail::GemmEpilogue;
  using kernels::detail::StridedMatrix;
  constexpr Index kS = kernels::detail::kDepthSlice;
  EXPECT_EQ(depth_slice(kS + kS / 2), kS + kS / 2);
  EXPECT_EQ(depth_slice(kS + kS / 2 + 1), kS);
  const Index K = 3 * kS + 100, N = 70;                    // slices kS, kS, kS + 100
  const std::vector<Index> chain{0, 1000, 3000, 5000, K};  // each link at most 1.5 kS deep
  for (Index M : {Index(13), Index(600)}) {
    ASSERT_EQ(kernels::detail::GemmTasks<TypeParam>(M, N, kS, 2).own_panels > 0, M < 512);
    const auto a = random_matrix<float>(M, K, 91), b = random_matrix<float>(K, N, 93);
    const RowMatrix<float> at = a.transpose(), bt = b.transpose();
    const auto bias = random_matrix<float>(1, N, 95), start = random_matrix<float>(M, N, 96);
    const RowMatrix<double> product = reference_product(a, b);
    for (int layout = 0; layout < 3; ++layout)  // A B, A^T B (from at), A B^T (from bt)
      for (bool accumulate : {false, true})
        for (int threads : {1, 2}) {
          SCOPED_TRACE(::testing::Message() << "M=" << M << " layout=" << layout << " acc="
                                            << accumulate << ", " << threads << " threads");
          const LayoutOperands ops{layout, a, at, b, bt};
          // sliced, as a weight operand, unsliced, chained
          std::vector<RowMatrix<float>> c(4, start), sums(4, RowMatrix<float>::Zero(1, M));
          const auto epi = [&](int v, bool last) {
            GemmEpilogue e = last ? GemmEpilogue{bias.data(), true} : GemmEpilogue{};
            e.row_sums_of_a = sums[v].data();
            return e;
          };
          const auto cv = [&](int v) { return StridedMatrix<float>{c[v].data(), M, N, N, 1}; };
          for (int v : {0, 1})
            kernels::detail::gemm_packed<TypeParam>(
                ops.a_cols(0, K), ops.b_rows(0, K), cv(v), accumulate, epi(v, true), threads,
                v == 1 ? BLifetime::weight : BLifetime::product);
          kernels::detail::gemm_packed_slice<TypeParam>(ops.a_cols(0, K), ops.b_rows(0, K), cv(2),
                                                        accumulate, epi(2, true), threads,
                                                        BLifetime::product);
          for (std::size_t l = 0; l + 1 < chain.size(); ++l) {
            const Index k0 = chain[l], kc = chain[l + 1] - k0;
            ASSERT_EQ(depth_slice(kc), kc);
            kernels::detail::gemm_packed<TypeParam>(ops.a_cols(k0, kc), ops.b_rows(k0, kc), cv(3),
                                                    accumulate || k0 > 0, epi(3, k0 + kc == K),
                                                    threads);
          }
          for (int v : {1, 2, 3}) {
            EXPECT_TRUE((c[v].array() == c[0].array()).all()) << "C of variant " << v;
            EXPECT_TRUE((sums[v].array() == sums[0].array()).all()) << "sums of variant " << v;
          }
          RowMatrix<double> expected = product;
          if (accumulate) expected += start.cast<double>();
          for (Index i = 0; i < M; ++i)
            for (Index j = 0; j < N; ++j)
              expected(i, j) = std::max(expected(i, j) + bias(0, j), 0.0);
          EXPECT_LT((c[0].cast<double>() - expected).cwiseAbs().maxCoeff(), 2e-7 * K + 1e-6);
          EXPECT_GT((c[0].array() > 0).count(), M * N / 4);
          for (Index i = 0; i < M; ++i)
            EXPECT_NEAR(sums[0](0, i), a.row(i).cast<double>().sum(), 2e-7 * K) << "row " << i;
        }
  }
}

}  // namespace
}  // namespace attn
#endif  // ATTN_HAVE_AVX512_GEMM
