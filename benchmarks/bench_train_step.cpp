// One full training step (forward, label-smoothed loss, backward, Adam) and greedy decoding of the
// whole Transformer, in the setting of ../shared/bench/peers/torch_transformer.py so the numbers
// compare with PyTorch's: float, a shared 8000-token vocabulary, dropout 0.1 (residual, embedding,
// attention weights and feed-forward hidden, as nn.Transformer applies it), label smoothing 0.1,
// Adam (0.9, 0.98, 1e-9), random token ids, batch 32 x 64 source and 64 target tokens.
//
// Timed the way the peer times itself, so that nothing is misread (issue 8):
//   - the model, optimiser and data are built once per (config, threads) and kept across the
//     benchmark's repetitions; 2 full steps run untimed first, so every buffer is allocated and
//     touched before timing (a base step outlasts any min_time: without this, its first timed
//     steps paid for the page faults of the first touch);
//   - one step per repetition (Iterations(1)), at least 5 repetitions by default
//     (bench_support.hpp), reported as median, mean, stddev, min and max;
//   - peak_RSS_MiB: the process's peak resident memory after the steps or decodes (run one
//     benchmark per process, --benchmark_filter, to get the figure of that one alone;
//     bench_compare.sh does).
//
// FLOP model (multiply-add = 2), forward, per batch; training = 3 x forward (the peer's model):
//   encoder layer: Ns*(8d^2 + 4*Ls*d + 4*d*dff)
//   decoder layer: Nt*(8d^2 + 4*Lt*d) + Nt*4d^2 + Ns*4d^2 + Nt*4*Ls*d + Nt*4*d*dff
//   output projection: Nt*2*d*V           (Ns = B*Ls, Nt = B*Lt)
// Counters: tokens/s = target tokens B*Lt per second, GFLOP/s by that model, %peak of the FMA
// peak probed in the same run.
//
// train_step/multi30k_padded/{forward,scored}: the model of Multi30k run 5 (docs/multi30k-runs.md;
// N = 4, d_model 128, h = 4, d_ff 512, dropout 0.3) on a batch shaped like the trainer's
// length-sorted ones: 180 sentences of 20 source tokens and 17 to 22 target tokens, 11.4% of the
// target positions padding (Multi30k's batches: 12.4% on average). Through forward(), or
// forward_scored() that projects only the non-padding targets onto the vocabulary; tokens/s counts
// the non-padding targets, and GFLOP/s uses the FLOP model above for the whole padded batch in
// both. One model serves both rows, and a repetition is one step, so
// `--benchmark_enable_random_interleaving=true` mixes their steps in a random order.
// train_step/multi30k_median/scored: the same model on a batch of the corpus's median length
// (German and English sentences have 12 words at the median, 8 at the tenth percentile and 18 at
// the ninetieth): 300 sentences of 14 source tokens and 9 to 14 target tokens, whose attention
// blocks are shorter than 16 rows.
#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include <attn/attn.hpp>
#include <attn/decode/greedy.hpp>
#include <attn/train/adam.hpp>
#include <attn/train/label_smoothed_loss.hpp>

#include "bench_support.hpp"

