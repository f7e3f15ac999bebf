// Scaled dot-product self-attention kernels, float: naive vs fast, forward vs forward+backward,
// 1 and 2 threads, at d_model 512, 8 heads (K = 64) and B x L in {32x64, 16x128, 8x256, 4x512,
// 1x1024}, the shapes of the PyTorch peer (benchmarks/torch_attention.py, ../shared/bench/peers).
//
// Q, K and V are the column blocks of one packed [B*L, 3D] projection (ld = 3D), as
// MultiHeadAttention hands them to the kernel. No mask, no dropout.
//
// FLOP model (multiply-add = 2 FLOP; softmax, scaling and masking not counted), the same as the
// peer's "math_fwd" / "math_fwd_bwd":
//   forward          4*B*H*L^2*K   (Q K^T and P V, each 2*B*H*L^2*K)
//   forward+backward 3 x forward   (each matmul's backward is two matmuls of its size; the fast
//                                   kernel's recomputation of Q K^T is not credited)
// Args: {B, L, threads}. Counters: tokens/s = B*L per iteration; GFLOP/s by the model above.
#include <benchmark/benchmark.h>

#include <attn/kernels/attention.hpp>
#include <attn/kernels/attention_naive.hpp>
#include <attn/parallel.hpp>
#include <attn/random.hpp>
#include <attn/tensor.hpp>
#include <cmath>

namespace {

using attn::Index;
using attn::Tensor;

constexpr Index kDModel = 512, kHeads = 8, kHeadDim = kDModel / kHeads;

struct Inputs {
  Inputs(Index B, Index L)
      : shape{B, kHeads, L, L, kHeadDim},
        qkv({B * L, 3 * kDModel}),
        out({B * L, kDModel}),
        dout({B * L, kDModel}),
        dqkv({B * L, 3 * kDModel}),
        lse({B, kHeads, L}) {
    attn::Rng rng(42);
    attn::fill_normal(qkv, rng, 0.0, 1.0);
    attn::fill_normal(dout, rng, 0.0, 1.0);
  }
  attn::kernels::AttentionShape shape;
  Tensor<float> qkv;   // [B*L, 3D] packed Q | K | V
  Tensor<float> out;   // [B*L, D]
  Tensor<float> dout;  // [B*L, D]
  Tensor<float> dqkv;  // [B*L, 3D] packed dQ | dK | dV
  Tensor<float> lse;   // [B, H, L]
  attn::AttentionMask<float> mask;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
};

template <bool Fast>
void forward(Inputs& in) {
  const float* q = in.qkv.data();
  auto f = Fast ? attn::kernels::attention_forward<float>
                : attn::kernels::attention_forward_naive<float>;
  f(in.out.data(), kDModel, in.lse.data(), nullptr, q, 3 * kDModel, q + kDModel, 3 * kDModel,
    q + 2 * kDModel, 3 * kDModel, in.shape, in.mask, in.scale, {});
}

template <bool Fast>
void backward(Inputs& in) {
  const float* q = in.qkv.data();
  float* dq = in.dqkv.data();
  const Index ld = 3 * kDModel;
  auto b = Fast ? attn::kernels::attention_backward<float>
                : attn::kernels::attention_backward_naive<float>;
  b(dq, ld, dq + kDModel, ld, dq + 2 * kDModel, ld, in.dout.data(), kDModel, q, ld, q + kDModel, ld,
    q + 2 * kDModel, ld, in.out.data(), kDModel, in.lse.data(), in.shape, in.mask, in.scale, {});
}

template <bool Fast, bool Backward>
void BM_Attention(benchmark::State& state) {
  const Index B = state.range(0), L = state.range(1);
  attn::set_num_threads(static_cast<int>(state.range(2)));
  Inputs in(B, L);
  for (auto _ : state) {
    forward<Fast>(in);
    if (Backward) backward<Fast>(in);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::DoNotOptimize(in.dqkv.data());
    benchmark::ClobberMemory();
  }
  const double flops = (Backward ? 3.0 : 1.0) * 4.0 * B * kHeads * L * L * kHeadDim;
  const double iters = static_cast<double>(state.iterations());
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(B * L) * iters, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * iters * 1e-9, benchmark::Counter::kIsRate);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "L", "threads"});
  for (int threads : {1, 2})
    for (auto bl : {std::pair<int, int>{32, 64}, {16, 128}, {8, 256}, {4, 512}, {1, 1024}})
      b->Args({bl.first, bl.second, threads});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_TEMPLATE(BM_Attention, false, false)->Name("naive_fwd")->Apply(Shapes);
BENCHMARK_TEMPLATE(BM_Attention, true, false)->Name("fast_fwd")->Apply(Shapes);
BENCHMARK_TEMPLATE(BM_Attention, false, true)->Name("naive_fwd_bwd")->Apply(Shapes);
BENCHMARK_TEMPLATE(BM_Attention, true, true)->Name("fast_fwd_bwd")->Apply(Shapes);

}  // namespace

BENCHMARK_MAIN();
