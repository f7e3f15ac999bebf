// Transformer: the whole encoder-decoder model of the paper (Figure 1).
//
//   memory = Encoder(Dropout(src_embed(src) * sqrt(D) + PE))
//   h      = Decoder(Dropout(tgt_embed(tgt_in) * sqrt(D) + PE), memory)
//   logits = h W^T                      (pre-softmax projection, W [V, D], no bias)
//
// With share_embeddings (the paper's setting) src_embed, tgt_embed and the projection are one
// matrix, listed once by parameters() as "src_embed.weight"; its gradient is the sum of all three
// uses. Layer parameters carry torch.nn.Transformer's state_dict names ("encoder.layers.0.
// self_attn.in_proj_weight", ...). Padding ids (config.pad_id) in the source are never attended;
// the decoder attends causally and never to target padding.
//
// Backward can report the parameters it has finished as it goes (set_gradient_hook,
// gradient_hook.hpp), so that a data-parallel trainer sums them during the rest of backward.
#pragma once

#include <memory>
#include <vector>

#include "attn/mask.hpp"
#include "attn/nn/decoder.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/embedding.hpp"
#include "attn/nn/embedding_sum.hpp"
#include "attn/nn/encoder.hpp"
#include "attn/nn/gradient_hook.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/scored_positions.hpp"
#include "attn/nn/transformer_config.hpp"

namespace attn {

template <class T>
class Transformer : public Module<T> {
  // Declared first so that it is validated before any member is built from it.
  TransformerConfig config_;

 public:
  explicit Transformer(const TransformerConfig& config)
      : config_(checked(config)),
        src_embed(config.src_vocab, config.d_model, config.pad_id),
        tgt_embed(config.tgt_vocab, config.d_model, config.pad_id),
        encoder(config.layer_options(), config.encoder_layers, config.norm_first),
        decoder(config.layer_options(), config.decoder_layers, config.norm_first),
        generator(config.d_model, config.tgt_vocab, /*with_bias=*/false),
        src_dropout(config.dropout),
        tgt_dropout(config.dropout),
        random_state_(std::make_shared<RandomState>()) {
    this->register_module("src_embed", &src_embed);
    this->register_module("tgt_embed", &tgt_embed);
    if (config_.learned_positions) {
      this->register_module("src_pos", src_input_.learned_positions());
      this->register_module("tgt_pos", tgt_input_.learned_positions());
    }
    this->register_module("encoder", &encoder);
    this->register_module("decoder", &decoder);
    this->register_module("generator", &generator);
    this->register_module("src_dropout", &src_dropout);
    this->register_module("tgt_dropout", &tgt_dropout);
    reset_parameters(config_.seed);
    this->gather_gradients();  // after the ties: a data-parallel sum reduces runs in place
  }

  /// Re-initialises every parameter from `seed` (Xavier for matrices, N(0, D^-1/2) embeddings),
  /// re-ties shared weights and restarts the dropout stream at (seed, 0).
  void reset_parameters(std::uint64_t seed) {
    Rng rng(seed);
    src_embed.reset_parameters(rng);
    tgt_embed.reset_parameters(rng);
    if (config_.learned_positions) {
      src_input_.learned_positions()->reset_parameters(rng);
      tgt_input_.learned_positions()->reset_parameters(rng);
    }
    encoder.reset_parameters(rng);
    decoder.reset_parameters(rng);
    generator.reset_parameters(rng);
    if (config_.share_embeddings) tgt_embed.weight.tie_to(src_embed.weight);
    if (config_.share_embeddings || config_.tie_output) generator.weight.tie_to(tgt_embed.weight);
    random_state_->seed = seed;
    random_state_->counter = 0;
    this->set_random_state(random_state_);
  }

  const TransformerConfig& config() const { return config_; }
  /// The (seed, counter) every dropout draws from; checkpoints save and restore it.
  RandomState& random_state() { return *random_state_; }

  /// src [B, S] -> memory [B, S, D]. Keeps the source padding mask for decode().
  const Tensor<T>& encode(const Tensor<TokenId>& src) {
    ATTN_CHECK(src.rank() == 2 && src.size(0) > 0 && src.size(1) > 0, ShapeError,
               "Transformer::encode: expected non-empty source ids [B, S], got ", src.shape());
    src_padding_.assign_tokens(src, config_.pad_id);
    return encoder.forward(src_input_.forward(src), src_padding_);
  }

  /// tgt_in [B, T] (BOS + y) over `memory` -> logits [B, T, V]. Call after encode() of the batch.
  const Tensor<T>& decode(const Tensor<TokenId>& tgt_in, const Tensor<T>& memory) {
    scoring_ = false;
    return generator.forward(decoder_output(tgt_in, memory));
  }

