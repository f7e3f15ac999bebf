// attn's own packed GEMM kernels (AVX-512 and AVX2), called directly: every edge of the register
// tile and the depth blocks, packing of A and B, the tasks a product is cut into, constant-weight
// caching, C rows 4 KiB apart and A^T packed once, each against the definition or for the bits of
// another path. Deep products are tested in test_gemm_depth.cpp, the copies of B kept while a
// ReusedBScope is open in test_gemm_kept_b.cpp, kernels::gemm as a whole in test_gemm.cpp.
#include "attn/kernels/gemm.hpp"
#include "gemm_testing.hpp"
#include "pch.hpp"

#if defined(ATTN_HAVE_AVX512_GEMM)
namespace attn {
namespace {

using testing::Gemm;
using testing::KernelName;
using testing::OwnGemm;
using testing::OwnKernels;
using testing::random_matrix;
using testing::reference_product;
using testing::spread_columns;

TYPED_TEST_SUITE(OwnGemm, OwnKernels, KernelName);

// The packed kernel itself, called directly so that even 1-row products reach it: every edge of
// the 12 x 32 register tile and of the 256-deep blocks, the three operand layouts of a Linear
// (x W^T, dy W, dy^T x: A read in place by rows or by columns) and a strided A that is packed,
// accumulation, and the bias + ReLU epilogue.
TYPED_TEST(OwnGemm, PackedKernelMatchesTheDefinitionOnOddShapesAndEveryLayout) {
  using kernels::detail::StridedMatrix;
  const std::vector<Index> sizes{1, 7, 47, 49, 1000};
  for (Index M : sizes)
    for (Index N : sizes)
      for (Index K : {Index(1), Index(255), Index(257), Index(600)}) {
        if (M * N * K > 20'000'000) continue;  // the long-double reference is slow
        const auto a = random_matrix<float>(M, K, 3), at_store = random_matrix<float>(K, M, 4);
        const auto b = random_matrix<float>(K, N, 5), bt_store = random_matrix<float>(N, K, 6);
        const auto bias = random_matrix<float>(1, N, 7), start = random_matrix<float>(M, N, 8);
        const RowMatrix<float> a_spread = spread_columns(a);
        for (int layout = 0; layout < 4; ++layout) {
          // 0: a b, 1: a (b')^T (the forward x W^T), 2: (a')^T b (the weight gradient dy^T x),
          // 3: a b with neither a's rows nor its columns contiguous (a is packed, not read in
          // place)
          const bool ta = layout == 2, tb = layout == 1;
          const StridedMatrix<const float> av =
              ta            ? StridedMatrix<const float>{at_store.data(), M, K, 1, M}
              : layout == 3 ? StridedMatrix<const float>{a_spread.data(), M, K, 2 * K, 2}
                            : StridedMatrix<const float>{a.data(), M, K, K, 1};
          const StridedMatrix<const float> bv =
              tb ? StridedMatrix<const float>{bt_store.data(), K, N, 1, K}
                 : StridedMatrix<const float>{b.data(), K, N, N, 1};
          const RowMatrix<float> a_used = ta ? RowMatrix<float>(at_store.transpose()) : a;
          const RowMatrix<float> b_used = tb ? RowMatrix<float>(bt_store.transpose()) : b;
          for (bool accumulate : {false, true}) {
            SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N << " K=" << K
                                              << " layout=" << layout << " acc=" << accumulate);
            RowMatrix<float> c = start;
            const bool relu = accumulate;  // the epilogue both on and off
            kernels::detail::gemm_packed<TypeParam>(av, bv, {c.data(), M, N, N, 1}, accumulate,
                                                    {bias.data(), relu}, 2);
            RowMatrix<double> expected = reference_product(a_used, b_used);
            if (accumulate) expected += start.cast<double>();
            for (Index i = 0; i < M; ++i)
              for (Index j = 0; j < N; ++j) {
                expected(i, j) += bias(0, j);
                if (relu) expected(i, j) = std::max(expected(i, j), 0.0);
              }
            // PropagateNaN: a stray read of A's NaN columns must fail, wherever it lands in C.
            EXPECT_LT((c.cast<double>() - expected).cwiseAbs().maxCoeff<Eigen::PropagateNaN>(),
                      2e-7 * static_cast<double>(K) + 1e-6);
          }
        }
      }
}

// Both kernels pack B with contiguous rows through one AVX2 loop: its AVX-512 width (32 columns)
// is checked here too, on any CPU with AVX2. Each panel is kc x NR, k-major, and zero past B's last
// column although B's rows hold more numbers after it.
template <int NR>
void expect_panels_packed_row_by_row() {
  using kernels::detail::StridedMatrix;
  for (Index N : {Index(1), Index(7), Index(NR), Index(NR + 1), Index(3 * NR - 5)})
    for (Index K : {Index(1), Index(9)}) {
      const auto b = random_matrix<float>(K + 3, N + 2, 11);  // B is its block [1, 1 + K) x [0, N)
      const StridedMatrix<const float> bv{b.data(), K + 3, N, N + 2, 1};
      const Index panels = (N + NR - 1) / NR, q0 = panels > 1 ? 1 : 0, kc = K;
      alignas(64) std::array<float, 3 * 9 * NR> packed;  // as the packed B buffers are aligned
      packed.fill(-1.0f);
      kernels::detail::avx2::pack_b_panels<NR>(bv, 1, kc, q0, panels, packed.data());
      for (Index q = q0; q < panels; ++q)
        for (Index k = 0; k < kc; ++k)
          for (Index j = 0; j < NR; ++j) {
            const Index col = q * NR + j;
            const float want = col < N ? b(1 + k, col) : 0.0f;
            ASSERT_EQ(packed[static_cast<std::size_t>(((q - q0) * kc + k) * NR + j)], want)
                << "NR=" << NR << " N=" << N << " K=" << K << " q=" << q << " k=" << k;
          }
    }
}

TEST_F(Gemm, RowsOfBArePackedIntoPanelsOfEitherKernelsWidth) {
  if (!kernels::detail::cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU has no AVX2";
  expect_panels_packed_row_by_row<kernels::detail::Avx2Isa::kNR>();
  expect_panels_packed_row_by_row<kernels::detail::Avx512Isa::kNR>();
  static_assert(kernels::detail::Avx512Isa::kNR == 32 && kernels::detail::Avx2Isa::kNR == 16);
}

// The tasks a product is cut into: column blocks of at most kNC columns outermost, and, for few
// rows, enough column blocks that every thread has work. Every element of C is in exactly one task.
TYPED_TEST(OwnGemm, TasksCoverEveryElementOnceAndGiveEveryThreadWork) {
  using GemmTasks = kernels::detail::GemmTasks<TypeParam>;
  constexpr Index kNC = TypeParam::kNC, kNR = TypeParam::kNR;
  for (const auto& [M, N] : std::vector<std::pair<Index, Index>>{{1, 1},
                                                                 {16, 512},
                                                                 {32, 1536},
                                                                 {32, 8000},
                                                                 {100, 64},
                                                                 {256, 1024},
                                                                 {2048, 512},
                                                                 {2048, 8000}})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(::testing::Message()
                   << "M=" << M << " N=" << N << ", " << threads << " threads");
      const GemmTasks tasks(M, N, 512, threads);
      std::vector<int> covered(static_cast<std::size_t>(M * N), 0);
      for (Index t = 0; t < tasks.count(); ++t) {
        const auto blk = tasks.block(t);
        EXPECT_LE((blk.q1 - blk.q0) * kNR, kNC);
        for (Index i = blk.i0; i < blk.i0 + blk.mc; ++i)
          for (Index j = blk.q0 * kNR; j < std::min(blk.q1 * kNR, N); ++j)
            ++covered[static_cast<std::size_t>(i * N + j)];
      }
      EXPECT_TRUE(std::all_of(covered.begin(), covered.end(), [](int c) { return c == 1; }));
      if (threads > 1 && N >= 4 * kNR * threads) {
        EXPECT_GE(tasks.count(), 4 * threads);
      }
      if (N > kNC) {
        EXPECT_GT(tasks.col_blocks, 1);
      }
      // Few rows on several threads: each task packs its own panels, unless B is packed already.
      EXPECT_EQ(tasks.own_panels > 0, threads > 1 && M <= GemmTasks::kOwnPanelsMaxRows);
      EXPECT_EQ(GemmTasks(M, N, 512, threads, /*shared_b=*/true).own_panels, 0);
    }
}

// Products of few rows on two threads, whose tasks pack their own panels of B (a weight gradient
// dy^T x, x W^T, dy W), with accumulation and the bias + ReLU epilogue: the bits of one thread.
TYPED_TEST(OwnGemm, FewRowProductsWithOwnPanelsHaveTheBitsOfOneThread) {
  using kernels::detail::StridedMatrix;
  const Index K = 600;
  for (Index M : {Index(16), Index(256), Index(512)})
    for (Index N : {Index(100), Index(1000)}) {
      ASSERT_GT(kernels::detail::GemmTasks<TypeParam>(M, N, K, 2).own_panels, 0);
      const auto a = random_matrix<float>(M, K, 61), at = random_matrix<float>(K, M, 62);
      const auto b = random_matrix<float>(K, N, 63), bt = random_matrix<float>(N, K, 64);
      const auto bias = random_matrix<float>(1, N, 65), start = random_matrix<float>(M, N, 66);
      for (int layout = 0; layout < 3; ++layout) {  // a b, a^T b, a b^T
        SCOPED_TRACE(::testing::Message() << "M=" << M << " N=" << N << " layout=" << layout);
        const StridedMatrix<const float> av =
            layout == 1 ? StridedMatrix<const float>{at.data(), M, K, 1, M}
                        : StridedMatrix<const float>{a.data(), M, K, K, 1};
        const StridedMatrix<const float> bv =
            layout == 2 ? StridedMatrix<const float>{bt.data(), K, N, 1, K}
                        : StridedMatrix<const float>{b.data(), K, N, N, 1};
        RowMatrix<float> one = start, two = start;
        kernels::detail::gemm_packed<TypeParam>(av, bv, {one.data(), M, N, N, 1}, true,
                                                {bias.data(), true}, 1);
        kernels::detail::gemm_packed<TypeParam>(av, bv, {two.data(), M, N, N, 1}, true,
                                                {bias.data(), true}, 2);
        EXPECT_TRUE((one.array() == two.array()).all());
        EXPECT_GT((one.array() > 0).count(), M * N / 4);
      }
    }
}

// Inside a ConstantWeightsScope (decoding), a weight operand met a second time gets a packed copy
// that later products reuse: the same bits as without the scope, one copy per distinct weight view,
// none for a weight met once, all freed at the end of the outermost scope; products not marked
// constant are never cached.
TYPED_TEST(OwnGemm, ConstantWeightsArePackedOncePerScopeWithTheSameResults) {
  kernels::set_gemm_path(testing::path_of<TypeParam>());
  set_num_threads(2);
  const Index M = 40, K = 300, N = 257;
  const auto x = random_matrix<float>(M, K, 21), w = random_matrix<float>(N, K, 22);
  const auto bias = random_matrix<float>(1, N, 23);
  const kernels::Epilogue<float> epi{bias.data(), false};
  RowMatrix<float> plain(M, N), first(M, N), second(M, N), third(M, N), top(M / 2, N);
  kernels::gemm(plain, x, w.transpose(), false, epi, /*constant_b=*/true);
  auto& cache = kernels::detail::weight_cache();
  const auto copies = [&] {
    std::size_t n = 0;
    for (const auto& e : cache.entries) n += e.packed != nullptr;
    return n;
  };
  EXPECT_EQ(cache.entries.size(), 0u) << "no scope open: nothing is kept";
  {
    kernels::ConstantWeightsScope outer;
    kernels::gemm(first, x, w.transpose(), false, epi, true);
    EXPECT_EQ(copies(), 0u) << "a weight met once is not copied";
    kernels::gemm(second, x, w.transpose(), false, epi, true);  // packs the copy
    ASSERT_EQ(copies(), 1u);
    {
      kernels::ConstantWeightsScope inner;
      kernels::gemm(third, x, w.transpose(), false, epi, true);  // from the copy
      kernels::gemm(top, x.topRows(M / 2), w.transpose(), false, epi, true);
    }
    EXPECT_EQ(copies(), 1u) << "the inner scope's end frees nothing";
    RowMatrix<float> other(M, N), part(M, 100);
    kernels::gemm(other, x, w.transpose(), false, epi, /*constant_b=*/false);
    kernels::gemm(other, x, w.transpose(), false, epi, /*constant_b=*/false);
    EXPECT_EQ(cache.entries.size(), 1u) << "a product not marked constant is not cached";
    EXPECT_TRUE((other.array() == plain.array()).all());
    for (int use = 0; use < 3; ++use)
      kernels::gemm(part, x, w.topRows(100).transpose(), false, epi, true);
    EXPECT_EQ(copies(), 2u) << "another view of the weight is another copy";
    EXPECT_TRUE((part.array() == plain.leftCols(100).array()).all());
  }
  EXPECT_EQ(cache.entries.size(), 0u);
  for (const auto* r : {&first, &second, &third}) EXPECT_TRUE((r->array() == plain.array()).all());
  EXPECT_TRUE((top.array() == plain.topRows(M / 2).array()).all());
}

// C whose rows are a multiple of 4 KiB apart (FeedForward's hidden layer at d_ff 1024 or 2048) is
// computed block by block in a copy and then stored: the same bits as C whose rows are not, with
// accumulation and every epilogue, on 1 and 2 threads; the columns of the wider matrix beyond C
// are left as they were.
TYPED_TEST(OwnGemm, CWithRowsFourKibApartIsComputedInACopyWithTheSameBits) {
  using kernels::detail::StridedMatrix;
  const Index K = 600, stride = 1024;
  const float sentinel = -12345.0f;
  for (Index M : {Index(7), Index(100), Index(513)})
    for (Index N : {Index(1000), Index(1024)}) {
      const auto a = random_matrix<float>(M, K, 51), b = random_matrix<float>(K, N, 52);
      const auto bias = random_matrix<float>(1, N, 53), start = random_matrix<float>(M, N, 54);
      const auto gate = random_matrix<float>(M, N, 55);
      const RowMatrix<double> product = reference_product(a, b);
      ASSERT_TRUE(kernels::detail::c_rows_alias({nullptr, M, N, stride, 1}));
      ASSERT_FALSE(kernels::detail::c_rows_alias({nullptr, M, N, N + 16, 1}));
      for (int epilogue = 0; epilogue < 3; ++epilogue)
        for (bool accumulate : {false, true})
          for (int threads : {1, 2}) {
            SCOPED_TRACE(::testing::Message()
                         << "M=" << M << " N=" << N << " epilogue=" << epilogue
                         << " acc=" << accumulate << ", " << threads << " threads");
            kernels::detail::GemmEpilogue epi;
            if (epilogue == 1) epi = {bias.data(), true, 0.25, 91};
            if (epilogue == 2) {
              epi.gate = gate.data();
              epi.gate_stride = N;
              epi.gate_scale = 1.5f;
            }
            RowMatrix<float> aliased = RowMatrix<float>::Constant(M, stride, sentinel);
            RowMatrix<float> apart = RowMatrix<float>::Constant(M, N + 16, sentinel);
            aliased.leftCols(N) = start;
            apart.leftCols(N) = start;
            const StridedMatrix<const float> av{a.data(), M, K, K, 1}, bv{b.data(), K, N, N, 1};
            kernels::detail::gemm_packed<TypeParam>(av, bv, {aliased.data(), M, N, stride, 1},
                                                    accumulate, epi, threads);
            kernels::detail::gemm_packed<TypeParam>(av, bv, {apart.data(), M, N, N + 16, 1},
                                                    accumulate, epi, threads);
            EXPECT_TRUE((aliased.leftCols(N).array() == apart.leftCols(N).array()).all());
            EXPECT_TRUE((aliased.rightCols(stride - N).array() == sentinel).all());
            if (epilogue == 0) {
              const RowMatrix<double> expected =
                  accumulate ? RowMatrix<double>(product + start.cast<double>()) : product;
              EXPECT_LT((aliased.leftCols(N).cast<double>() - expected).cwiseAbs().maxCoeff(),
                        2e-7 * static_cast<double>(K) + 1e-6);
            }
          }
    }
}

// A^T B with C many column blocks wide packs A^T once for the whole product and shares it
// (packs_a_once): the same bits as A read in place by rows (A copied to row-major), on one and two
// threads, with depths of one, two and three blocks, 13 rows (one thread: a lone edge panel) and
// 600 (head and tail tasks), accumulating with the bias + ReLU epilogue.
TYPED_TEST(OwnGemm, ColumnsOfAPackedOnceHaveTheBitsOfRowsInPlace) {
  using kernels::detail::StridedMatrix;
  const Index N = 4000;
  for (Index M : {Index(13), Index(600)})
    for (Index K : {Index(300), Index(600)}) {
      const auto at = random_matrix<float>(K, M, 81), b = random_matrix<float>(K, N, 82);
      const RowMatrix<float> a = at.transpose();
      const auto bias = random_matrix<float>(1, N, 83), start = random_matrix<float>(M, N, 84);
      const StridedMatrix<const float> by_columns{at.data(), M, K, 1, M};
      const StridedMatrix<const float> by_rows{a.data(), M, K, K, 1};
      const StridedMatrix<const float> bv{b.data(), K, N, N, 1};
      for (int threads : {1, 2}) {
        const kernels::detail::GemmTasks<TypeParam> tasks(M, N, K, threads);
        if (threads > 1 && tasks.own_panels > 0) continue;  // few rows: A^T read in place
        SCOPED_TRACE(::testing::Message()
                     << "M=" << M << " K=" << K << ", " << threads << " threads");
        ASSERT_TRUE(kernels::detail::packs_a_once(by_columns, tasks));
        ASSERT_FALSE(kernels::detail::packs_a_once(by_rows, tasks));
        RowMatrix<float> packed = start, in_place = start;
        for (auto [av, c] : {std::pair{by_columns, &packed}, std::pair{by_rows, &in_place}})
          kernels::detail::gemm_packed<TypeParam>(av, bv, {c->data(), M, N, N, 1}, true,
                                                  {bias.data(), true}, threads);
        EXPECT_TRUE((packed.array() == in_place.array()).all());
        EXPECT_GT((packed.array() > 0).count(), M * N / 4);
      }
    }
}

}  // namespace
}  // namespace attn
#endif  // ATTN_HAVE_AVX512_GEMM
