// One full training step (forward, label-smoothed loss, backward, Adam), greedy and beam decoding
// of the whole Transformer, in the setting of ../shared/bench/peers/torch_transformer.py so the
// numbers compare with PyTorch's: float, a shared 8000-token vocabulary, dropout 0.1, label
// smoothing 0.1, Adam (0.9, 0.98, 1e-9), random token ids, batch 32 x 64 source and 64 target
// tokens.
//
// FLOP model (multiply-add = 2), forward, per batch; training = 3 x forward (the peer's model):
//   encoder layer: Ns*(8d^2 + 4*Ls*d + 4*d*dff)
//   decoder layer: Nt*(8d^2 + 4*Lt*d) + Nt*4d^2 + Ns*4d^2 + Nt*4*Ls*d + Nt*4*d*dff
//   output projection: Nt*2*d*V           (Ns = B*Ls, Nt = B*Lt)
// Args: {config (0 small, 1 base), threads}.
#include <benchmark/benchmark.h>

#include <attn/attn.hpp>
#include <attn/decode/beam_search.hpp>
#include <attn/decode/greedy.hpp>
#include <attn/train/adam.hpp>
#include <attn/train/label_smoothed_loss.hpp>

namespace {

constexpr attn::Index kVocab = 8000, kBatch = 32, kLen = 64;

attn::TransformerConfig config_for(int which) {
  return which == 0 ? attn::TransformerConfig::small(kVocab)
                    : attn::TransformerConfig::base(kVocab);
}

double forward_flops(const attn::TransformerConfig& c, double B, double Ls, double Lt) {
  const double d = static_cast<double>(c.d_model), f = static_cast<double>(c.d_ff);
  const double Ns = B * Ls, Nt = B * Lt;
  const double enc = Ns * (8 * d * d + 4 * Ls * d + 4 * d * f);
  const double dec = Nt * (8 * d * d + 4 * Lt * d) + Nt * 4 * d * d + Ns * 4 * d * d +
                     Nt * 4 * Ls * d + Nt * 4 * d * f;
  return static_cast<double>(c.encoder_layers) * enc + static_cast<double>(c.decoder_layers) * dec +
         Nt * 2 * d * static_cast<double>(kVocab);
}

attn::Tensor<attn::TokenId> random_ids(attn::Index B, attn::Index L, std::uint64_t seed) {
  attn::Tensor<attn::TokenId> t({B, L});
  attn::Rng rng(seed);
  for (auto& v : t) v = static_cast<attn::TokenId>(4 + rng.below(kVocab - 4));
  return t;
}

void BM_TrainStep(benchmark::State& state) {
  const auto config = config_for(static_cast<int>(state.range(0)));
  attn::set_num_threads(static_cast<int>(state.range(1)));
  attn::Transformer<float> model(config);
  attn::Adam<float> adam(model.parameters());
  attn::LabelSmoothedCrossEntropy<float> loss(0.1, config.pad_id);
  const auto src = random_ids(kBatch, kLen, 1), tgt_in = random_ids(kBatch, kLen, 2),
             tgt_out = random_ids(kBatch, kLen, 3);
  const double tokens = static_cast<double>(kBatch * kLen);
  for (auto _ : state) {
    adam.zero_grad();
    const auto& logits = model.forward(src, tgt_in);
    loss.forward_backward(logits, tgt_out, 1.0 / tokens);
    model.backward(loss.dlogits());
    adam.step(1e-4);
  }
  state.counters["tgt_tokens/s"] =
      benchmark::Counter(tokens * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(3 * forward_flops(config, kBatch, kLen, kLen) * 1e-9 * state.iterations(),
                         benchmark::Counter::kIsRate);
}

// Decoding of up to 30 tokens for a 30-token source (no EOS stop is expected: the model is
// untrained), with the KV cache, the encoder included; tokens/s = tokens of the returned
// hypotheses (+ EOS) / time. Args: {batch, threads}.
template <class Decode>
void decode_benchmark(benchmark::State& state, attn::Index beam_size, Decode decode) {
  const auto config = config_for(1);
  attn::set_num_threads(static_cast<int>(state.range(1)));
  attn::Transformer<float> model(config);
  const attn::Index B = state.range(0), L = 30;
  const auto src = random_ids(B, L, 4);
  attn::DecodeOptions opt;
  opt.eos = 3;
  opt.beam_size = beam_size;
  opt.max_extra_length = 0;  // output length limit = source length = 30
  std::size_t produced = 0;
  for (auto _ : state) {
    // An untrained model may emit EOS early; count what was produced.
    for (const auto& h : decode(model, src, opt)) produced += h.size() + 1;
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(produced), benchmark::Counter::kIsRate);
}

void BM_GreedyDecode(benchmark::State& state) {
  decode_benchmark(state, 1, [](auto& model, const auto& src, const auto& opt) {
    return attn::greedy_decode(model, src, opt);
  });
}

// Beam 4. Each source is encoded once and its memory shared by the beams since commit "decode:
// beam search as a state object"; before it, the encoder ran on beam * batch copies of the
// sources. Run this row on both commits to compare.
void BM_BeamDecode(benchmark::State& state) {
  decode_benchmark(state, 4, [](auto& model, const auto& src, const auto& opt) {
    return attn::beam_search(model, src, opt);
  });
}

}  // namespace

BENCHMARK(BM_TrainStep)
    ->ArgNames({"base", "threads"})
    ->Args({0, 1})
    ->Args({0, 2})
    ->Args({1, 1})
    ->Args({1, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);
BENCHMARK(BM_GreedyDecode)
    ->ArgNames({"batch", "threads"})
    ->Args({1, 1})
    ->Args({1, 2})
    ->Args({32, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);

BENCHMARK(BM_BeamDecode)
    ->ArgNames({"batch", "threads"})
    ->Args({1, 1})
    ->Args({8, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2.0);

BENCHMARK_MAIN();
