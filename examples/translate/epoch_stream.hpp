// The training pairs as the trainer reads them: batches, epoch after epoch, each epoch in its own
// order (Batcher::epoch_order) and, under BPE-dropout, in its own pieces, with the position that a
// checkpoint stores and --resume returns to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "batching.hpp"
#include "bpe.hpp"
#include "corpus_io.hpp"

namespace attn::translate {

/// Where in the training data a run is, and a checkpoint stopped: the epoch and the index into
/// its batch order.
struct DataPosition {
  std::uint64_t epoch = 0;
  std::size_t batch = 0;
};

/// Starts nowhere: start_epoch or seek before the first next().
class EpochStream {
 public:
  /// Encodes `pairs` whole into batches of `batching` (overlong pairs skipped). `vocab` and
  /// `pairs` must outlive the stream. With `bpe_dropout` > 0 each epoch's pairs are
  /// encoded afresh with merges dropped, drawn from (seed, epoch). DataError if no pair is short
  /// enough.
  EpochStream(const SubwordVocab& vocab, const ParallelCorpus& pairs,
              const BatchingOptions& batching, double bpe_dropout, std::uint64_t seed);

  /// The next batch, starting the next epoch after the last batch of this one.
  const Batch& next();
  /// Moves to the start of `epoch`; returns its number of batches.
  std::size_t start_epoch(std::uint64_t epoch);
  /// Moves to `p`: to epoch p.epoch (started unless it is the one under way), then to its batch
  /// p.batch, which must be at most the epoch's count (restore_data_position checks it).
  void seek(const DataPosition& p);
  DataPosition position() const { return {epoch_, batch_index_}; }
  std::uint64_t epoch() const { return epoch_; }

  /// The epoch under way's batches: under BPE-dropout its own, else every epoch's.
  const Batcher& epoch_batches() const { return sampled_ ? *sampled_ : whole_; }
  /// The pairs encoded whole: every epoch's batches without BPE-dropout, and with it what
  /// identifies the data.
  const Batcher& whole_batches() const { return whole_; }
  /// Of whole_batches(): what a checkpoint stores, and --resume matches against the given data.
  std::uint64_t data_fingerprint() const { return data_fingerprint_; }
  /// What the ranks of a job compare: data_fingerprint(), and under BPE-dropout also the pieces of
  /// the epoch under way (each rank draws its own, and another sentencepiece would draw others).
  std::uint64_t batches_fingerprint() const;
  /// Target tokens of all of whole_batches(): the most one update may take.
  Index epoch_tokens() const;

 private:
  const SubwordVocab& vocab_;
  const ParallelCorpus& pairs_;
  BatchingOptions batching_;
  double bpe_dropout_;
  std::uint64_t seed_;
  Batcher whole_;
  std::uint64_t data_fingerprint_;
  std::unique_ptr<Batcher> sampled_;  // epoch_'s, under BPE-dropout (else null)
  bool started_ = false;
  std::uint64_t epoch_ = 0;
  std::size_t batch_index_ = 0;  // into order_
  std::vector<std::size_t> order_;
};

}  // namespace attn::translate
