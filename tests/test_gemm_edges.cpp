// kernels::gemm at its edges, on every path the CPU runs (AVX-512, AVX2, Eigen) and on 1 and 2
// threads: empty products (M = 0 or N = 0: nothing written, in C's block or around it), products
// of no depth (K = 0: C unchanged when accumulating, zero otherwise), and products of fewer rows
// than kGemmPackedMinRows whose A is stored transposed (dW = dY^T X over a few tokens) or whose B
// is (x W^T), each checked element by element against the definition. The few-row kernels take
// some of these layouts and hand others to Eigen (AVX-512) or the packed kernel (AVX2); the tests
// of test_gemm.cpp checked A^T B with few rows only through its row sums, never its values.
#include <limits>
#include <string>

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

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// What the border around C holds: any write outside C changes it.
constexpr float kGuard = 1234.5f;

// m with `extra` NaN columns on its right: a view of its left columns reads m, and a kernel that
// reads past the view's columns spreads NaN into C.
RowMatrix<float> with_nan_columns(const RowMatrix<float>& m, Index extra = 3) {
  RowMatrix<float> wide = RowMatrix<float>::Constant(m.rows(), m.cols() + extra, kNaN);
  wide.leftCols(m.cols()) = m;
  return wide;
}

// One product A [M, K] B [K, N], its operands stored both ways: A by rows (a) and by columns (at,
// A^T), B by rows (b) and by columns (w, B^T, a Linear's weight), each a view of a wider matrix.
struct Operands {
  Index M, K, N;
  RowMatrix<float> a, at, b, w;

  Operands(Index M_, Index K_, Index N_, std::uint64_t seed) : M(M_), K(K_), N(N_) {
    const RowMatrix<float> A = random_matrix<float>(M, K, seed);
    const RowMatrix<float> B = random_matrix<float>(K, N, seed + 1);
    a = with_nan_columns(A);
    at = with_nan_columns(A.transpose());
    b = with_nan_columns(B);
    w = with_nan_columns(B.transpose());
  }
  RowMatrix<double> reference() const { return reference_product(a.leftCols(K), b.leftCols(N)); }

  // body(name, a, b) for each of the four layouts of the one product.
  template <class Body>
  void for_each_layout(Body body) const {
    const auto a_rows = a.leftCols(K);
    const auto a_cols = at.leftCols(M).transpose();
    const auto b_rows = b.leftCols(N);
    const auto b_cols = w.leftCols(K).transpose();
    body("A B", a_rows, b_rows);
    body("A^T B", a_cols, b_rows);
    body("A B^T", a_rows, b_cols);
    body("A^T B^T", a_cols, b_cols);
  }
};

// C [M, N] in the middle of a matrix one element larger on every side, whose border holds kGuard.
struct Canvas {
  RowMatrix<float> m;
  Index M, N;

  explicit Canvas(const RowMatrix<float>& start)
      : m(RowMatrix<float>::Constant(start.rows() + 2, start.cols() + 2, kGuard)),
        M(start.rows()),
        N(start.cols()) {
    c() = start;
  }
  Eigen::Block<RowMatrix<float>> c() { return m.block(1, 1, M, N); }
  RowMatrix<float> value() const { return m.block(1, 1, M, N); }
  bool border_intact() const {
    for (Index i = 0; i < m.rows(); ++i)
      for (Index j = 0; j < m.cols(); ++j) {
        const bool inside = i >= 1 && i <= M && j >= 1 && j <= N;
        if (!inside && !(m(i, j) == kGuard)) return false;
      }
    return true;
  }
};

// Runs body() on every path and on 1 and 2 threads, the path and thread count in the trace.
template <class Body>
void on_every_path_and_thread_count(Body body) {
  for (kernels::GemmPath path : available_paths()) {
    kernels::set_gemm_path(path);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      SCOPED_TRACE(::testing::Message() << name_of(path) << ", " << threads << " threads");
      body();
    }
  }
}

