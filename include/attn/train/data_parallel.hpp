// Data-parallel training over MPI: every rank holds the same model, computes the gradients of its
// own share of each batch, and the ranks sum their gradients before every optimiser step, so the
// update is the one a single process would make on the whole batch.
//
// This header needs MPI (link attn::mpi); the rest of attn needs only Eigen.
//
// Reduction order. Every sum is a ring all-reduce of our own (ring_all_reduce.hpp) whose additions
// run in a fixed order: the result depends only on the number of ranks N, is the same from run to
// run, and is the same bits on every rank, which MPI_Allreduce does not promise.
//
// Buckets (gradient_buckets.hpp): gradients are summed in buckets of about
// DataParallelOptions::bucket_bytes, in the order backward finishes them, one ring all-reduce each;
// a model smaller than min_buckets buckets is cut into min_buckets (overlapped_sums.hpp says why).
// A bucket whose gradients lie in one range (all of a Transformer's) is summed there; the others
// are packed. A tied weight is listed once, so it is summed once. Buffers are allocated at
// construction (statistics and the overlapped sums: at the first step); later steps allocate
// nothing.
//
// Overlap with backward. all_reduce_gradients() sums every bucket after backward. The overlapped
// form (begin_overlapped, finish_overlapped) starts each bucket's sum during the last backward
// pass of an update, as soon as backward reports all of its members final, and gives the same
// bits (OverlappedSums, overlapped_sums.hpp).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/nn/module.hpp"
#include "attn/train/gradient_buckets.hpp"
#include "attn/train/label_smoothed_loss.hpp"
#include "attn/train/overlapped_sums.hpp"
#include "attn/train/replica_agreement.hpp"
#include "attn/train/ring_all_reduce.hpp"

namespace attn {

struct DataParallelOptions {
  std::size_t bucket_bytes = std::size_t{32} << 20;  ///< gradients packed per all-reduce, at most
  std::size_t min_buckets = 4;  ///< buckets are at most 1/min_buckets of all gradients (>= 1)
  /// Values per message of the ring's reduce-scatter steps, in bytes: each sum in flight holds
  /// one such piece as scratch (kRingPieceValues of float by default).
  std::size_t piece_bytes = std::size_t{4} << 20;
  /// Packed buckets whose overlapped sums may be in flight at once, each in a buffer the size of
  /// the largest packed bucket (>= 1): more lets more of them overlap backward, fewer hold less
  /// memory. (A Transformer packs none.)
  std::size_t packed_in_flight = 2;
};

/// Sums gradients and loss statistics over the ranks of a communicator. Every rank constructs
/// it with the same model (the same parameter list) and calls its members in the same order. The
/// constructor is collective: it compares the layout every rank will sum.
/// The model's hook (reduce_during_backward) points at this object: it neither copies nor moves.
template <class T>
class DataParallel {
 public:
  explicit DataParallel(std::vector<NamedParameter<T>> params, MPI_Comm comm = MPI_COMM_WORLD,
                        DataParallelOptions options = {}) {
    g_.params = std::move(params);
    g_.comm = comm;
    rank_ = detail::comm_rank(comm);
    g_.ranks = detail::comm_size(comm);
    std::string invalid;  // this rank's own refusal, held until every rank knows of it
    try {
      plan(options);
    } catch (const Error& e) {
      invalid = e.what();
    }
    // Before any sum (ranks that differed hung, or made Open MPI 4.1's shared-memory transport
    // write past the ring's scratch: found with ASan).
    check_same_on_all_ranks_or_refuse(
        invalid.empty() ? bucket_layout_fingerprint(g_.params, g_.plan.buckets, g_.piece) : 0,
        invalid,
        "gradient layout (parameter sizes, value type, bucket_bytes, min_buckets, piece_bytes or a "
        "refused option)",
        comm);
  }
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return rank_; }
  int size() const { return g_.ranks; }
  /// The all-reduce calls one step makes.
  std::size_t buckets() const { return g_.plan.buckets.size(); }
  /// The buckets whose gradients are copied into a buffer to be summed (0 for a Transformer,
  /// whose gradients lie in one buffer).
  std::size_t packed_buckets() const { return g_.plan.packed.size(); }
  /// The buffers held for packed buckets: one from construction if any bucket packs, up to
  /// packed_in_flight from the first overlapped sum (on more than one rank).
  std::size_t packed_buffers() const { return g_.packed.size(); }

  /// Replaces every parameter gradient by its sum over the ranks (same bits on every rank).
  void all_reduce_gradients() {
    ATTN_CHECK(!overlapped_.active(), StateError,
               "DataParallel::all_reduce_gradients: an overlapped sum is not finished");
    if (g_.ranks == 1) return;
    for (const GradientBucket<T>& b : g_.plan.buckets) {
      if (!b.packs()) {
        ring_all_reduce(b.in_place, b.span, scratch_.data(), g_.comm, g_.piece);
        continue;
      }
      pack_bucket(b, g_.params, g_.packed[0].data());
      ring_all_reduce(g_.packed[0].data(), b.span, scratch_.data(), g_.comm, g_.piece);
      unpack_bucket(b, g_.params, g_.packed[0].data());
    }
  }

