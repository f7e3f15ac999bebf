// Token-count batching: pairs of similar length share a batch, and a batch holds at most
// max_tokens padded tokens, so every step costs about the same however long its sentences are
// (the paper's "approximately 25000 source tokens and 25000 target tokens" per batch).
//
// The cost of a batch of R rows is R * max(S, T), with S the longest source and T the longest
// target plus one (tgt_in carries BOS, tgt_out carries EOS). Batches are formed once, from the
// pairs ordered by (source length, target length, index); each epoch visits them in an order
// drawn from (seed, epoch) alone, so a resumed run sees the same batches in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <attn/tensor.hpp>

namespace attn::translate {

/// One sentence pair as subword ids, without BOS or EOS.
struct TokenizedPair {
  std::vector<TokenId> src;
  std::vector<TokenId> tgt;
  /// A side has too many bytes to be encoded within max_len tokens (bpe.hpp, too_long_to_encode):
  /// src and tgt are left empty and the pair counts as longer than max_len.
  bool overlong = false;

  /// Whether the pair is longer than max_len: overlong, or a source of more than max_len tokens,
  /// or a target that with BOS (or EOS) has more.
  bool longer_than(Index max_len) const {
    return overlong || static_cast<Index>(src.size()) > max_len ||
           static_cast<Index>(tgt.size()) + 1 > max_len;
  }
};

enum class OverlongPolicy {
  kReject,  ///< throw DataError naming the pair and the limit
  kSkip,    ///< leave the pair out and count it in Batcher::skipped()
};

struct BatchingOptions {
  Index max_tokens = 4096;  ///< per batch, R * max(S, T) <= max_tokens
  Index max_len = 256;      ///< source length and target length + 1 must not exceed it
  OverlongPolicy overlong = OverlongPolicy::kReject;
  TokenId pad_id = 0;
  TokenId bos_id = 2;
  TokenId eos_id = 3;
};

struct Batch {
  Tensor<TokenId> src;             // [B, S] source ids, padded with pad_id
  Tensor<TokenId> tgt_in;          // [B, T] BOS y_1 .. y_n, padded: the decoder's input
  Tensor<TokenId> tgt_out;         // [B, T] y_1 .. y_n EOS, padded: what the loss compares with
  std::vector<std::size_t> pairs;  ///< index of each row in the pairs given to the Batcher
  Index src_tokens = 0;            ///< non-pad source ids
  Index tgt_tokens = 0;            ///< non-pad ids of tgt_out (what the loss counts)

  Index rows() const { return src.size(0); }
};

class Batcher {
 public:
  /// Throws ConfigError if max_tokens < max_len (a pair of the allowed length would not fit
  /// alone), DataError for a pair with an empty source or, under kReject, an overlong pair.
  Batcher(const std::vector<TokenizedPair>& pairs, const BatchingOptions& options);

  const std::vector<Batch>& batches() const { return batches_; }
  std::size_t size() const { return batches_.size(); }
  std::size_t skipped() const { return skipped_; }

  /// The order in which epoch `epoch` visits the batches: a permutation that depends only on
  /// (seed, epoch).
  std::vector<std::size_t> epoch_order(std::uint64_t seed, std::uint64_t epoch) const;

  /// The batches of one epoch: for (const Batch& b : batcher.epoch(seed, e)).
  class Epoch {
   public:
    class iterator {
     public:
      iterator(const Batcher* b, const std::size_t* p) : batcher_(b), pos_(p) {}
      const Batch& operator*() const { return batcher_->batches_[*pos_]; }
      iterator& operator++() {
        ++pos_;
        return *this;
      }
      bool operator!=(const iterator& o) const { return pos_ != o.pos_; }

     private:
      const Batcher* batcher_;
      const std::size_t* pos_;
    };
    iterator begin() const { return {batcher_, order_.data()}; }
    iterator end() const { return {batcher_, order_.data() + order_.size()}; }
    const std::vector<std::size_t>& order() const { return order_; }

   private:
    friend class Batcher;
    Epoch(const Batcher* b, std::vector<std::size_t> order)
        : batcher_(b), order_(std::move(order)) {}
    const Batcher* batcher_;
    std::vector<std::size_t> order_;
  };
  Epoch epoch(std::uint64_t seed, std::uint64_t epoch) const {
    return Epoch(this, epoch_order(seed, epoch));
  }

 private:
  std::vector<Batch> batches_;
  std::size_t skipped_ = 0;
};

/// A 64-bit fingerprint of every batch's token ids, in batch order: what identifies the training
/// data in a checkpoint, and what the ranks of a job compare.
std::uint64_t fingerprint(const Batcher& batches);

/// Groups consecutive batches for gradient accumulation: returns [begin, end) ranges over
/// `tokens` (e.g. each batch's tgt_tokens) whose sums first reach `target`; the last range may
/// fall short. Throws ConfigError if target <= 0.
std::vector<std::pair<std::size_t, std::size_t>> group_batches(const std::vector<Index>& tokens,
                                                               Index target);

}  // namespace attn::translate
