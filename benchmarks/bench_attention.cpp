// Scaled dot-product self-attention kernels, float: naive vs fast, forward vs forward+backward,
// 1 and 2 threads, at d_model 512, 8 heads (K = 64) and B x L in {32x64, 16x128, 8x256, 4x512,
// 1x1024}, the shapes of the PyTorch peer (benchmarks/torch_attention.py, ../shared/bench/peers).
//
// Q, K and V are the column blocks of one packed [B*L, 3D] projection (ld = 3D), as
// MultiHeadAttention hands them to the kernel. No mask (but see the causal ones below), no dropout.
//
// FLOP model (multiply-add = 2 FLOP; softmax, scaling and masking not counted), the same as the
// peer's "math_fwd" / "math_fwd_bwd":
//   forward          4*B*H*L^2*K   (Q K^T and P V, each 2*B*H*L^2*K)
//   forward+backward 3 x forward   (each matmul's backward is two matmuls of its size; the fast
//                                   kernel's recomputation of Q K^T is not credited)
//
// The whole multi-head attention block (attn::MultiHeadAttention, self-attention, d 512, 8 heads,
// no dropout, no mask) against nn.MultiheadAttention, the peer's "mha_fwd" / "mha_fwd_bwd":
//   mha_fwd          in-projection [B*L, D] x [D, 3D], attention, out-projection [D, D]
//   mha_fwd_bwd      zero_grad + forward + backward (gradients of x and of every parameter)
//   FLOP model: projections P = 8*B*L*D^2 (in_proj 3 x, out_proj 1 x), forward = P + A with
//   A = 4*B*H*L^2*K as above, forward+backward = 3 x forward.
//
// fast_fwd_causal, fast_fwd_bwd_causal: the same kernels under a causal mask (a decoder's
// self-attention), credited with the visible query-key pairs only: L (L + 1) / 2 per head instead
// of L^2 in the models above. The peer's "math_fwd_bwd_causal" masks the future keys of its math
// attention (scripts/bench_compare.sh compares the two).
//
// Args: {B, L, threads}. Counters: tokens/s = B*L per iteration; GFLOP/s by the models above and
// %peak of the FMA peak probed in the same run. Every benchmark runs its operation twice untimed
// before timing (buffers touched), and repeats 5 times by default (bench_support.hpp).
#include <attn/kernels/attention.hpp>
#include <attn/kernels/attention_naive.hpp>
#include <attn/nn/multi_head_attention.hpp>
#include <attn/parallel.hpp>
#include <attn/random.hpp>
#include <attn/tensor.hpp>
#include <cmath>

#include "bench_support.hpp"

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
  f(in.out.data(), kDModel, in.lse.data(), nullptr,
    {q, 3 * kDModel, q + kDModel, 3 * kDModel, q + 2 * kDModel, 3 * kDModel}, in.shape, in.mask,
    in.scale, {});
}

template <bool Fast>
void backward(Inputs& in) {
  const float* q = in.qkv.data();
  float* dq = in.dqkv.data();
  const Index ld = 3 * kDModel;
  auto b = Fast ? attn::kernels::attention_backward<float>
                : attn::kernels::attention_backward_naive<float>;
  b({dq, ld, dq + kDModel, ld, dq + 2 * kDModel, ld}, in.dout.data(), kDModel,
    {q, ld, q + kDModel, ld, q + 2 * kDModel, ld}, in.out.data(), kDModel, in.lse.data(), in.shape,
    in.mask, in.scale, {});
}

template <bool Fast, bool Backward, bool Causal = false>
void BM_Attention(benchmark::State& state) {
  const Index B = state.range(0), L = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  attn::set_num_threads(threads);
  Inputs in(B, L);
  in.mask.causal = Causal;
  const auto run = [&] {
    forward<Fast>(in);
    if (Backward) backward<Fast>(in);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::DoNotOptimize(in.dqkv.data());
    benchmark::ClobberMemory();
  };
  for (int i = 0; i < 2; ++i) run();  // warm-up
  const auto start = attn_bench::loop_start();
  for (auto _ : state) run();
  const double pairs = Causal ? 0.5 * L * (L + 1) : 1.0 * L * L;  // query-key pairs per head
  const double flops = (Backward ? 3.0 : 1.0) * 4.0 * B * kHeads * pairs * kHeadDim;
  attn_bench::set_rate_counters(state, start, flops, static_cast<double>(B * L), threads);
}

template <bool Backward>
void BM_MultiHeadAttention(benchmark::State& state) {
  const Index B = state.range(0), L = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  attn::set_num_threads(threads);
  attn::MultiHeadAttention<float> mha(kDModel, kHeads, 0.0);
  attn::Rng rng(7);
  mha.reset_parameters(rng);
  mha.train();
  Tensor<float> x({B, L, kDModel}), dy({B, L, kDModel});  // [B, L, D] each
  attn::fill_normal(x, rng, 0.0, 1.0);
  attn::fill_normal(dy, rng, 0.0, 1.0);
  const attn::AttentionMask<float> no_mask;
  const auto run = [&] {
    if (Backward) mha.zero_grad();
    const Tensor<float>& y = mha.forward_self(x, no_mask);
    benchmark::DoNotOptimize(y.data());
    if (Backward) benchmark::DoNotOptimize(mha.backward(dy).data());
    benchmark::ClobberMemory();
  };
  for (int i = 0; i < 2; ++i) run();  // warm-up
  const auto start = attn_bench::loop_start();
  for (auto _ : state) run();
  const double attention = 4.0 * B * kHeads * L * L * kHeadDim;
  const double projections = 8.0 * B * L * kDModel * kDModel;
  attn_bench::set_rate_counters(state, start, (Backward ? 3.0 : 1.0) * (projections + attention),
                                static_cast<double>(B * L), threads);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "L", "threads"});
  for (int threads : {1, 2})
    for (auto bl : {std::pair<int, int>{32, 64}, {16, 128}, {8, 256}, {4, 512}, {1, 1024}})
      b->Args({bl.first, bl.second, threads});
  attn_bench::wall_clock_ms(b);
}

BENCHMARK_TEMPLATE(BM_Attention, false, false)->Name("naive_fwd")->Apply(Shapes);
BENCHMARK_TEMPLATE(BM_Attention, true, false)->Name("fast_fwd")->Apply(Shapes);
BENCHMARK_TEMPLATE(BM_Attention, false, true)->Name("naive_fwd_bwd")->Apply(Shapes);
BENCHMARK_TEMPLATE(BM_Attention, true, true)->Name("fast_fwd_bwd")->Apply(Shapes);
BENCHMARK_TEMPLATE(BM_Attention, true, false, true)->Name("fast_fwd_causal")->Apply(Shapes);
BENCHMARK_TEMPLATE(BM_Attention, true, true, true)->Name("fast_fwd_bwd_causal")->Apply(Shapes);
BENCHMARK_TEMPLATE(BM_MultiHeadAttention, false)->Name("mha_fwd")->Apply(Shapes);
BENCHMARK_TEMPLATE(BM_MultiHeadAttention, true)->Name("mha_fwd_bwd")->Apply(Shapes);

}  // namespace

ATTN_BENCHMARK_MAIN();
