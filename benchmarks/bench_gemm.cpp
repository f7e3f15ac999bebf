// attn::kernels::gemm(c, a, b, accumulate = false) on the products of a Transformer step, float,
// 1 and 2 threads, against a naive triple loop (on a small shape only: it is slow). The PyTorch
// side (torch.mm, i.e. OpenBLAS SkylakeX in the peer's tuned512 environment) is
// benchmarks/torch_gemm.py on the same shapes and forms; scripts/bench_compare.sh runs both.
//
// Shapes M x K x N (C [M, N] = A [M, K] B [K, N]): 2048x512x512 (Q/K/V/out projections of 32 x 64
// tokens at d 512), 2048x512x2048 (feed-forward in), 2048x2048x512 (feed-forward out) and
// 2048x512x8000 (output projection onto the vocabulary). Three forms of each, the same FLOPs:
//   ab   C = A B       A stored [M, K], B stored [K, N]
//   atb  C = A^T B     A stored [K, M] (weight gradients: dW = dY^T X)
//   abt  C = A B^T     B stored [N, K] (a linear layer's forward: Y = X W^T, W [out, in])
// the transposes passed as Eigen expressions (.transpose()), as attn's layers do.
//
// gemm_deep/: deeper products (see DeepShapes), not part of scripts/bench_compare.sh's groups.
//
// FLOP model: 2*M*K*N per product. Args: {M, K, N, threads}. Counters: GFLOP/s, %peak of the FMA
// peak probed in the same run.
#include <Eigen/Core>

#include <attn/kernels/gemm.hpp>
#include <attn/parallel.hpp>

#include "bench_support.hpp"

namespace {

using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

enum class Form { ab, atb, abt };

/// The product of `form` as attn's layers call it.
void product(Form form, Matrix& c, const Matrix& a, const Matrix& b) {
  switch (form) {
    case Form::ab:
      attn::kernels::gemm(c, a, b, false);
      break;
    case Form::atb:
      attn::kernels::gemm(c, a.transpose(), b, false);
      break;
    case Form::abt:
      attn::kernels::gemm(c, a, b.transpose(), false);
      break;
  }
}

/// The reference: C = A B row by row, in the order of summation of the textbook loop
/// (c_ij = sum over p of a_ip b_pj, p ascending), with the inner loop over j for locality.
void naive_product(Matrix& c, const Matrix& a, const Matrix& b) {
  const Eigen::Index M = c.rows(), N = c.cols(), K = a.cols();
  for (Eigen::Index i = 0; i < M; ++i) {
    float* ci = c.data() + i * N;
    for (Eigen::Index j = 0; j < N; ++j) ci[j] = 0;
    for (Eigen::Index p = 0; p < K; ++p) {
      const float aip = a(i, p);
      const float* bp = b.data() + p * N;
      for (Eigen::Index j = 0; j < N; ++j) ci[j] += aip * bp[j];
    }
  }
}

template <Form F, bool Naive = false>
void BM_Gemm(benchmark::State& state) {
  const Eigen::Index M = state.range(0), K = state.range(1), N = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  attn::set_num_threads(threads);
  const Matrix a = F == Form::atb ? Matrix::Random(K, M) : Matrix::Random(M, K);
  const Matrix b = F == Form::abt ? Matrix::Random(N, K) : Matrix::Random(K, N);
  Matrix c(M, N);
  const auto run = [&] {
    if (Naive)
      naive_product(c, a, b);
    else
      product(F, c, a, b);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  };
  for (int i = 0; i < 2; ++i) run();  // warm-up: c touched, packing buffers allocated
  const auto start = attn_bench::loop_start();
  for (auto _ : state) run();
  attn_bench::set_rate_counters(state, start, 2.0 * static_cast<double>(M * K * N), 0, threads);
}

void TransformerShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "threads"});
  for (int threads : {1, 2})
    for (auto [m, k, n] : {std::array<int, 3>{2048, 512, 512},
                           {2048, 512, 2048},
                           {2048, 2048, 512},
                           {2048, 512, 8000}})
      b->Args({m, k, n, threads});
  attn_bench::wall_clock_ms(b);
}

/// Deep products, 2 threads: weight gradients summed over 16,384 and 25,000 tokens (A^T B) and the
/// input gradient of a 32,000-token vocabulary (A B), which run in slices of K (gemm_slices.hpp).
/// torch_gemm.py --shapes 512x16384x2048,2048x25000x512 --forms atb (and 2048x32000x512 --forms
/// ab) times the peer on the same.
void DeepShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "threads"});
  b->Args({512, 16384, 2048, 2})->Args({2048, 25000, 512, 2});
  attn_bench::wall_clock_ms(b);
}
void DeepInputGradient(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "threads"})->Args({2048, 32000, 512, 2});
  attn_bench::wall_clock_ms(b);
}

/// The naive loop is single-threaded: one small shape, attn on the same for comparison.
void SmallShape(benchmark::internal::Benchmark* b) {
  b->ArgNames({"M", "K", "N", "threads"})->Args({192, 256, 256, 1});
  attn_bench::wall_clock_ms(b);
}

BENCHMARK_TEMPLATE(BM_Gemm, Form::ab)->Name("gemm/ab")->Apply(TransformerShapes);
BENCHMARK_TEMPLATE(BM_Gemm, Form::atb)->Name("gemm/atb")->Apply(TransformerShapes);
BENCHMARK_TEMPLATE(BM_Gemm, Form::abt)->Name("gemm/abt")->Apply(TransformerShapes);
BENCHMARK_TEMPLATE(BM_Gemm, Form::atb)->Name("gemm_deep/atb")->Apply(DeepShapes);
BENCHMARK_TEMPLATE(BM_Gemm, Form::ab)->Name("gemm_deep/ab")->Apply(DeepInputGradient);
BENCHMARK_TEMPLATE(BM_Gemm, Form::ab)->Name("gemm_small/ab")->Apply(SmallShape);
BENCHMARK_TEMPLATE(BM_Gemm, Form::ab, true)->Name("gemm_small/naive")->Apply(SmallShape);

}  // namespace

ATTN_BENCHMARK_MAIN();
