// Data-parallel training for attn-translate: `mpirun -np N attn-translate train ...` runs N copies
// of the trainer (ranks) that hold the same model. Every update, each rank reads the same batch
// (same seed, same order) and trains on its own share of the rows; the ranks then sum their
// gradients and loss statistics (attn/train/data_parallel.hpp), so the update is the one a
// single process would make on the whole batch. The gradient sums start during the last backward
// pass of each update, bucket by bucket as backward finishes them (--no-overlap-allreduce: after
// it); both give the same bits. --max-tokens stays the size of one update; with
// --max-tokens-per-rank it is one rank's share and an update is N times as large.
//
// Who does what:
//   rank 0      trains the vocabulary, writes checkpoints, curves, SVGs and the log, validates;
//   every rank  reads the data and the newest checkpoint (--resume) from the same model
//               directory, which must therefore be on a file system all machines share;
//   dropout     rank r draws from its own stream, rank_seed(seed, r) (rank 0: the seed itself), at
//               the counter all ranks share, so a checkpoint holds nothing rank-specific and
//               --resume with the same N continues bit-identically.
// An error on one rank during an update (NaN loss, bad batch) reaches every rank at the end of the
// update and each throws AgreedError with the failing rank's message (so does a gradient norm
// that is not finite after the sums: the same on every rank), which rank 0 prints; an error
// elsewhere (reading data, the vocabulary) prints the message with the rank and stops the job
// (MPI_Abort).
//
// This header needs no MPI: the base class Replicas is one process alone, and attn-translate
// built without MPI (or started without mpirun) uses only it.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include <attn/error.hpp>
#include <attn/nn/transformer.hpp>
#include <attn/train/label_smoothed_loss.hpp>

#include "batching.hpp"
#include "trainer.hpp"

