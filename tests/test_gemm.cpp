// kernels::gemm: the row-split product every Linear runs. Checked against a plain triple loop in
// double, and for bitwise equality between 1 and 2 threads (the reason blocks are cut at
// multiples of kGemmRowGrain rows).
#include "attn/kernels/gemm.hpp"

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

// c = a b by the definition, summed in long double.
template <class A, class B>
RowMatrix<double> reference_product(const A& a, const B& b) {
  RowMatrix<double> c(a.rows(), b.cols());
  for (Index i = 0; i < a.rows(); ++i)
    for (Index j = 0; j < b.cols(); ++j) {
      long double s = 0;
      for (Index k = 0; k < a.cols(); ++k)
        s += static_cast<long double>(a(i, k)) * static_cast<long double>(b(k, j));
      c(i, j) = static_cast<double>(s);
    }
  return c;
}

class GemmThreads : public ::testing::Test {
 protected:
  void TearDown() override { set_num_threads(1); }
};

// Sizes big enough to split (work >= kGemmParallelMinWork) with ragged row counts, so the last
// block is partial and some rows fall in Eigen's remainder panels.
TEST_F(GemmThreads, MatchesTheDefinitionAndIsBitwiseEqualOnOneAndTwoThreads) {
  for (const auto& [M, K, N] : std::vector<std::array<Index, 3>>{
           {1000, 96, 130}, {257, 512, 64}, {2049, 33, 100}, {4096, 64, 8}, {49, 512, 512}}) {
    SCOPED_TRACE(::testing::Message() << "M=" << M << " K=" << K << " N=" << N);
    const auto a = random_matrix<float>(M, K, 1);
    const auto b = random_matrix<float>(K, N, 2);
    RowMatrix<float> c1(M, N), c2(M, N);
    set_num_threads(1);
    kernels::gemm(c1, a, b, false);
    set_num_threads(2);
    kernels::gemm(c2, a, b, false);
    EXPECT_TRUE((c1.array() == c2.array()).all()) << "results differ between 1 and 2 threads";
    const auto ref = reference_product(a, b);
    EXPECT_LT((c1.cast<double>() - ref).cwiseAbs().maxCoeff(), 1e-4 * static_cast<double>(K));
  }
}

TEST_F(GemmThreads, AccumulatesAndTakesTransposedOperands) {
  // dW += dY^T X, the shape of Linear's weight gradient: rows of the result are columns of dY.
  const Index N = 3000, O = 200, I = 100;
  const auto dy = random_matrix<double>(N, O, 3);
  const auto x = random_matrix<double>(N, I, 4);
  const auto start = random_matrix<double>(O, I, 5);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    RowMatrix<double> dw = start;
    kernels::gemm(dw, dy.transpose(), x, true);
    const RowMatrix<double> expected = start + reference_product(dy.transpose(), x);
    EXPECT_LT((dw - expected).cwiseAbs().maxCoeff(), 1e-10) << threads << " threads";
  }
}

TEST_F(GemmThreads, SmallAndEmptyProductsRunSerially) {
  set_num_threads(2);
  const auto a = random_matrix<double>(3, 4, 6);
  const auto b = random_matrix<double>(4, 5, 7);
  RowMatrix<double> c(3, 5);
  kernels::gemm(c, a, b, false);
  EXPECT_LT((c - reference_product(a, b)).cwiseAbs().maxCoeff(), 1e-14);
  RowMatrix<double> empty(0, 5);
  kernels::gemm(empty, RowMatrix<double>(0, 4), b, false);
  EXPECT_EQ(empty.rows(), 0);
}

}  // namespace
}  // namespace attn
