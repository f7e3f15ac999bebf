// What every decoding strategy (greedy.hpp, beam_search.hpp) shares: its options, the output length
// limit each source row allows, and running the model in evaluation mode.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "attn/error.hpp"
#include "attn/kernels/gemm.hpp"
#include "attn/nn/layer_options.hpp"
#include "attn/nn/module.hpp"
#include "attn/nn/transformer_config.hpp"
#include "attn/parallel.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct DecodeOptions {
  /// Upper bounds, so that lengths and beam rows never overflow and the key/value caches stay a
  /// size that can be allocated: the paper decodes with +50 tokens and 4 beams.
  static constexpr Index kMaxExtraLength = 4096;
  static constexpr Index kMaxBeamSize = 256;

  TokenId bos = 2;              // first decoder input
  TokenId eos = 3;              // ends a hypothesis (not part of the returned tokens)
  Index max_extra_length = 50;  // output length limit = source length + 50 (the paper, 6.1)
  Index beam_size = 4;          // W, the paper's beam (beam_search only)
  double length_penalty = 0.6;  // alpha of GNMT's ((5 + |Y|) / 6)^alpha (beam_search only)

  void validate(Index vocab) const {
    ATTN_CHECK(vocab >= 1 && vocab <= ConfigLimits::kMaxVocab, ConfigError,
               "decode: the vocabulary size must be in [1, ", ConfigLimits::kMaxVocab, "], got ",
               vocab);
    ATTN_CHECK(bos >= 0 && bos < vocab && eos >= 0 && eos < vocab, ConfigError, "decode: bos (",
               bos, ") and eos (", eos, ") must be in the vocabulary [0, ", vocab, ")");
    ATTN_CHECK(max_extra_length >= 0 && max_extra_length <= kMaxExtraLength, ConfigError,
               "decode: max_extra_length must be in [0, ", kMaxExtraLength, "], got ",
               max_extra_length);
    ATTN_CHECK(beam_size >= 1 && beam_size <= kMaxBeamSize, ConfigError,
               "decode: beam_size must be in [1, ", kMaxBeamSize, "], got ", beam_size);
    ATTN_CHECK(std::isfinite(length_penalty) && length_penalty >= 0, ConfigError,
               "decode: length_penalty must be finite and >= 0, got ", length_penalty);
  }
  /// As validate(vocab), for a model whose padding id is `pad_id`: a BOS equal to it would be
  /// attended while decoding but masked by the model's forward(), which then scores another model.
  void validate(Index vocab, TokenId pad_id) const {
    validate(vocab);
    ATTN_CHECK(pad_id >= 0 && pad_id < vocab, ConfigError, "decode: the padding id (", pad_id,
               ") must be in the vocabulary [0, ", vocab, ")");
    ATTN_CHECK(bos != pad_id, ConfigError, "decode: bos (", bos,
               ") must not be the model's padding id (", pad_id,
               "): forward() masks the padding token as a key, decoding would attend it");
  }
};

