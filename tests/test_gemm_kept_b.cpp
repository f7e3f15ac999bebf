// The packed copies of B that attn's own GEMM keeps while a ReusedBScope is open
// (kernels/detail/gemm_pack_buffers.hpp): attention's K^T, V, V^T and K, packed once per head. The
// copies' bits, what is kept and for how long, and products that read a leading block of a copy.
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

TYPED_TEST_SUITE(OwnGemm, OwnKernels, KernelName);

// A product whose B is marked reusable (attention's K^T, V, V^T, K) packs B once while a
// ReusedBScope is open, into one of the thread's copies, and later products with the same view of B
// read that copy: the same bits as without a scope, on one thread and on two (which pack B
// together). Another B of the same shape, or another view of the same memory, is another copy;
// more operands than copies evict the oldest, which is then packed again; a product not marked,
// or with no scope open, keeps nothing; a view with other strides only (B and B^T of a square B)
// is another copy; a nested scope's end keeps the copies; and after the outermost scope, new
// values at the same address are packed afresh. Two threads on 130 rows give each task its own
// panels of B: nothing is kept.
TYPED_TEST(OwnGemm, ReusableBIsPackedOncePerScopeWithTheSameBits) {
  using kernels::detail::gemm_packed_order;
  kernels::set_gemm_path(testing::path_of<TypeParam>());
  auto& cache = kernels::detail::reused_b_cache();
  const Index K = 64, N = 300;  // B = K^T of 300 keys of a 64-dimensional head
  for (const auto& [threads, M] : {std::pair{1, Index(130)}, {2, Index(600)}, {2, Index(130)}}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads, " << M << " rows");
    set_num_threads(threads);
    const bool kept = threads == 1 || M > 512;
    RowMatrix<float> keys = random_matrix<float>(N, K, 31);
    const auto other = random_matrix<float>(N, K, 32);
    const auto a = random_matrix<float>(M, K, 33), a2 = random_matrix<float>(M, K, 34);
    const auto product = [&](const auto& lhs, const auto& rhs, bool reuse) {
      RowMatrix<float> c(lhs.rows(), rhs.cols());
      gemm_packed_order(c, lhs, rhs, false, reuse);
      return c;
    };
    const RowMatrix<float> want = product(a, keys.transpose(), false),
                           want2 = product(a2, keys.transpose(), false),
                           want_other = product(a, other.transpose(), false),
                           want_left = product(a, keys.topRows(200).transpose(), false);
    const auto same = [](const RowMatrix<float>& x, const RowMatrix<float>& y) {
      return (x.array() == y.array()).all();
    };
    const std::uint64_t before = cache.reuses;
    EXPECT_TRUE(same(product(a, keys.transpose(), true), want)) << "no scope: packed as always";
    {
      kernels::detail::ReusedBScope scope;
      EXPECT_TRUE(same(product(a, keys.transpose(), true), want));
      EXPECT_EQ(cache.reuses - before, 0u);
      EXPECT_TRUE(same(product(a2, keys.transpose(), true), want2));
      EXPECT_EQ(cache.reuses - before, kept ? 1u : 0u) << "the second product reads the copy";
      EXPECT_TRUE(same(product(a, other.transpose(), true), want_other));
      EXPECT_TRUE(same(product(a, keys.topRows(200).transpose(), true), want_left));
      EXPECT_TRUE(same(product(a2, keys.transpose(), false), want2)) << "not marked";
      EXPECT_EQ(cache.reuses - before, kept ? 1u : 0u) << "other operands are other copies";
      EXPECT_TRUE(same(product(a, keys.transpose(), true), want));
      EXPECT_EQ(cache.reuses - before, kept ? 2u : 0u);
      // Two more operands evict the copy of keys^T, which the next product packs again.
      EXPECT_TRUE(
          same(product(a, keys.topRows(100).transpose(), true), want_left.leftCols(100).eval()));
      EXPECT_TRUE(
          same(product(a, other.topRows(100).transpose(), true), want_other.leftCols(100).eval()));
      EXPECT_TRUE(same(product(a2, keys.transpose(), true), want2));
      EXPECT_EQ(cache.reuses - before, kept ? 2u : 0u) << "evicted, packed again";
    }
    {
      // A square B and its transpose: the same address, rows and columns, other strides (K and
      // K^T of a head with as many keys as dimensions). And a nested scope's end keeps the copies.
      const auto square = random_matrix<float>(K, K, 35);
      const RowMatrix<float> want_b = product(a, square, false),
                             want_bt = product(a, square.transpose(), false);
      // 64 x 64 x 130 or 600 multiply-adds: one thread, or two sharing B; kept either way.
      const std::uint64_t first = cache.reuses;
      kernels::detail::ReusedBScope outer;
      {
        kernels::detail::ReusedBScope inner;
        EXPECT_TRUE(same(product(a, square, true), want_b));
      }
      EXPECT_TRUE(same(product(a, square.transpose(), true), want_bt)) << "another copy";
      EXPECT_EQ(cache.reuses - first, 0u);
      EXPECT_TRUE(same(product(a, square, true), want_b)) << "kept past the inner scope";
      EXPECT_EQ(cache.reuses - first, 1u);
    }
    const float* address = keys.data();
    keys = other;  // the same address, other values
    ASSERT_EQ(keys.data(), address);
    const std::uint64_t last = cache.reuses;
    kernels::detail::ReusedBScope scope;
    EXPECT_TRUE(same(product(a, keys.transpose(), true), want_other)) << "not the old copy";
    EXPECT_TRUE(same(product(a, keys.transpose(), true), want_other));
    EXPECT_EQ(cache.reuses - last, kept ? 1u : 0u);
  }
  set_num_threads(1);
}

