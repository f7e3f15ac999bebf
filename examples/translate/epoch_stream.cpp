#include "epoch_stream.hpp"

#include <attn/random.hpp>  // mix64

#include "training_pairs.hpp"

namespace attn::translate {

EpochStream::EpochStream(const SubwordVocab& vocab, const ParallelCorpus& pairs,
                         const BatchingOptions& batching, double bpe_dropout, std::uint64_t seed)
    : vocab_(vocab),
      pairs_(pairs),
      batching_(batching),
      bpe_dropout_(bpe_dropout),
      seed_(seed),
      whole_(tokenize_pairs(vocab, pairs, batching.max_len), batching),
      data_fingerprint_(fingerprint(whole_)) {
  ATTN_CHECK(whole_.size() > 0, DataError, "train: every one of the ", pairs.size(),
             " training pairs is longer than max_len ", batching.max_len, " subword tokens");
}

const Batch& EpochStream::next() {
  ATTN_CHECK(started_, InternalError, "EpochStream::next: no epoch started");
  if (batch_index_ >= order_.size()) start_epoch(epoch_ + 1);
  return epoch_batches().batches()[order_[batch_index_++]];
}

std::size_t EpochStream::start_epoch(std::uint64_t epoch) {
  // The pieces are a function of (seed, epoch): the epoch under way's are kept, not drawn again.
  const bool drawn = sampled_ && epoch == epoch_;
  started_ = true;
  epoch_ = epoch;
  batch_index_ = 0;
  if (bpe_dropout_ > 0 && !drawn) {
    // Its own stream: not the key of the epoch's batch order (Batcher::epoch_order).
    constexpr std::uint64_t kPiecesStream = 0x9e6c63d0676a9a99ULL;
    const std::uint64_t seed = mix64(mix64(seed_) ^ mix64(epoch ^ kPiecesStream));
    sampled_ = std::make_unique<Batcher>(
        tokenize_pairs(vocab_, pairs_, batching_.max_len, bpe_dropout_, seed), batching_);
  }
  order_ = epoch_batches().epoch_order(seed_, epoch_);
  return order_.size();
}

void EpochStream::seek(const DataPosition& p) {
  // restore_data_position has usually started the epoch already, to count its batches.
  if (!started_ || p.epoch != epoch_) start_epoch(p.epoch);
  ATTN_CHECK(p.batch <= order_.size(), InternalError, "EpochStream::seek: batch ", p.batch,
             " of epoch ", p.epoch, " is beyond its ", order_.size(), " batches");
  batch_index_ = p.batch;
}

std::uint64_t EpochStream::batches_fingerprint() const {
  return sampled_ ? mix64(data_fingerprint_) ^ fingerprint(*sampled_) : data_fingerprint_;
}

Index EpochStream::epoch_tokens() const {
  Index tokens = 0;
  for (const Batch& batch : whole_.batches()) tokens += batch.tgt_tokens;
  return tokens;
}

}  // namespace attn::translate