  /// The training forward: logits [B, T, V] of tgt_in given src.
  const Tensor<T>& forward(const Tensor<TokenId>& src, const Tensor<TokenId>& tgt_in) {
    check_pair(src, tgt_in, "forward");
    return decode(tgt_in, encode(src));
  }

  /// The training forward where only the scored positions are projected onto the vocabulary:
  /// logits [n, V] at the n positions where tgt_out [B, T] is not padding (row-major order), whose
  /// targets are scored_targets() [n]. The padding rows skip the projection, the loss and their
  /// backward. The logits are forward()'s rows at those positions, and backward(dlogits [n, V])
  /// after it gives the gradients of forward()'s backward with zero dlogits at padding: to the last
  /// bit on attn's own GEMM once n >= 16 (kernels/gemm.hpp; fewer rows take another kernel), and
  /// the loss's too when V is a multiple of 16 (its rows then start alike for Eigen's SIMD).
  const Tensor<T>& forward_scored(const Tensor<TokenId>& src, const Tensor<TokenId>& tgt_in,
                                  const Tensor<TokenId>& tgt_out) {
    check_pair(src, tgt_in, "forward_scored");
    ATTN_CHECK(tgt_out.shape() == tgt_in.shape(), ShapeError,
               "Transformer::forward_scored: expected tgt_out of tgt_in's shape ", tgt_in.shape(),
               ", got ", tgt_out.shape());
    const Tensor<T>& h = decoder_output(tgt_in, encode(src));
    scored_.select(tgt_out, config_.pad_id);
    scoring_ = true;
    return generator.forward(scored_.gather(h));
  }
  /// The targets of forward_scored()'s logits, [n].
  const Tensor<TokenId>& scored_targets() const { return scored_.targets(); }

  /// dlogits [B, T, V] (or [n, V] after forward_scored) -> accumulates every parameter gradient
  /// (shared weights get the sum).
  /// With a gradient hook, calls it after each stage of backward_stages().
  void backward(const Tensor<T>& dlogits) {
    std::size_t stage = 0;
    auto finished = [this, &stage] {
      if (!gradient_hook_) return;
      ATTN_ASSERT(stage < final_by_stage_.size());
      gradient_hook_(final_by_stage_[stage++]);
    };
    ATTN_CHECK(!scoring_ || (dlogits.rank() == 2 && dlogits.size(0) == scored_.count()), ShapeError,
               "Transformer::backward: after forward_scored, expected dlogits [", scored_.count(),
               ", ", config_.tgt_vocab, "] (the scored positions), got ", dlogits.shape());
    const Tensor<T>& dh = scoring_ ? scored_.scatter(generator.backward(dlogits), decoder_shape_)
                                   : generator.backward(dlogits);
    finished();
    tgt_input_.backward(decoder.backward(dh, finished));
    finished();
    src_input_.backward(encoder.backward(decoder.dmemory(), finished));
    finished();
    ATTN_ASSERT(!gradient_hook_ || stage == final_by_stage_.size());
  }

  /// Makes every backward call `hook` after each of its stages with the indices, into
  /// parameters(), of the parameters that stage finished (gradient_hook.hpp); an empty hook
  /// turns it off. The stages, in order: the generator; the decoder's final norm (pre-norm) and
  /// its layers from the last to the first; the target embedding (with its learned positions);
  /// the encoder's final norm and layers from the last to the first; the source embedding. With
  /// share_embeddings the one embedding matrix is used by the generator and both embeddings, so
  /// it is reported last, after the source embedding: it is also the largest tensor.
  void set_gradient_hook(GradientHook hook) {
    final_by_stage_ = hook ? final_parameters_by_stage<T>(*this, backward_stages())
                           : std::vector<std::vector<Index>>{};
    gradient_hook_ = std::move(hook);
  }

  /// The modules of each stage of backward, in the order it runs them.
  std::vector<BackwardStage<T>> backward_stages() const {
    std::vector<BackwardStage<T>> stages{{&generator}};
    for (auto& s : decoder.backward_stages()) stages.push_back(std::move(s));
    stages.push_back({tgt_input_.learned_positions(), &tgt_embed});
    for (auto& s : encoder.backward_stages()) stages.push_back(std::move(s));
    stages.push_back({src_input_.learned_positions(), &src_embed});
    return stages;
  }

