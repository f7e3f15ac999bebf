// kernels::gemm, the product every Linear runs, on both of its paths: attn's AVX-512 GEMM (where
// the CPU has it) and the Eigen fallback. Each is checked against the definition (gemm_naive summed
// in long double) on odd shapes, every operand layout a Transformer step uses, accumulation and the
// epilogue, and for bitwise equality between 1 and 2 threads.
#include <array>

#include "attn/kernels/activation.hpp"
#include "attn/kernels/dropout.hpp"
#include "attn/kernels/gemm.hpp"

#include "attn/kernels/gemm_naive.hpp"
#include "pch.hpp"

namespace attn {
namespace {

template <class T>
RowMatrix<T> random_matrix(Index rows, Index cols, std::uint64_t seed) {
  RowMatrix<T> m(rows, cols);
  Rng rng(seed);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(rng.uniform() * 2 - 1);
  return m;
}

// c = a b (+ start) by the definition, summed in long double.
template <class A, class B>
RowMatrix<double> reference_product(const A& a, const B& b, const float* bias = nullptr,
                                    bool relu = false) {
  RowMatrix<long double> c = RowMatrix<long double>::Zero(a.rows(), b.cols());
  kernels::gemm_naive<long double>(c, a.template cast<long double>(),
                                   b.template cast<long double>(), false);
  for (Index i = 0; i < c.rows(); ++i)
    for (Index j = 0; j < c.cols(); ++j) {
      if (bias != nullptr) c(i, j) += bias[j];
      if (relu) c(i, j) = std::max<long double>(c(i, j), 0);
    }
  return c.cast<double>();
}

// m's elements at every other column of a matrix twice as wide (the others NaN, which a read of
// them would spread): a view of it with column stride 2 is m with neither stride 1.
RowMatrix<float> spread_columns(const RowMatrix<float>& m) {
  RowMatrix<float> wide =
      RowMatrix<float>::Constant(m.rows(), 2 * m.cols(), std::numeric_limits<float>::quiet_NaN());
  for (Index i = 0; i < m.rows(); ++i)
    for (Index k = 0; k < m.cols(); ++k) wide(i, 2 * k) = m(i, k);
  return wide;
}

// The paths this machine can run: Eigen always, each of attn's kernels where the CPU has it.
std::vector<kernels::GemmPath> available_paths() {
  std::vector<kernels::GemmPath> paths;
  for (auto p : {kernels::GemmPath::eigen, kernels::GemmPath::avx512, kernels::GemmPath::avx2})
    if (kernels::gemm_path_available(p)) paths.push_back(p);
  return paths;
}

const char* name_of(kernels::GemmPath p) { return kernels::gemm_path_name(p); }

class Gemm : public ::testing::Test {
 protected:
  void TearDown() override {
    set_num_threads(1);
    kernels::set_gemm_path(kernels::GemmPath::automatic);
  }
};

#if defined(ATTN_HAVE_AVX512_GEMM)
// The tests of attn's own GEMM below run once per kernel (OwnGemm/0 AVX-512, OwnGemm/1 AVX2), each
// skipped where the CPU cannot run it.
template <class Isa>
bool cpu_runs() {
  return std::is_same_v<Isa, kernels::detail::Avx512Isa> ? kernels::detail::cpu_has_avx512()
                                                         : kernels::detail::cpu_has_avx2_fma();
}
template <class Isa>
class OwnGemm : public Gemm {
 protected:
  void SetUp() override {
    if (!cpu_runs<Isa>()) GTEST_SKIP() << "this CPU cannot run the " << Isa::kName << " kernel";
  }
};
struct KernelName {
  template <class Isa>
  static std::string GetName(int) {
    return Isa::kName;
  }
};
using OwnKernels = ::testing::Types<kernels::detail::Avx512Isa, kernels::detail::Avx2Isa>;
TYPED_TEST_SUITE(OwnGemm, OwnKernels, KernelName);
#endif

// Sizes big enough to split over threads, with ragged row and column counts and depths that are
// not multiples of the kernel's 256-deep blocks.
TEST_F(Gemm, MatchesTheDefinitionAndIsBitwiseEqualOnOneAndTwoThreadsOnEveryPath) {
  for (kernels::GemmPath path : available_paths()) {
    kernels::set_gemm_path(path);
    for (const auto& [M, K, N] : std::vector<std::array<Index, 3>>{
             {1000, 96, 130},
             {257, 512, 64},
             {2049, 33, 100},
             {4096, 64, 8},
             {49, 513, 512},
             {300, 70, 4141},  // several column blocks of at most kNC = 1024
             {32, 300, 600},   // few rows: the columns are cut too, so that both threads work
             {20, 257, 2500}}) {
      SCOPED_TRACE(::testing::Message() << name_of(path) << " M=" << M << " K=" << K << " N=" << N);
      const auto a = random_matrix<float>(M, K, 1);
      const auto b = random_matrix<float>(K, N, 2);
      RowMatrix<float> c1(M, N), c2(M, N);
      set_num_threads(1);
      kernels::gemm(c1, a, b, false);
      set_num_threads(2);
      kernels::gemm(c2, a, b, false);
      EXPECT_TRUE((c1.array() == c2.array()).all()) << "results differ between 1 and 2 threads";
      const auto ref = reference_product(a, b);
      EXPECT_LT((c1.cast<double>() - ref).cwiseAbs().maxCoeff(), 1e-6 * static_cast<double>(K));
    }
  }
}

#if defined(ATTN_HAVE_AVX512_GEMM)
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
            EXPECT_LT((c.cast<double>() - expected).cwiseAbs().maxCoeff(),
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
#if defined(ATTN_HAVE_AVX512_GEMM)
  if (!kernels::detail::cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU has no AVX2";
  expect_panels_packed_row_by_row<kernels::detail::Avx2Isa::kNR>();
  expect_panels_packed_row_by_row<kernels::detail::Avx512Isa::kNR>();
  static_assert(kernels::detail::Avx512Isa::kNR == 32 && kernels::detail::Avx2Isa::kNR == 16);
#else
  GTEST_SKIP() << "built without attn's own kernels";
#endif
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

// Few-row products (decoding) stream B instead of packing it, split by columns over threads; x W^T
// goes in blocks of 4 rows, the last 1-3 rows one at a time (M = 1, 2, 6, 7, 13, 15); on each of
// attn's own paths the CPU runs (AVX-512, AVX2).
TEST_F(Gemm, FewRowProductsMatchTheDefinitionAndAreBitwiseEqualOnOneAndTwoThreads) {
  int paths = 0;
  for (kernels::GemmPath path : available_paths()) {
    if (path == kernels::GemmPath::eigen) continue;
    ++paths;
    kernels::set_gemm_path(path);
    for (Index M : {1, 2, 6, 7, 13, 15})
      for (Index N : {1, 47, 1000, 2049})
        for (Index K : {1, 31, 512}) {
          SCOPED_TRACE(::testing::Message()
                       << name_of(path) << " M=" << M << " N=" << N << " K=" << K);
          const auto x = random_matrix<float>(M, K, 11), w = random_matrix<float>(N, K, 12);
          const auto b = random_matrix<float>(K, N, 13), bias = random_matrix<float>(1, N, 14);
          const auto start = random_matrix<float>(M, N, 15);
          RowMatrix<float> y1(M, N), y2(M, N), z1 = start, z2 = start;
          set_num_threads(1);
          kernels::gemm(y1, x, w.transpose(), false, kernels::Epilogue<float>{bias.data(), true});
          kernels::gemm(z1, x, b, true);
          set_num_threads(2);
          kernels::gemm(y2, x, w.transpose(), false, kernels::Epilogue<float>{bias.data(), true});
          kernels::gemm(z2, x, b, true);
          EXPECT_TRUE((y1.array() == y2.array()).all() && (z1.array() == z2.array()).all())
              << "results differ between 1 and 2 threads";
          const auto y_ref = reference_product(x, w.transpose(), bias.data(), true);
          const RowMatrix<double> z_ref = start.cast<double>() + reference_product(x, b);
          EXPECT_LT((y1.cast<double>() - y_ref).cwiseAbs().maxCoeff(), 1e-6 * K);
          EXPECT_LT((z1.cast<double>() - z_ref).cwiseAbs().maxCoeff(), 1e-6 * K);
        }
  }
  if (paths == 0) GTEST_SKIP() << "this CPU runs none of attn's own kernels";
}

// Inside a ConstantWeightsScope (decoding), a weight operand met a second time gets a packed copy
// that later products reuse: the same bits as without the scope, one copy per distinct weight view,
// none for a weight met once, all freed at the end of the outermost scope; products not marked
// constant are never cached.
TYPED_TEST(OwnGemm, ConstantWeightsArePackedOncePerScopeWithTheSameResults) {
  kernels::set_gemm_path(std::is_same_v<TypeParam, kernels::detail::Avx512Isa>
                             ? kernels::GemmPath::avx512
                             : kernels::GemmPath::avx2);
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

TEST_F(Gemm, AutomaticPathIsTheWidestKernelTheCpuHas) {
  kernels::set_gemm_path(kernels::GemmPath::automatic);
  const char* env = std::getenv("ATTN_GEMM");
  const bool forced_eigen = env != nullptr && std::string(env) == "eigen";
  // tests/CMakeLists.txt's guard reads this line of the eigen_gemm/ run.
  std::cout << "gemm path: " << kernels::gemm_path_name(kernels::gemm_path()) << "\n";
  const kernels::GemmPath expected = forced_eigen                        ? kernels::GemmPath::eigen
                                     : kernels::detail::cpu_has_avx512() ? kernels::GemmPath::avx512
                                     : kernels::detail::cpu_has_avx2_fma()
                                         ? kernels::GemmPath::avx2
                                         : kernels::GemmPath::eigen;
  EXPECT_EQ(kernels::gemm_path(), expected);
  if (!kernels::detail::cpu_has_avx512()) {
    EXPECT_THROW(kernels::set_gemm_path(kernels::GemmPath::avx512), ConfigError);
  }
}

// Both kernels sum every element in the same order, so where the CPU runs both they give the same
// bits: with accumulation, every epilogue, and C wider than a kernel's column block.
TEST_F(Gemm, Avx512AndAvx2KernelsGiveTheSameBits) {
  if (!kernels::detail::cpu_has_avx512() || !kernels::detail::cpu_has_avx2_fma())
    GTEST_SKIP() << "this CPU cannot run both kernels";
  using kernels::detail::StridedMatrix;
  const Index M = 301, K = 600, N = 1100;
  const auto a = random_matrix<float>(M, K, 81), b = random_matrix<float>(K, N, 82);
  const auto bias = random_matrix<float>(1, N, 83), start = random_matrix<float>(M, N, 84);
  const auto gate = random_matrix<float>(M, N, 85);
  const StridedMatrix<const float> av{a.data(), M, K, K, 1}, bv{b.data(), K, N, N, 1};
  for (int epilogue = 0; epilogue < 3; ++epilogue)
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "epilogue=" << epilogue << " acc=" << accumulate);
      kernels::detail::GemmEpilogue epi;
      if (epilogue == 1) epi = {bias.data(), true, 0.25, 91};
      if (epilogue == 2) epi = {nullptr, false, 0, 0, gate.data(), N, 1.5f};
      RowMatrix<float> wide = start, narrow = start;
      kernels::detail::gemm_packed<kernels::detail::Avx512Isa>(av, bv, {wide.data(), M, N, N, 1},
                                                               accumulate, epi, 2);
      kernels::detail::gemm_packed<kernels::detail::Avx2Isa>(av, bv, {narrow.data(), M, N, N, 1},
                                                             accumulate, epi, 2);
      EXPECT_TRUE((wide.array() == narrow.array()).all());
    }
}
#endif

TEST_F(Gemm, AccumulatesTakesTransposedOperandsAndAppliesTheEpilogueOnEveryPath) {
  // dW += dY^T X, the shape of Linear's weight gradient; then y = x W^T + b with ReLU.
  const Index N = 3000, O = 200, I = 100;
  const auto dy = random_matrix<float>(N, O, 3);
  const auto x = random_matrix<float>(N, I, 4);
  const auto start = random_matrix<float>(O, I, 5);
  const auto w = random_matrix<float>(O, I, 9);
  const auto bias = random_matrix<float>(1, O, 10);
  for (kernels::GemmPath path : available_paths()) {
    kernels::set_gemm_path(path);
    for (int threads : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << name_of(path) << ", " << threads << " threads");
      set_num_threads(threads);
      RowMatrix<float> dw = start;
      kernels::gemm(dw, dy.transpose(), x, true);
      const RowMatrix<double> expected =
          start.cast<double>() + reference_product(dy.transpose(), x);
      EXPECT_LT((dw.cast<double>() - expected).cwiseAbs().maxCoeff(), 1e-6 * N);
      RowMatrix<float> y(N, O);
      kernels::gemm(y, x, w.transpose(), false, kernels::Epilogue<float>{bias.data(), true});
      const auto y_ref = reference_product(x, w.transpose(), bias.data(), true);
      EXPECT_LT((y.cast<double>() - y_ref).cwiseAbs().maxCoeff(), 1e-6 * I);
    }
  }
}

// Runs body(M) on every path, for a few-row (7), tail-block (32, 100) and multi-block (513)
// product, on 1 and 2 threads: the cases of the epilogue tests.
template <class Body>
void for_each_epilogue_case(Body body) {
  for (kernels::GemmPath path : available_paths()) {
    kernels::set_gemm_path(path);
    for (Index M : {7, 32, 100, 513})
      for (int threads : {1, 2}) {
        SCOPED_TRACE(::testing::Message()
                     << name_of(path) << ", M=" << M << ", " << threads << " threads");
        set_num_threads(threads);
        body(M);
      }
  }
}

// Dropout in the epilogue (FeedForward's hidden layer): the same bits as the product followed by
// kernels::dropout_forward over c as one flat tensor, on every path, for few-row, tail-block and
// multi-block products, on 1 and 2 threads.
TEST_F(Gemm, DropoutInTheEpilogueIsTheSeparateDropout) {
  const Index K = 70, N = 300;
  const double p = 0.3;
  const std::uint64_t key = 77;
  for_each_epilogue_case([&](Index M) {
    const auto x = random_matrix<float>(M, K, 31), w = random_matrix<float>(N, K, 32);
    const auto bias = random_matrix<float>(1, N, 33);
    RowMatrix<float> fused(M, N), separate(M, N);
    kernels::gemm(fused, x, w.transpose(), false,
                  kernels::Epilogue<float>{bias.data(), true, p, key});
    kernels::gemm(separate, x, w.transpose(), false, kernels::Epilogue<float>{bias.data(), true});
    kernels::dropout_forward(separate.data(), separate.data(), M * N, p, key);
    EXPECT_TRUE((fused.array() == separate.array()).all());
    EXPECT_GT((fused.array() == 0).count(), M * N / 4) << "ReLU and dropout both zero some";
  });
}

// The gate in the epilogue (FeedForward's backward): dx = dy W gated by the hidden output h =
// dropout(relu(.)) is, bit for bit, the product followed by the dropout's and the ReLU's backward
// passes, on every path, for few-row, tail-block and multi-block products, on 1 and 2 threads, with
// a gate whose rows are further apart than c's (NaN between them, which a stray read would spread).
TEST_F(Gemm, GateInTheEpilogueIsTheDropoutAndReluBackward) {
  const Index K = 70, N = 300;
  const double p = 0.3;
  const std::uint64_t key = 78;
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  for_each_epilogue_case([&](Index M) {
    const auto dy = random_matrix<float>(M, K, 41), w = random_matrix<float>(K, N, 42);
    // h = dropout(relu(.)), kept in the left N columns of a wider matrix (NaN beyond).
    RowMatrix<float> h = random_matrix<float>(M, N, 43).cwiseMax(0.0f);
    kernels::dropout_forward(h.data(), h.data(), M * N, p, key);
    RowMatrix<float> wide =
        RowMatrix<float>::Constant(M, N + 5, std::numeric_limits<float>::quiet_NaN());
    wide.leftCols(N) = h;
    kernels::Epilogue<float> gate;
    gate.gate = wide.data();
    gate.gate_stride = N + 5;
    gate.gate_scale = scale;
    RowMatrix<float> fused(M, N), separate(M, N);
    kernels::gemm(fused, dy, w, false, gate);
    kernels::gemm(separate, dy, w, false);
    kernels::dropout_backward(separate.data(), separate.data(), M * N, p, key);
    kernels::relu_backward(separate.data(), separate.data(), h.data(), M * N);
    EXPECT_TRUE((fused.array() == separate.array()).all());
    EXPECT_GT((fused.array() == 0).count(), M * N / 3) << "the gate zeroes some";
    EXPECT_GT((fused.array() != 0).count(), M * N / 4) << "and passes some";
  });
}

#if defined(ATTN_HAVE_AVX512_GEMM)
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

// A wide C (the projection onto the vocabulary) of depth kKC < K <= 2 kKC is computed in one block
// of depth K (depth_block). The block depth must not change a bit: the product equals the first
// kKC steps of k followed by the rest accumulated onto them, in all three operand layouts, on one
// and two threads, with the bias + ReLU epilogue on the finished sums.
TYPED_TEST(OwnGemm, WideProductsInOneDeepBlockHaveTheBitsOfTwoBlocks) {
  using kernels::detail::StridedMatrix;
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
          // Columns [k0, k0 + kc) of A and rows [k0, k0 + kc) of B in the layout's strides.
          const auto av = [&](Index k0, Index kc) {
            return layout == 1 ? StridedMatrix<const float>{at.data() + k0 * M, M, kc, 1, M}
                               : StridedMatrix<const float>{a.data() + k0, M, kc, K, 1};
          };
          const auto bv = [&](Index k0, Index kc) {
            return layout == 2 ? StridedMatrix<const float>{bt.data() + k0, kc, N, 1, K}
                               : StridedMatrix<const float>{b.data() + k0 * N, kc, N, N, 1};
          };
          const kernels::detail::GemmEpilogue relu{bias.data(), true};
          RowMatrix<float> whole(M, N), split(M, N);
          kernels::detail::gemm_packed<TypeParam>(av(0, K), bv(0, K), {whole.data(), M, N, N, 1},
                                                  false, relu, threads);
          kernels::detail::gemm_packed<TypeParam>(av(0, kKC), bv(0, kKC),
                                                  {split.data(), M, N, N, 1}, false, {}, threads);
          kernels::detail::gemm_packed<TypeParam>(av(kKC, K - kKC), bv(kKC, K - kKC),
                                                  {split.data(), M, N, N, 1}, true, relu, threads);
          EXPECT_TRUE((whole.array() == split.array()).all());
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
#endif  // ATTN_HAVE_AVX512_GEMM

// The row sums of a, the by-product a weight gradient dy^T x gives as the bias gradient: summed
// the same way on every path and thread count (bits equal), for few-row (7), own-panels (100, 300)
// and head-and-tail (513) products, a read in place by columns (dy^T) and by rows, K not a
// multiple of the 256-deep blocks; added to what the sums held.
TEST_F(Gemm, RowSumsOfAAreTheSameBitsOnEveryPathAndThreadCount) {
  const Index K = 600, N = 300;
  for (Index M : {Index(7), Index(100), Index(300), Index(513)})
    for (bool by_columns : {true, false}) {
      const auto at = random_matrix<float>(K, M, 71), a = random_matrix<float>(M, K, 72);
      const auto b = random_matrix<float>(K, N, 73), start = random_matrix<float>(1, M, 74);
      std::vector<RowMatrix<float>> sums;
      for (kernels::GemmPath path : available_paths()) {
        kernels::set_gemm_path(path);
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          RowMatrix<float> c(M, N), s = start;
          kernels::Epilogue<float> epi;
          epi.row_sums_of_a = s.data();
          if (by_columns)
            kernels::gemm(c, at.transpose(), b, false, epi);
          else
            kernels::gemm(c, a, b, false, epi);
          sums.push_back(s);
        }
      }
      SCOPED_TRACE(::testing::Message() << "M=" << M << (by_columns ? " a = at^T" : " a"));
      const RowMatrix<float> used = by_columns ? RowMatrix<float>(at.transpose()) : a;
      for (Index i = 0; i < M; ++i) {
        long double expected = start(0, i);
        for (Index k = 0; k < K; ++k) expected += used(i, k);
        EXPECT_NEAR(sums[0](0, i), static_cast<double>(expected), 2e-7 * static_cast<double>(K))
            << "row " << i;
      }
      for (const auto& s : sums) EXPECT_TRUE((s.array() == sums[0].array()).all());
    }
}

TEST_F(Gemm, SmallEmptyAndDoubleProductsTakeTheEigenPath) {
  set_num_threads(2);
  const auto a = random_matrix<double>(3, 4, 6);
  const auto b = random_matrix<double>(4, 5, 7);
  RowMatrix<double> c(3, 5);
  kernels::gemm(c, a, b, false);
  EXPECT_LT((c - reference_product(a, b)).cwiseAbs().maxCoeff(), 1e-14);
  RowMatrix<double> empty(0, 5);
  kernels::gemm(empty, RowMatrix<double>(0, 4), b, false);
  EXPECT_EQ(empty.rows(), 0);
  // An empty inner dimension: c = 0 + bias (or c + bias when accumulating).
  RowMatrix<float> f = RowMatrix<float>::Constant(20, 3, 5.0f);
  const float bias[3] = {1, -2, 3};
  kernels::gemm(f, RowMatrix<float>(20, 0), RowMatrix<float>(0, 3), false,
                kernels::Epilogue<float>{bias, false});
  EXPECT_EQ(f(19, 0), 1.0f);
  EXPECT_EQ(f(0, 1), -2.0f);
}

}  // namespace
}  // namespace attn
