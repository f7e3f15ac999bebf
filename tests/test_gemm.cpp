// kernels::gemm, the product every Linear runs, on both of its paths: attn's AVX-512 GEMM (where
// the CPU has it) and the Eigen fallback. Each is checked against the definition (gemm_naive summed
// in long double) on odd shapes, every operand layout a Transformer step uses, accumulation and the
// epilogue, and for bitwise equality between 1 and 2 threads. The packed kernels themselves, called
// directly, are tested in test_gemm_packed.cpp.
#include <array>

#include "attn/kernels/activation.hpp"
#include "attn/kernels/dropout.hpp"
#include "attn/kernels/gemm.hpp"
#include "gemm_testing.hpp"
#include "pch.hpp"

namespace attn {
namespace {

using testing::available_paths;
using testing::Gemm;
using testing::name_of;
using testing::random_matrix;
using testing::reference_product;
using testing::spread_columns;

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
      EXPECT_LT((dw.cast<double>() - expected).cwiseAbs().maxCoeff<Eigen::PropagateNaN>(),
                1e-6 * N);
      RowMatrix<float> y(N, O);
      kernels::gemm(y, x, w.transpose(), false, kernels::Epilogue<float>{bias.data(), true});
      const auto y_ref = reference_product(x, w.transpose(), bias.data(), true);
      EXPECT_LT((y.cast<double>() - y_ref).cwiseAbs().maxCoeff<Eigen::PropagateNaN>(), 1e-6 * I);
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
                  kernels::Epilogue<float>{bias.data(), true, {p, key}});
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