namespace detail {

/// Non-padding tokens of each source row: the length that bounds its output. ShapeError unless
/// src is a non-empty [B, S] (the decoders take the longest of these lengths first).
inline std::vector<Index> source_lengths(const Tensor<TokenId>& src, TokenId pad) {
  ATTN_CHECK(src.rank() == 2 && src.size(0) > 0 && src.size(1) > 0, ShapeError,
             "decode: expected non-empty source ids [B, S], got ", src.shape());
  std::vector<Index> len(static_cast<std::size_t>(src.size(0)), 0);
  for (Index b = 0; b < src.size(0); ++b)
    for (Index s = 0; s < src.size(1); ++s) len[static_cast<std::size_t>(b)] += src(b, s) != pad;
  return len;
}

/// NumericError unless the V logits at `row` (sentence `sentence`, step `step`) are all finite. A
/// model whose weights are finite but whose activations overflow (every embedding 3e38) gave NaN
/// scores, which greedy decoding took for the padding token and beam search sorted with a
/// comparison that is then no strict weak order: empty translations, exit 0 (session 41).
template <class T>
void check_finite_logits(const T* row, Index V, Index sentence, Index step) {
  for (Index v = 0; v < V; ++v)
    ATTN_CHECK(std::isfinite(row[v]), NumericError, "decode: the logit of token ", v,
               " for sentence ", sentence, " at step ", step, " is ",
               std::isnan(row[v]) ? "NaN"
               : row[v] > 0       ? "+inf"
                                  : "-inf",
               ": the model's activations overflow (are its weights too large?)");
}

/// Whether decoding may output `token` of a model whose padding id is `pad`: every token but the
/// padding one (unless it is also EOS). forward() masks the padding token as a key, so a hypothesis
/// holding it would be scored by another model than the one that chose its next tokens; and it is
/// never a training target (label smoothing gives it only its eps / V), so a model that has learnt
/// little may still rank it first (a tied output layer gives it a logit of exactly 0). fairseq's
/// generator masks it the same way.
inline bool may_output(TokenId token, TokenId pad, const DecodeOptions& opts) {
  return token != pad || token == opts.eos;
}

/// The output length limit of each source row of `src` [B, S]: its length + max_extra_length.
inline std::vector<Index> output_limits(const Tensor<TokenId>& src, TokenId pad,
                                        const DecodeOptions& opts) {
  std::vector<Index> limit = source_lengths(src, pad);
  for (Index& l : limit) l += opts.max_extra_length;
  return limit;
}

/// The memory a decoding call holds at its largest, and what this process may have, in bytes.
struct DecodeMemory {
  double caches = 0;     // the key/value caches (and beam search's memory repeated per beam row)
  double buffers = 0;    // the other buffers that grow with the batch (0: caches only counted)
  double available = 0;  // memory_limit_bytes(); 0 if the system does not say
  double total() const { return caches + buffers; }
  bool fits() const { return available <= 0 || total() <= available; }
};

/// The caches decoding `sentences` sources of `src_len` tokens into outputs of up to `max_len`
/// holds at their largest, in elements of `element_bytes`, for a decoder of `layers` layers of
/// width `d_model`. Greedy decoding: per sentence, each layer's self-attention keys and values for
/// max_len positions and its cross-attention's for src_len. Beam search of `beam_size` rows per
/// sentence: the same for the first step's sentence rows; for the beam rows, also the staging copy
/// KVCache::reorder keeps (a third array), and the memory repeated per beam row. Checked before
/// the caches are allocated: a batch times a beam times the output length can ask for more than
/// the machine holds (beam 256 over 32 sentences with +4096 tokens is hundreds of GiB for a base
/// model), and an allocation that large either throws std::bad_alloc, which names nothing, or is
/// granted page by page until the kernel's OOM killer ends the process. The overload below, for
/// a whole model, adds the other buffers.
inline DecodeMemory decode_memory(Index layers, Index d_model, Index sentences, bool beam_search,
                                  Index beam_size, Index src_len, Index max_len,
                                  std::size_t element_bytes) {
  const double row = static_cast<double>(element_bytes) * static_cast<double>(d_model);
  const double per_layer_row =
      2 * row * (static_cast<double>(max_len) + static_cast<double>(src_len));
  const double n = static_cast<double>(sentences), beams = n * static_cast<double>(beam_size);
  DecodeMemory m;
  m.caches = static_cast<double>(layers) * per_layer_row * n;
  if (beam_search)
    m.caches += static_cast<double>(layers) * per_layer_row * 1.5 * beams +
                beams * static_cast<double>(src_len) * row;
  m.available = memory_limit_bytes();
  return m;
}

/// decode_memory's caches for the decoder of `c`, and in `buffers` the rest of what decoding holds
/// that grows with the batch: with e = element_bytes, n = sentences * src_len source positions and
/// R decoder rows (sentences, or sentences * beam_size for beam search),
///   encoder  e n (encoder_layers (10 D + F + H + 4) + 3 D): every layer keeps its buffers for
///            backward, eval mode too: the packed Q|K|V (3 D), the heads and out_proj's output
///            (2 D), the log-sum-exp (H), two residual sums and norm outputs (4 D) with their row
///            statistics (4), the feed-forward's hidden layer (F) and output (D); the embedding,
///            its sum with the positions and a final norm (3 D)
///   decoder  e R (decoder_layers (15 D + F + 2 H + 6) + 3 D): the same for one position of three
///            sublayers (the cross-attention's query, heads and output instead of Q|K|V)
///   logits   e R V, the generator's output of a step
///   beams    3 R max_len sizeof(TokenId) for the hypotheses, their next copy and the finished
///            ones, and 16 W V for the candidates of a sentence (beam search only).
/// Against the maximum resident set (/usr/bin/time -v) less a batch of one's, float: greedy, base
/// preset, V 8000, 512 sentences of 30 tokens + 50: 3.97 GiB estimated, 4.02 measured (the caches
/// alone 1.29); small preset, 1024 x (20 + 10): 1.26 and 1.25; beam 4, base, 64 x (30 + 50):
/// 1.53 and 1.51; tiny preset, 2000 x 64: 1.09 and 1.06. The caches alone were a third or less of
/// a greedy call's peak.
inline DecodeMemory decode_memory(const TransformerConfig& c, Index sentences, bool beam_search,
                                  Index beam_size, Index src_len, Index max_len,
                                  std::size_t element_bytes) {
  DecodeMemory m = decode_memory(c.decoder_layers, c.d_model, sentences, beam_search, beam_size,
                                 src_len, max_len, element_bytes);
  const auto f = [](Index x) { return static_cast<double>(x); };
  const double e = static_cast<double>(element_bytes), D = f(c.d_model), F = f(c.d_ff),
               H = f(c.heads), V = f(c.tgt_vocab);
  const double W = beam_search ? f(beam_size) : 1.0, n = f(sentences) * f(src_len),
               rows = f(sentences) * W;
  const double encoder = e * n * (f(c.encoder_layers) * (10 * D + F + H + 4) + 3 * D);
  const double decoder = e * rows * (f(c.decoder_layers) * (15 * D + F + 2 * H + 6) + 3 * D);
  const double logits = e * rows * V;
  const double beams = beam_search ? 3 * rows * f(max_len) * sizeof(TokenId) + 16 * W * V : 0.0;
  m.buffers = encoder + decoder + logits + beams;
  return m;
}

/// ConfigError unless `m` fits in what this process may have, naming the sizes of the call and
/// ending with `remedy`, what to lower (a program names its flags).
inline void check_decode_memory(const DecodeMemory& m, Index sentences, bool beam_search,
                                Index beam_size, Index src_len, Index max_len, const char* remedy) {
  const double gib = std::ldexp(1.0, 30);
  ATTN_CHECK(m.fits(), ConfigError, "decode: ", sentences, " sentences x ",
             beam_search ? beam_size : 1, " beam rows, sources of up to ", src_len,
             " tokens and outputs of up to ", max_len, " need ", m.total() / gib, " GiB ",
             m.buffers > 0 ? detail::concat("(", m.caches / gib, " GiB of key/value caches, ",
                                            m.buffers / gib, " of activations and logits)")
                           : std::string("of key/value caches"),
             ", more than the ", m.available / gib, " GiB this process may have: ", remedy);
}

/// What check_decode_memory tells a caller of the library to lower.
inline constexpr const char* kDecodeMemoryRemedy =
    "decode fewer sentences at a time, or lower beam_size or max_extra_length";

/// check_decode_memory of the caches only, as decode_memory(layers, d_model, ...) counts them: a
/// lower bound, for a caller that knows only the decoder's sizes (the overload below counts all).
inline void check_decode_memory(Index layers, Index d_model, Index sentences, bool beam_search,
                                Index beam_size, Index src_len, Index max_len,
                                std::size_t element_bytes,
                                const char* remedy = kDecodeMemoryRemedy) {
  check_decode_memory(decode_memory(layers, d_model, sentences, beam_search, beam_size, src_len,
                                    max_len, element_bytes),
                      sentences, beam_search, beam_size, src_len, max_len, remedy);
}

/// check_decode_memory of everything decoding with a model of configuration `c` holds.
inline void check_decode_memory(const TransformerConfig& c, Index sentences, bool beam_search,
                                Index beam_size, Index src_len, Index max_len,
                                std::size_t element_bytes,
                                const char* remedy = kDecodeMemoryRemedy) {
  check_decode_memory(
      decode_memory(c, sentences, beam_search, beam_size, src_len, max_len, element_bytes),
      sentences, beam_search, beam_size, src_len, max_len, remedy);
}

/// Puts `model` in eval mode for the lifetime of the guard, then restores its mode; keeps packed
/// weights meanwhile (kernels::ConstantWeightsScope).
template <class T>
class EvalGuard {
 public:
  explicit EvalGuard(Module<T>& m) : m_(m), was_training_(m.is_training()) { m_.eval(); }
  ~EvalGuard() { m_.train(was_training_); }
  EvalGuard(const EvalGuard&) = delete;
  EvalGuard& operator=(const EvalGuard&) = delete;

 private:
  Module<T>& m_;
  bool was_training_;
  // Decoding never changes a weight: each is packed for the products once per call, not per step.
  kernels::ConstantWeightsScope packed_weights_;
};

}  // namespace detail
}  // namespace attn