namespace attn::translate {

/// An error every rank throws at the same point with the same message.
class AgreedError : public Error {
 public:
  using Error::Error;
};

/// The ranks of a training job, as one rank sees them. This base class is one process alone:
/// nothing to exchange, its share of a batch is the whole batch.
class Replicas {
 public:
  virtual ~Replicas() = default;
  virtual int rank() const { return 0; }
  virtual int size() const { return 1; }
  /// Returns when every rank has arrived (ranks > 0 wait here while rank 0 makes the vocabulary).
  virtual void barrier() {}
  /// Right after the ranks have joined, before any other exchange: checks that every rank has the
  /// flags that decide which exchanges it takes part in and when it stops (--resume, --steps,
  /// --minutes, --max-tokens and its per-rank switch, --no-overlap-allreduce), AgreedError
  /// otherwise (a --resume on rank 0 alone hung the job); then, with --max-tokens-per-rank, makes
  /// options.max_tokens the whole batch's.
  virtual void agree_on_flags(TrainOptions& /*options*/) {}
  /// Once the model is built or resumed: gives this rank its dropout stream and checks that every
  /// rank starts from the same parameters, training batches (`batches`: their fingerprint, which
  /// the trainer computed once; under --bpe-dropout also of the first epoch's pieces) and
  /// checkpoint metadata (configuration, vocabulary, training options) and training state
  /// (`state`, called only under mpirun: a fingerprint of the update count, data position,
  /// optimizer moments and dropout stream), AgreedError otherwise; agree_on_flags compared the
  /// stopping rules. Ranks that resumed other checkpoints of the same weights would stop at
  /// different updates (one waiting for the other's sums for ever) or drift apart.
  virtual void start(Transformer<float>& /*model*/, std::uint64_t /*batches*/,
                     const std::map<std::string, std::string>& /*metadata*/,
                     const std::function<std::uint64_t()>& /*state*/) {}
  /// Rank 0's `value` on every rank: decisions that must not differ (stop on wall time).
  virtual bool rank0_decides(bool value) { return value; }
  /// The largest `value` of any rank, on every rank: a signal that reached any rank stops them
  /// all after the same update (mpirun forwards Ctrl-C to each rank, not at the same instant).
  virtual int max_over_ranks(int value) { return value; }
  /// This rank's rows of `full`, trimmed to their own longest sentences; no rows at all when
  /// the batch has fewer rows than ranks. Valid until the next call.
  virtual const Batch& share(const Batch& full) { return full; }
  /// Called before the share of an update's last batch is taken: its backward pass finishes the
  /// gradients, so their sums may start during it.
  virtual void last_batch_of_update() {}
  /// After the backward passes of one update: sums the gradients over the ranks, keeps the
  /// dropout counters in step and returns the global statistics. If `error` is not empty on any
  /// rank, every rank throws AgreedError with the first failing rank's message instead.
  virtual LossStats finish_update(const LossStats& local, const std::string& error,
                                  Transformer<float>& /*model*/) {
    ATTN_CHECK(error.empty(), AgreedError, error);
    return local;
  }
  /// Whether this process should print `e`: always alone, on rank 0 only for an AgreedError. An
  /// error of this rank alone is printed here with the rank, and the job stops (MPI_Abort).
  virtual bool report_here(const std::exception& /*e*/) { return true; }
};

/// How a data-parallel job is run; no effect on one process alone.
struct ReplicaOptions {
  bool threads_given = false;        ///< --threads was given: keep it
  bool max_tokens_per_rank = false;  ///< --max-tokens is one rank's share (agree_on_flags)
  bool overlap_all_reduce = true;    ///< sum gradients during backward, not after it
};

/// Joins the MPI job when this process was started by mpirun and attn-translate was built with
/// MPI; one process alone otherwise. Adapts `options` to this rank: ranks > 0 are quiet and write
/// no SVGs; unless threads_given, threads = default_rank_threads(...), so that ranks x threads
/// do not oversubscribe (Replicas::agree_on_flags applies max_tokens_per_rank). Rank 0 prints the
/// layout (ranks x threads) on stderr, and a rank with more threads than the CPUs it is bound to
/// warns.
std::shared_ptr<Replicas> join_replicas(TrainOptions& options, const ReplicaOptions& replica);

/// Threads per rank unless --threads is given: the machine's `cores` shared among its
/// `local_ranks`, and no more than the `bound_cpus` the rank may run on (mpirun binds each rank,
/// by default to one core when it starts 1 or 2; 0: unknown), at least 1.
int default_rank_threads(int cores, int local_ranks, int bound_cpus);

/// The dropout seed of rank `rank`: `seed` itself on rank 0, so that a one-rank run is unchanged.
std::uint64_t rank_seed(std::uint64_t seed, int rank);

/// The rows of `full` that rank `rank` of `ranks` takes (rank, rank + ranks, ...), and their
/// longest source and target: the shape of its share.
struct ShareShape {
  std::vector<Index> rows;
  Index src_len = 0, tgt_len = 0;
};
ShareShape share_shape(const Batch& full, int rank, int ranks);

/// The rows of share_shape into `out`, padded only to their own longest source and target.
void share_batch(const Batch& full, int rank, int ranks, Batch& out);

/// What rank 0 prints, once, when an update takes `update_seconds` and Open MPI's mpirun would
/// kill the ranks too soon after passing a Ctrl-C on as SIGTERM: the ranks finish the update and
/// save a checkpoint first, and the kill would cut that off. `sigkill_timeout` is the value of
/// OMPI_MCA_odls_base_sigkill_timeout (nullptr or not a whole number of seconds: Open MPI's
/// default, 1 s; a value set in an MCA parameter file is not seen). Empty when the wait holds
/// two updates, the one under way and about as long again for the checkpoint.
std::string slow_update_warning(double update_seconds, const char* sigkill_timeout);

/// A 64-bit fingerprint of every key and value.
std::uint64_t fingerprint(const std::map<std::string, std::string>& metadata);

}  // namespace attn::translate