  /// Incremental decoding (eval mode): logits [B, 1, V] of the next token after `tokens` [B, 1]
  /// at position `position`, attending the cached keys/values of earlier steps. encode() must
  /// have run on the batch whose memory is given.
  const Tensor<T>& decode_step(const Tensor<TokenId>& tokens, Index position,
                               const Tensor<T>& memory, DecoderCache<T>& cache) {
    ATTN_CHECK(tokens.rank() == 2 && tokens.size(1) == 1, ShapeError,
               "Transformer::decode_step: expected tokens [B, 1], got ", tokens.shape());
    // The step's key and value go to the cache's next slot: any other position gave its token a
    // position its key does not have (and a huge one grew the positional table until memory ran
    // out, or overflowed).
    ATTN_CHECK(position == cache.length(), IndexError, "Transformer::decode_step: position ",
               position, " is not the cache's next position, ", cache.length(),
               " (steps decode positions 0, 1, 2, ... in order)");
    scoring_ = false;
    return generator.forward(
        decoder.forward_step(tgt_input_.forward(tokens, position), memory, src_padding_, cache));
  }

  /// The key/value cache for decoding `batch` rows over at most `max_len` positions
  /// (decoder.make_cache), with the target positional table grown to max_len too: its doublings
  /// would otherwise allocate at steps 2, 4, 8 ... (tests/test_allocation.cpp).
  DecoderCache<T> make_decoder_cache(Index batch, Index max_len) {
    tgt_input_.reserve_positions(max_len);
    return decoder.make_cache(batch, max_len);
  }

  /// The source padding mask of the last encode() ([B, S], real tokens attended).
  const KeyPaddingMask& source_padding() const { return src_padding_; }
  /// Replaces the source padding mask, for decoding over a memory whose rows were rearranged
  /// (beam search repeats each source row once per beam).
  void set_source_padding(KeyPaddingMask mask) { src_padding_ = std::move(mask); }

  Embedding<T> src_embed;  // "src_embed.weight" [V, D]
  Embedding<T> tgt_embed;  // "tgt_embed.weight" [V, D], tied to src_embed when shared
  Encoder<T> encoder;      // "encoder.layers.{i}...."
  Decoder<T> decoder;      // "decoder.layers.{i}...."
  Linear<T> generator;     // "generator.weight" [V, D], tied to tgt_embed unless untied

 private:
  static const TransformerConfig& checked(const TransformerConfig& c) {
    c.validate();
    check_config_limits(c);  // what the model-file reader would refuse, before any allocation
    return c;
  }

  Index learned_max_positions() const {
    return config_.learned_positions ? config_.max_positions : 0;
  }

  static void check_pair(const Tensor<TokenId>& src, const Tensor<TokenId>& tgt_in,
                         const char* what) {
    ATTN_CHECK(src.rank() == 2 && tgt_in.rank() == 2 && src.size(0) == tgt_in.size(0), ShapeError,
               "Transformer::", what, ": expected src [B, S] and tgt_in [B, T] with one B, got ",
               src.shape(), " and ", tgt_in.shape());
  }

  /// The decoder's output h [B, T, D] for tgt_in over `memory` (decode() before the projection).
  const Tensor<T>& decoder_output(const Tensor<TokenId>& tgt_in, const Tensor<T>& memory) {
    ATTN_CHECK(tgt_in.rank() == 2 && tgt_in.size(1) > 0, ShapeError,
               "Transformer::decode: expected non-empty target ids [B, T], got ", tgt_in.shape());
    ATTN_CHECK(memory.rank() == 3 && memory.size(0) == tgt_in.size(0), ShapeError,
               "Transformer::decode: expected memory [", tgt_in.size(0), ", S, ", config_.d_model,
               "] for ", tgt_in.size(0), " target rows, got ", memory.shape());
    tgt_padding_.assign_tokens(tgt_in, config_.pad_id);
    const Tensor<T>& h =
        decoder.forward(tgt_input_.forward(tgt_in), memory, tgt_padding_, src_padding_);
    decoder_shape_ = h.shape();
    return h;
  }

  Dropout<T> src_dropout;  // on embedding + position sums
  Dropout<T> tgt_dropout;
  // Dropout(embedding + positions): the encoder's and the decoder's inputs.
  EmbeddingSum<T> src_input_{src_embed, src_dropout, config_.d_model, learned_max_positions()};
  EmbeddingSum<T> tgt_input_{tgt_embed, tgt_dropout, config_.d_model, learned_max_positions()};
  std::shared_ptr<RandomState> random_state_;
  KeyPaddingMask src_padding_;                      // [B, S] of the last encode()
  KeyPaddingMask tgt_padding_;                      // [B, T] of the last decode()
  Shape decoder_shape_;                             // [B, T, D] of the decoder's last output
  ScoredPositions<T> scored_;                       // of the last forward_scored()
  bool scoring_ = false;                            // whether the last forward was that
  GradientHook gradient_hook_;                      // empty unless set_gradient_hook
  std::vector<std::vector<Index>> final_by_stage_;  // [stage] parameters() indices it finishes
};

}  // namespace attn