// A product marked reusable may take only a leading block of its B (attention's causal query
// blocks, each of which sees more of a head's keys): the copy kept is then of all of B, whichever
// product comes first, and every later product with a leading block of the same B reads it. Both
// kinds of leading block: fewer columns (K^T, keys along N) and fewer rows (V, keys along the
// depth, past one 512-deep block), on one thread and on two, each with the bits of the same
// product on that block alone (packed afresh, with zeros past its last column). Two threads on
// 130 rows give each task its own panels of B, packed from the leading block: nothing is kept.
TYPED_TEST(OwnGemm, LeadingBlocksOfAKeptBReadOneCopyWithTheBitsOfEachBlockAlone) {
  using kernels::detail::gemm_packed_order;
  kernels::set_gemm_path(testing::path_of<TypeParam>());
  auto& cache = kernels::detail::reused_b_cache();
  const Index S = 700, K = 64;  // a head of 700 keys, 64 dimensions
  const RowMatrix<float> keys = random_matrix<float>(S, K, 61);
  const auto kt = keys.transpose();
  const auto same = [](const RowMatrix<float>& x, const RowMatrix<float>& y) {
    return x.rows() == y.rows() && x.cols() == y.cols() && (x.array() == y.array()).all();
  };
  struct Case {
    int threads;
    Index M;  // two threads share B from 513 rows on
    std::uint64_t reuses;
  };
  for (const Case& run : {Case{1, 130, 3}, Case{2, 600, 3}, Case{2, 130, 0}}) {
    set_num_threads(run.threads);
    SCOPED_TRACE(::testing::Message() << run.threads << " threads, " << run.M << " rows");
    const RowMatrix<float> q = random_matrix<float>(run.M, K, 62);
    // Keys along N: C [M, n] = Q K^T[:, :n]. The first product sees the fewest keys.
    std::uint64_t before = cache.reuses;
    {
      kernels::detail::ReusedBScope scope;
      for (Index n : {Index(128), Index(300), Index(513), Index(S)}) {
        RowMatrix<float> alone(run.M, n), c(run.M, n);
        gemm_packed_order(alone, q, kt.leftCols(n), false, false);
        gemm_packed_order(c, q, kt, false, true);
        EXPECT_TRUE(same(c, alone)) << n << " keys";
      }
    }
    EXPECT_EQ(cache.reuses - before, run.reuses) << "one packing, read by the later products";
    // Keys along the depth: C [M, K] = C + P[:, :n] V[:n, :] (V, or K in dQ = dS K), C read back.
    const RowMatrix<float> p = random_matrix<float>(run.M, S, 63);
    const RowMatrix<float> start = random_matrix<float>(run.M, K, 64);
    before = cache.reuses;
    kernels::detail::ReusedBScope scope;
    for (Index n : {Index(200), Index(600), Index(S), Index(100)}) {
      SCOPED_TRACE(::testing::Message() << n << " keys deep");
      RowMatrix<float> want = start, c = start;
      gemm_packed_order(want, p.leftCols(n), keys.topRows(n), true, false);
      gemm_packed_order(c, p.leftCols(n), keys, true, true);
      EXPECT_TRUE(same(c, want));
    }
    EXPECT_EQ(cache.reuses - before, run.reuses);
  }
  set_num_threads(1);
}

}  // namespace
}  // namespace attn
#endif  // ATTN_HAVE_AVX512_GEMM