  // The overlapped form of all_reduce_gradients() (OverlappedSums), for the last backward pass of
  // each update:
  //   dp.reduce_during_backward(model);  // once
  //   dp.begin_overlapped();             // the next backward pass finishes the gradients
  //   model.backward(dlogits);           // each bucket's sum starts when its members are final
  //   dp.finish_overlapped();            // waits for the sums
  // Earlier backward passes of an update (gradient accumulation) report to nobody: the hook is
  // ignored outside begin/finish. A rank that runs no backward pass, or not to its end (an empty
  // share of the batch, an error), calls start_remaining() before finish_overlapped().

  /// Makes `model` (a Transformer, or anything with set_gradient_hook and parameters()) report
  /// finished gradients here during backward. model.parameters() must be the list this object
  /// was constructed with (ConfigError otherwise).
  template <class Model>
  void reduce_during_backward(Model& model) {
    const auto listed = model.parameters();
    bool same = listed.size() == g_.params.size();
    for (std::size_t i = 0; same && i < listed.size(); ++i)
      same = listed[i].grad.data() == g_.params[i].grad.data();
    ATTN_CHECK(same, ConfigError, "DataParallel::reduce_during_backward: the model lists ",
               listed.size(), " parameters, not the ", g_.params.size(),
               " this DataParallel was made with");
    model.set_gradient_hook([this](const std::vector<Index>& ids) { gradients_final(ids); });
  }

  /// OverlappedSums::begin: the next gradients_final() calls come from the last backward pass of
  /// an update.
  void begin_overlapped() { overlapped_.begin(); }
  /// OverlappedSums::gradients_final: the hook.
  void gradients_final(const std::vector<Index>& ids) { overlapped_.gradients_final(ids); }
  /// OverlappedSums::start_remaining: every sum not yet started starts, final or not.
  void start_remaining() { overlapped_.start_remaining(); }
  /// OverlappedSums::finish: waits for every sum (StateError naming what backward never reported).
  void finish_overlapped() { overlapped_.finish(); }
  /// Buckets whose sum has started since begin_overlapped(); 0 outside begin/finish (for tests
  /// and diagnostics).
  std::size_t buckets_started() const { return overlapped_.buckets_started(); }

  /// sum_over_ranks (replica_agreement.hpp) over this communicator: every rank's statistics
  /// summed, or ReplicaError with the first failing rank's message on every rank.
  LossStats all_reduce(const LossStats& local, const std::string& local_error = {}) const {
    return sum_over_ranks(local, local_error, g_.comm, all_stats_);
  }

 private:
  /// Checks the options, cuts the gradients into buckets and allocates the blocking sum's buffers:
  /// ConfigError, on this rank alone.
  void plan(const DataParallelOptions& options) {
    ATTN_CHECK(options.bucket_bytes >= sizeof(T), ConfigError,
               "DataParallel: bucket_bytes must hold one value, got ", options.bucket_bytes);
    ATTN_CHECK(options.min_buckets >= 1, ConfigError,
               "DataParallel: min_buckets must be at least 1, got ", options.min_buckets);
    ATTN_CHECK(options.piece_bytes >= sizeof(T), ConfigError,
               "DataParallel: piece_bytes must hold one value, got ", options.piece_bytes);
    ATTN_CHECK(options.packed_in_flight >= 1, ConfigError,
               "DataParallel: packed_in_flight must be at least 1, got ", options.packed_in_flight);
    g_.piece = static_cast<Index>(
        std::min<std::size_t>(options.piece_bytes / sizeof(T), std::numeric_limits<int>::max()));
    g_.packed_in_flight = options.packed_in_flight;
    Index total = 0;
    for (const auto& p : g_.params) total += p.grad.numel();
    g_.plan = plan_buckets(g_.params,
                           bucket_capacity<T>(total, options.bucket_bytes, options.min_buckets));
    for (const GradientBucket<T>& b : g_.plan.buckets)  // refused here, not inside backward's hook
      ATTN_CHECK(ring_chunks_fit(b.span, g_.ranks), ConfigError, "DataParallel: the bucket of ",
                 g_.params[b.members.front()].name, " (", b.span,
                 " values) makes ring chunks too large for one MPI message on ", g_.ranks,
                 " ranks; use more ranks or smaller parameters");
    const std::size_t tags = OverlappedSums<T>::max_buckets(g_.comm);
    ATTN_CHECK(g_.plan.buckets.size() <= tags, ConfigError,
               "DataParallel: ", g_.plan.buckets.size(), " buckets need more MPI tags than the ",
               tags, " this MPI offers; raise bucket_bytes");
    if (!g_.plan.packed.empty())
      g_.packed.assign(1, std::vector<T>(static_cast<std::size_t>(g_.plan.largest_packed), T(0)));
    scratch_.assign(
        static_cast<std::size_t>(ring_scratch_values(g_.plan.largest, g_.ranks, g_.piece)), T(0));
  }

  SummedGradients<T> g_;
  int rank_ = 0;
  std::vector<T> scratch_;                 // [ring_scratch_values(largest bucket)] one piece
  mutable std::vector<double> all_stats_;  // [N, 4] every rank's statistics (sum_over_ranks)
  OverlappedSums<T> overlapped_{g_};
};

}  // namespace attn