namespace {

constexpr attn::Index kVocab = 8000, kBatch = 32, kLen = 64;
constexpr int kWarmUpSteps = 2;
constexpr attn::Index kOutLen = 30;  // decoding: source length and output limit

/// What a training step benchmark trains: the small or base preset on the peer's batch, or the
/// Multi30k recipe on a long batch or on one of the median length.
enum class StepSetup { small, base, multi30k_padded, multi30k_median };

/// The preset, with dropout where the peer's nn.Transformer(dropout=0.1) has it: besides the
/// residual and embedding dropout of the paper, on the attention weights and on the feed-forward's
/// hidden ReLU output, so that both sides do the same work.
attn::TransformerConfig config_for(StepSetup which) {
  attn::TransformerConfig c = which == StepSetup::small ? attn::TransformerConfig::small(kVocab)
                                                        : attn::TransformerConfig::base(kVocab);
  c.attention_dropout = c.relu_dropout = c.dropout;
  return c;
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

/// One batch: [B, S] source ids, [B, T] decoder input and targets.
struct StepBatch {
  attn::Tensor<attn::TokenId> src, tgt_in, tgt_out;
};

/// The peer's batch: 32 x 64 random ids on both sides, no padding.
StepBatch peer_batch() {
  return {random_ids(kBatch, kLen, 1), random_ids(kBatch, kLen, 2), random_ids(kBatch, kLen, 3)};
}

/// A Multi30k-shaped batch of `rows` sentences of `src` source tokens: row r has
/// tgt - (5 r / 3) % 6 real target positions, then padding.
StepBatch padded_batch(attn::Index rows, attn::Index src, attn::Index tgt) {
  StepBatch b{random_ids(rows, src, 1), random_ids(rows, tgt, 2), random_ids(rows, tgt, 3)};
  for (attn::Index r = 0; r < rows; ++r)
    for (attn::Index t = tgt - (5 * r / 3) % 6; t < tgt; ++t)
      b.tgt_in.data()[r * tgt + t] = b.tgt_out.data()[r * tgt + t] = 0;
  return b;
}

attn::TransformerConfig multi30k_config() {
  attn::TransformerConfig c = attn::TransformerConfig::tiny(kVocab);
  c.d_model = 128;
  c.heads = 4;
  c.d_ff = 512;
  c.encoder_layers = c.decoder_layers = 4;
  c.dropout = 0.3;
  return c;
}

/// Everything one training step needs, built once and warmed up by kWarmUpSteps steps (of both
/// kinds with `both`).
struct TrainSetup {
  TrainSetup(const attn::TransformerConfig& c, StepBatch b, bool both)
      : config(c),
        model(config),
        adam(model.parameters()),
        loss(0.1, config.pad_id),
        batch(std::move(b)),
        tokens(static_cast<double>(attn::count_tokens(batch.tgt_out, config.pad_id))) {
    for (int i = 0; i < kWarmUpSteps; ++i) {
      step(false);
      if (both) step(true);
    }
  }
  /// forward(), or forward_scored() (`scored`), loss, backward, Adam.
  double step(bool scored) {
    adam.zero_grad();
    // The model's logits buffer; the gradient is written over it.
    attn::Tensor<float> logits = scored
                                     ? model.forward_scored(batch.src, batch.tgt_in, batch.tgt_out)
                                     : model.forward(batch.src, batch.tgt_in);
    const auto stats = loss.forward_backward_in_place(
        logits, scored ? model.scored_targets() : batch.tgt_out, 1.0 / tokens);
    model.backward(logits);
    adam.step(1e-4);
    return stats.mean_loss();
  }
  double flops() const {  // training = 3 x forward over the whole padded batch
    return 3 * forward_flops(config, static_cast<double>(batch.src.size(0)),
                             static_cast<double>(batch.src.size(1)),
                             static_cast<double>(batch.tgt_in.size(1)));
  }

  attn::TransformerConfig config;
  attn::Transformer<float> model;
  attn::Adam<float> adam;
  attn::LabelSmoothedCrossEntropy<float> loss;
  StepBatch batch;
  double tokens;  // non-padding targets
};

/// The setup of the last (setup, threads) asked for; a new pair replaces it (memory freed first).
TrainSetup& train_setup(StepSetup which, int threads) {
  static std::unique_ptr<TrainSetup> setup;
  static std::pair<StepSetup, int> key{StepSetup::small, -1};
  attn::set_num_threads(threads);
  if (key != std::pair{which, threads}) {
    setup.reset();
    if (which == StepSetup::multi30k_padded)
      setup = std::make_unique<TrainSetup>(multi30k_config(), padded_batch(180, 20, 22), true);
    else if (which == StepSetup::multi30k_median)
      setup = std::make_unique<TrainSetup>(multi30k_config(), padded_batch(300, 14, 14), true);
    else
      setup = std::make_unique<TrainSetup>(config_for(which), peer_batch(), false);
    key = {which, threads};
  }
  return *setup;
}

void BM_TrainStep(benchmark::State& state, StepSetup which, bool scored) {
  const int threads = static_cast<int>(state.range(0));
  TrainSetup& s = train_setup(which, threads);
  double loss = 0;
  const auto start = attn_bench::loop_start();
  for (auto _ : state) loss = s.step(scored);
  attn_bench::set_rate_counters(state, start, s.flops(), s.tokens, threads);
  state.counters["peak_RSS_MiB"] = attn_bench::peak_rss_mib();
  if (!std::isfinite(loss)) state.SkipWithError("training loss is not finite");
}

// Greedy decoding of up to 30 tokens for a 30-token source (the peer's setting), with the KV
// cache; tokens/s = tokens produced / time, the encoder included. An untrained model may emit EOS
// before 30 tokens: the counter counts the decoding steps taken (an EOS is one), and tokens/call
// says how many that was (B * 30 when no hypothesis stopped early, as the peer always does). Model
// built once per batch size, 2 untimed decodes first. Beam search (beam 4, the paper's) is timed
// the same way: tokens of the best hypotheses.
struct DecodeSetup {
  DecodeSetup(attn::Index batch, attn::Index beam)
      : model(config_for(StepSetup::base)), src(random_ids(batch, kOutLen, 4)) {
    options.eos = 3;
    options.max_extra_length = 0;  // output length limit = source length = 30
    options.beam_size = beam;
    for (int i = 0; i < kWarmUpSteps; ++i) decode();
  }
  double decode() {
    // A hypothesis that stopped early took one more step, for its EOS; one that reached the
    // limit took exactly kOutLen steps.
    attn::Index produced = 0;
    const auto hyps = options.beam_size > 1 ? attn::beam_search(model, src, options)
                                            : attn::greedy_decode(model, src, options);
    for (const auto& h : hyps)
      produced += std::min<attn::Index>(static_cast<attn::Index>(h.size()) + 1, kOutLen);
    return static_cast<double>(produced);
  }
  attn::Transformer<float> model;
  attn::Tensor<attn::TokenId> src;  // [B, 30]
  attn::DecodeOptions options;
};

void BM_Decode(benchmark::State& state, attn::Index beam) {
  const attn::Index batch = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  static std::unique_ptr<DecodeSetup> setup;
  attn::set_num_threads(threads);
  if (!setup || setup->src.size(0) != batch || setup->options.beam_size != beam) {
    setup.reset();
    setup = std::make_unique<DecodeSetup>(batch, beam);
  }
  double produced = 0;
  const auto start = attn_bench::loop_start();
  for (auto _ : state) produced += setup->decode();
  const double per_call = produced / static_cast<double>(state.iterations());
  attn_bench::set_rate_counters(state, start, 0, per_call, threads);
  state.counters["tokens/call"] = per_call;
  state.counters["peak_RSS_MiB"] = attn_bench::peak_rss_mib();
}

// A train step or a decoding call is long enough to time once per repetition.
void OncePerRepetition(benchmark::internal::Benchmark* b) {
  b->Iterations(1);
  attn_bench::wall_clock_ms(b);
}

void OneAndTwoThreads(benchmark::internal::Benchmark* b) {
  b->ArgName("threads")->Arg(1)->Arg(2);
  OncePerRepetition(b);
}

}  // namespace

BENCHMARK_CAPTURE(BM_TrainStep, small, StepSetup::small, false)
    ->Name("train_step/small")
    ->Apply(OneAndTwoThreads);
BENCHMARK_CAPTURE(BM_TrainStep, base, StepSetup::base, false)
    ->Name("train_step/base")
    ->Apply(OneAndTwoThreads);
BENCHMARK_CAPTURE(BM_TrainStep, padded_forward, StepSetup::multi30k_padded, false)
    ->Name("train_step/multi30k_padded/forward")
    ->Apply(OneAndTwoThreads);
BENCHMARK_CAPTURE(BM_TrainStep, padded_scored, StepSetup::multi30k_padded, true)
    ->Name("train_step/multi30k_padded/scored")
    ->Apply(OneAndTwoThreads);
BENCHMARK_CAPTURE(BM_TrainStep, median_scored, StepSetup::multi30k_median, true)
    ->Name("train_step/multi30k_median/scored")
    ->Apply(OneAndTwoThreads);
BENCHMARK_CAPTURE(BM_Decode, greedy, 1)
    ->Name("greedy_decode/base")
    ->ArgNames({"batch", "threads"})
    ->Args({1, 1})
    ->Args({1, 2})
    ->Args({32, 1})
    ->Args({32, 2})
    ->Apply(OncePerRepetition);
BENCHMARK_CAPTURE(BM_Decode, beam, 4)
    ->Name("beam4_decode/base")
    ->ArgNames({"batch", "threads"})
    ->Args({1, 1})
    ->Args({1, 2})
    ->Args({8, 2})
    ->Apply(OncePerRepetition);

ATTN_BENCHMARK_MAIN();
