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
// a model smaller than min_buckets buckets is cut into min_buckets (see Overlap). A bucket whose
// gradients lie in one range (all of a Transformer's) is summed there; the others are packed. A
// tied weight is listed once, so it is summed once. Buffers are allocated at construction
// (statistics and the overlapped sums: at the first step); later steps allocate nothing.
//
// Overlap with backward. all_reduce_gradients() sums every bucket after backward. The overlapped
// form (begin_overlapped, finish_overlapped) starts each bucket's sum during the last backward
// pass of an update, as soon as backward reports all of its members final (a gradient hook,
// nn/gradient_hook.hpp; reduce_during_backward() installs it on a Transformer). Each ring step is
// an MPI_Isend/MPI_Irecv pair, moved on with MPI_Test at every hook call (after each layer), so
// the sums of the top layers travel while the lower layers compute; finish_overlapped() waits for
// the rest. It runs the same buckets, steps, chunks and additions as the blocking form, so the
// gradients are the same bits. What it cannot hide: the shared (tied) embedding is used by the
// generator, the target and the source embedding, so backward finishes it last, and it is the
// largest tensor (base: 76 MB of 252 MB); its sum starts only when backward has ended. A small
// model (the 'small' preset: 30 MB) is cut into min_buckets = 4 buckets of at most a quarter of it,
// so its embedding (27% of it) is a bucket of its own and its layers' three overlap backward.
// Each in-flight bucket needs its own scratch (one piece of a ring message, DataParallelOptions::
// piece_bytes). Packed buckets share DataParallelOptions::packed_in_flight buffers: they start in
// bucket order on every rank, each once an earlier one's sum returns a buffer (nothing waits).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/nn/module.hpp"
#include "attn/train/gradient_buckets.hpp"
#include "attn/train/label_smoothed_loss.hpp"
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
                        DataParallelOptions options = {})
      : params_(std::move(params)), comm_(comm) {
    rank_ = detail::comm_rank(comm_);
    ranks_ = detail::comm_size(comm_);
    std::string invalid;  // this rank's own refusal, held until every rank knows of it
    try {
      plan(options);
    } catch (const Error& e) {
      invalid = e.what();
    }
    // Before any sum (ranks that differed hung, or made Open MPI 4.1's shared-memory transport
    // write past the ring's scratch: found with ASan).
    check_same_on_all_ranks_or_refuse(
        invalid.empty() ? bucket_layout_fingerprint(params_, buckets_, piece_) : 0, invalid,
        "gradient layout (parameter sizes, value type, bucket_bytes, min_buckets, piece_bytes or a "
        "refused option)",
        comm_);
  }
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return rank_; }
  int size() const { return ranks_; }
  /// The all-reduce calls one step makes.
  std::size_t buckets() const { return buckets_.size(); }
  /// The buckets whose gradients are copied into a buffer to be summed (0 for a Transformer,
  /// whose gradients lie in one buffer).
  std::size_t packed_buckets() const { return packed_order_.size(); }
  /// The buffers held for packed buckets: one from construction if any bucket packs, up to
  /// packed_in_flight from the first overlapped sum (on more than one rank).
  std::size_t packed_buffers() const { return packed_.size(); }

  /// Replaces every parameter gradient by its sum over the ranks (same bits on every rank).
  void all_reduce_gradients() {
    ATTN_CHECK(!overlapping_, StateError,
               "DataParallel::all_reduce_gradients: an overlapped sum is not finished");
    if (ranks_ == 1) return;
    for (const Bucket& b : buckets_) {
      if (!b.packs()) {
        ring_all_reduce(b.in_place, b.span, scratch_.data(), comm_, piece_);
        continue;
      }
      pack_bucket(b, params_, packed_[0].data());
      ring_all_reduce(packed_[0].data(), b.span, scratch_.data(), comm_, piece_);
      unpack_bucket(b, params_, packed_[0].data());
    }
  }

  // The overlapped form of all_reduce_gradients(), for the last backward pass of each update:
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
    bool same = listed.size() == params_.size();
    for (std::size_t i = 0; same && i < listed.size(); ++i)
      same = listed[i].grad.data() == params_[i].grad.data();
    ATTN_CHECK(same, ConfigError, "DataParallel::reduce_during_backward: the model lists ",
               listed.size(), " parameters, not the ", params_.size(),
               " this DataParallel was made with");
    model.set_gradient_hook([this](const std::vector<Index>& ids) { gradients_final(ids); });
  }

  /// The next gradients_final() calls come from the last backward pass of an update.
  void begin_overlapped() {
    ATTN_CHECK(!overlapping_, StateError,
               "DataParallel::begin_overlapped: the previous overlapped sum was not finished");
    if (flights_.size() != buckets_.size()) allocate_flights();
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      flights_[b].waiting = buckets_[b].members.size();
      flights_[b].ready = flights_[b].started = flights_[b].reduced = false;
    }
    std::fill(final_.begin(), final_.end(), 0);
    free_.resize(packed_.size());
    std::iota(free_.begin(), free_.end(), std::size_t{0});
    next_packed_ = 0;
    overlapping_ = true;
  }

  /// The hook: the gradients of params[ids] are final. Starts each bucket whose members are all
  /// final and moves every sum in flight on without waiting. Ignored outside begin/finish.
  void gradients_final(const std::vector<Index>& ids) {
    if (!overlapping_) return;
    for (Index id : ids) {
      ATTN_CHECK(id >= 0 && static_cast<std::size_t>(id) < params_.size(), IndexError,
                 "DataParallel::gradients_final: parameter index ", id, " outside [0, ",
                 params_.size(), ")");
      const auto i = static_cast<std::size_t>(id);
      ATTN_CHECK(!final_[i], StateError, "DataParallel::gradients_final: ", params_[i].name,
                 " reported final twice in one backward pass");
      final_[i] = 1;
      if (--flights_[bucket_of_[i]].waiting == 0) make_ready(bucket_of_[i]);
    }
    progress();
  }

  /// Starts the sum of every bucket not yet started, final or not: for a rank whose backward pass
  /// did not run to its end, so that the other ranks' rings complete.
  void start_remaining() {
    if (!overlapping_) return;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      flights_[b].ready = true;
      if (!flights_[b].started && !buckets_[b].packs()) start(b, buckets_[b].in_place);
    }
    start_packed_in_turn();
  }

  /// Waits for every sum, so each gradient holds its sum over the ranks. Throws StateError, on
  /// every rank alike, naming the parameters backward never reported final (their buckets' sums
  /// never started: a stage missing from the model's hook).
  void finish_overlapped() {
    ATTN_CHECK(overlapping_, StateError, "DataParallel::finish_overlapped: no begin_overlapped");
    overlapping_ = false;
    std::string missing;
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      if (!flights_[b].ready)
        for (std::size_t i : buckets_[b].members)
          if (!final_[i]) missing += (missing.empty() ? "" : ", ") + params_[i].name;
    // In bucket order, as every rank does: a packed bucket queued for a buffer gets one from a
    // sum before it, so it has started by the time its turn comes.
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (!flights_[b].started || flights_[b].reduced) continue;
      flights_[b].ring.wait();
      finish(b);
      if (buckets_[b].packs()) start_packed_in_turn();
    }
    const auto queued = std::count_if(flights_.begin(), flights_.end(),
                                      [](const Flight& f) { return f.ready && !f.started; });
    if (missing.empty()) {
      ATTN_CHECK(queued == 0, StateError, "DataParallel::finish_overlapped: ", queued,
                 " final buckets' sums never started (did starting them fail?)");
      return;
    }
    throw StateError(detail::concat(
        "DataParallel::finish_overlapped: backward never reported ", missing, " final, so ",
        missing.find(',') == std::string::npos ? "its" : "their",
        " sum over the ranks never started (does the model's backward call its gradient hook "
        "after every stage?)",
        queued == 0 ? ""
                    : detail::concat("; nor did the ", queued,
                                     " packed buckets after it, which start in turn")));
  }

  /// Buckets whose sum has started since begin_overlapped(); 0 outside begin/finish (for tests
  /// and diagnostics).
  std::size_t buckets_started() const {
    if (!overlapping_) return 0;
    std::size_t n = 0;
    for (const Flight& f : flights_) n += f.started;
    return n;
  }

  /// sum_over_ranks (replica_agreement.hpp) over this communicator: every rank's statistics
  /// summed, or ReplicaError with the first failing rank's message on every rank.
  LossStats all_reduce(const LossStats& local, const std::string& local_error = {}) const {
    return sum_over_ranks(local, local_error, comm_, all_stats_);
  }

 private:
  static constexpr int kFirstTag = 2;  // ring_all_reduce() uses tags 0 and 1

  using Bucket = GradientBucket<T>;

  // One bucket's overlapped sum.
  struct Flight {
    RingInFlight<T> ring;
    std::vector<T> scratch;   // [ring_scratch_values] one incoming piece
    std::size_t buffer = 0;   // packed_[buffer] holds a packed bucket's values while in flight
    std::size_t waiting = 0;  // members not yet final
    bool ready = false;       // members final (or start_remaining): may start, in turn if packed
    bool started = false, reduced = false;
  };

  void allocate_flights() {
    flights_ = std::vector<Flight>(buckets_.size());
    if (ranks_ == 1) return;  // nothing to send
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      flights_[b].scratch.assign(
          static_cast<std::size_t>(ring_scratch_values(buckets_[b].span, ranks_, piece_)), T(0));
    const std::size_t buffers = std::min(packed_in_flight_, packed_order_.size());
    if (buffers > packed_.size()) packed_.resize(buffers, packed_.front());
  }

  // Bucket b may start: its members are final. One summed in place starts at once; packed ones
  // start in turn.
  void make_ready(std::size_t b) {
    flights_[b].ready = true;
    if (buckets_[b].packs())
      start_packed_in_turn();
    else
      start(b, buckets_[b].in_place);
  }

  // Packed buckets start in bucket order, the same on every rank, each once it is ready, all before
  // it have started, and a buffer is free (finish() returns one and calls this again). Nothing
  // waits here: backward never stalls for a buffer.
  void start_packed_in_turn() {
    for (; next_packed_ < packed_order_.size(); ++next_packed_) {
      const std::size_t b = packed_order_[next_packed_];
      if (!flights_[b].ready) return;
      if (ranks_ == 1) {
        start(b, nullptr);
        continue;
      }
      if (free_.empty()) return;
      T* data = packed_[free_.back()].data();
      pack_bucket(buckets_[b], params_, data);
      start(b, data);  // if it throws, the buffer stays free and b unstarted
      flights_[b].buffer = free_.back();
      free_.pop_back();
    }
  }

  // Bucket b's ring starts on `data` (one tag per bucket: several run at once). On one rank the
  // gradients are their own sum.
  void start(std::size_t b, T* data) {
    Flight& f = flights_[b];
    if (ranks_ > 1)
      f.ring.start(data, buckets_[b].span, f.scratch.data(), comm_, kFirstTag + static_cast<int>(b),
                   piece_);
    f.started = true;
    f.reduced = ranks_ == 1;
  }

  // Every ring in flight takes the steps whose messages have arrived; the packed buckets queued
  // for a buffer start as finished ones return theirs.
  void progress() {
    bool freed = false;
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      if (flights_[b].started && !flights_[b].reduced && flights_[b].ring.progress()) {
        finish(b);
        freed = freed || buckets_[b].packs();
      }
    if (freed) start_packed_in_turn();
  }

  // Bucket b's ring is done: the sums go back into the gradients, and its buffer is free.
  void finish(std::size_t b) {
    Flight& f = flights_[b];
    if (buckets_[b].packs()) {
      unpack_bucket(buckets_[b], params_, packed_[f.buffer].data());
      free_.push_back(f.buffer);
    }
    f.reduced = true;
  }

  void plan_buckets(const DataParallelOptions& options) {
    Index total = 0;
    for (const auto& p : params_) total += p.grad.numel();
    buckets_ = plan_gradient_buckets(
        params_, bucket_capacity<T>(total, options.bucket_bytes, options.min_buckets));
    packed_in_flight_ = options.packed_in_flight;
    bucket_of_.assign(params_.size(), 0);
    final_.assign(params_.size(), 0);
    Index largest_packed = 0, largest = 0;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      for (std::size_t i : buckets_[b].members) bucket_of_[i] = b;
      if (buckets_[b].packs()) {
        packed_order_.push_back(b);
        largest_packed = std::max(largest_packed, buckets_[b].span);
      }
      largest = std::max(largest, buckets_[b].span);
    }
    if (!packed_order_.empty())
      packed_.assign(1, std::vector<T>(static_cast<std::size_t>(largest_packed), T(0)));
    scratch_.assign(static_cast<std::size_t>(ring_scratch_values(largest, ranks_, piece_)), T(0));
  }

  /// Checks the options and cuts the gradients into buckets: ConfigError, on this rank alone.
  void plan(const DataParallelOptions& options) {
    ATTN_CHECK(options.bucket_bytes >= sizeof(T), ConfigError,
               "DataParallel: bucket_bytes must hold one value, got ", options.bucket_bytes);
    ATTN_CHECK(options.min_buckets >= 1, ConfigError,
               "DataParallel: min_buckets must be at least 1, got ", options.min_buckets);
    ATTN_CHECK(options.piece_bytes >= sizeof(T), ConfigError,
               "DataParallel: piece_bytes must hold one value, got ", options.piece_bytes);
    ATTN_CHECK(options.packed_in_flight >= 1, ConfigError,
               "DataParallel: packed_in_flight must be at least 1, got ", options.packed_in_flight);
    piece_ = static_cast<Index>(
        std::min<std::size_t>(options.piece_bytes / sizeof(T), std::numeric_limits<int>::max()));
    plan_buckets(options);
    for (const Bucket& b : buckets_)  // refused here, not at the first sum inside backward's hook
      ATTN_CHECK(ranks_ == 1 || ring_chunks_fit(b.span, ranks_), ConfigError,
                 "DataParallel: the bucket of ", params_[b.members.front()].name, " (", b.span,
                 " values) makes ring chunks too large for one MPI message on ", ranks_,
                 " ranks; use more ranks or smaller parameters");
    const int tags = detail::max_tag(comm_) - kFirstTag + 1;
    ATTN_CHECK(buckets_.size() <= static_cast<std::size_t>(tags), ConfigError,
               "DataParallel: ", buckets_.size(), " buckets need more MPI tags than the ", tags,
               " this MPI offers; raise bucket_bytes");
  }

  std::vector<NamedParameter<T>> params_;
  MPI_Comm comm_;
  int rank_ = 0, ranks_ = 1;
  Index piece_ = kRingPieceValues;  // values per reduce-scatter message
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> packed_order_;  // the buckets that pack, ascending
  std::size_t packed_in_flight_ = 2;       // DataParallelOptions::packed_in_flight
  std::vector<std::vector<T>>
      packed_;                     // [buffers][largest packed bucket]; [0] for the blocking sum
  std::vector<std::size_t> free_;  // buffers no packed sum in flight holds
  std::size_t next_packed_ = 0;    // packed_order_[next_packed_] is the next to start
  std::vector<T> scratch_;         // [ring_scratch_values(largest bucket)] one piece
  mutable std::vector<double> all_stats_;  // [N, 4] every rank's statistics (sum_over_ranks)
  std::vector<std::size_t> bucket_of_;     // [params] the bucket of each parameter
  std::vector<Flight> flights_;            // [buckets] overlapped sums, from the first
  std::vector<char> final_;                // [params] reported final in this pass
  bool overlapping_ = false;               // between begin_overlapped and finish_overlapped
};

}  // namespace attn