// An empty C (no rows, or no columns) is written nowhere, whatever the depth, layout, epilogue
// or path; with N = 0 the row sums of A are still added (the bias gradient of a weight gradient
// with no input features), and with M = 0 there are none (the guard after them stays).
TEST_F(Gemm, EmptyProductsWriteNothingOnEveryPath) {
  struct Case {
    Index M, K, N;
  };
  const Case cases[] = {{0, 1, 1},   {0, 64, 17},   {0, 700, 300}, {0, 0, 5},
                        {1, 1, 0},   {7, 300, 0},   {16, 64, 0},   {300, 700, 0},
                        {0, 300, 0}, {3000, 70, 0}, {0, 70, 3000}};
  on_every_path_and_thread_count([&] {
    for (const Case& k : cases) {
      const Operands op(k.M, k.K, k.N, 5);
      const RowMatrix<float> bias = random_matrix<float>(1, std::max<Index>(k.N, 1), 6);
      const RowMatrix<float> start = random_matrix<float>(1, k.M + 1, 7);
      op.for_each_layout([&](const char* layout, const auto& a, const auto& b) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(::testing::Message() << layout << " M=" << k.M << " K=" << k.K
                                            << " N=" << k.N << " acc=" << accumulate);
          Canvas canvas(RowMatrix<float>(k.M, k.N));
          RowMatrix<float> sums = start;  // [M + 1]: the last one a guard
          kernels::Epilogue<float> epi{bias.data(), true};
          epi.row_sums_of_a = sums.data();
          kernels::gemm(canvas.c(), a, b, accumulate, epi);
          EXPECT_TRUE(canvas.border_intact());
          EXPECT_EQ(sums(0, k.M), start(0, k.M)) << "a row sum past the M rows of A";
          const RowMatrix<float> dense_a = a;
          for (Index i = 0; i < k.M; ++i)
            EXPECT_NEAR(sums(0, i), start(0, i) + dense_a.row(i).cast<double>().sum(), 1e-6 * k.K)
                << "row sum " << i;
        }
      });
    }
  });
}

// No depth: every element of C is an empty sum, so C keeps its bits when accumulating and is zero
// otherwise; for few-row (1, 3, 7), packed (16, 100, 300) products, every layout and path.
TEST_F(Gemm, ProductsOfNoDepthKeepOrZeroCOnEveryPath) {
  on_every_path_and_thread_count([&] {
    for (Index M : {1, 3, 7, 16, 100, 300})
      for (Index N : {1, 33, 300}) {
        const Operands op(M, 0, N, 11);
        const RowMatrix<float> start = random_matrix<float>(M, N, 12);
        op.for_each_layout([&](const char* layout, const auto& a, const auto& b) {
          for (bool accumulate : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << layout << " M=" << M << " N=" << N << " acc=" << accumulate);
            Canvas canvas(start);
            kernels::gemm(canvas.c(), a, b, accumulate);
            EXPECT_TRUE(canvas.border_intact());
            const RowMatrix<float> c = canvas.value();
            if (accumulate) {
              EXPECT_TRUE((c.array() == start.array()).all()) << "C changed";
            } else {
              EXPECT_TRUE((c.array() == 0.0f).all()) << "C not zeroed";
            }
          }
        });
      }
  });
}

// Fewer rows than kGemmPackedMinRows, by value: A^T B (A stored [K, M], B by rows: the few-row
// axpy kernel reading A down its columns), A^T B^T (no few-row kernel: Eigen on AVX-512, the
// packed kernel on AVX2), A B^T (the dot kernels, 4-row blocks and the 1-3 rows left) and A B;
// each against the definition in long double, with and without accumulation, bitwise equal on 1
// and 2 threads (N = 1100 with K = 300 is enough work to split the columns), and C's border kept.
TEST_F(Gemm, FewRowProductsWithTransposedOperandsMatchTheDefinitionOnEveryPath) {
  ASSERT_GT(kernels::kGemmPackedMinRows, 15) << "the rows below must be few-row products";
  for (kernels::GemmPath path : available_paths()) {
    kernels::set_gemm_path(path);
    for (Index M : {1, 3, 7, 15})
      for (Index K : {1, 17, 300})
        for (Index N : {1, 33, 130, 1100}) {
          const Operands op(M, K, N, 21);
          const RowMatrix<double> ref = op.reference();
          const RowMatrix<float> start = random_matrix<float>(M, N, 22);
          op.for_each_layout([&](const char* layout, const auto& a, const auto& b) {
            for (bool accumulate : {false, true}) {
              SCOPED_TRACE(::testing::Message()
                           << name_of(path) << " " << layout << " M=" << M << " K=" << K
                           << " N=" << N << " acc=" << accumulate);
              Canvas one(start), two(start);
              set_num_threads(1);
              kernels::gemm(one.c(), a, b, accumulate);
              set_num_threads(2);
              kernels::gemm(two.c(), a, b, accumulate);
              EXPECT_TRUE(one.border_intact() && two.border_intact());
              const RowMatrix<float> c1 = one.value(), c2 = two.value();
              EXPECT_TRUE((c1.array() == c2.array()).all()) << "1 and 2 threads differ";
              const RowMatrix<double> expected =
                  accumulate ? RowMatrix<double>(ref + start.cast<double>()) : ref;
              EXPECT_LT((c1.cast<double>() - expected).cwiseAbs().maxCoeff<Eigen::PropagateNaN>(),
                        1e-6 * static_cast<double>(K));
            }
          });
        }
  }
}

}  // namespace
}  // namespace attn
