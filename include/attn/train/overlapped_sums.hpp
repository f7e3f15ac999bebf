// The overlapped gradient sums of data-parallel training (data_parallel.hpp, whose
// begin_overlapped, gradients_final, start_remaining and finish_overlapped are this class's).
//
// Each bucket's sum starts during the last backward pass of an update, as soon as backward reports
// all of its members final (a gradient hook, nn/gradient_hook.hpp; DataParallel::
// reduce_during_backward installs it on a Transformer). Each ring step is an MPI_Isend/MPI_Irecv
// pair, moved on with MPI_Test at every hook call (after each layer), so the sums of the top layers
// travel while the lower layers compute; finish() waits for the rest. It runs the same buckets,
// steps, chunks and additions as the blocking sum, so the gradients are the same bits.
//
// What it cannot hide: the shared (tied) embedding is used by the generator, the target and the
// source embedding, so backward finishes it last, and it is the largest tensor (base: 76 MB of
// 252 MB); its sum starts only when backward has ended. A small model (the 'small' preset: 30 MB)
// is cut into min_buckets = 4 buckets of at most a quarter of it, so its embedding (27% of it) is a
// bucket of its own and its layers' three overlap backward.
//
// Each bucket in flight needs its own scratch (one piece of a ring message). Packed buckets share
// SummedGradients::packed_in_flight buffers: they start in bucket order on every rank, each once an
// earlier one's sum returns a buffer (nothing waits). Buffers and scratch are allocated at the
// first begin(); later updates allocate nothing.
//
// This header needs MPI (link attn::mpi).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/nn/module.hpp"
#include "attn/train/gradient_buckets.hpp"
#include "attn/train/ring_all_reduce.hpp"

namespace attn {

/// The gradients of a data-parallel job as both its sums see them (DataParallel's blocking sum and
/// OverlappedSums): the parameters and their buckets, the communicator, the values per ring message
/// of a reduce-scatter step, and the buffers packed buckets are summed in.
template <class T>
struct SummedGradients {
  std::vector<NamedParameter<T>> params;
  BucketPlan<T> plan;
  MPI_Comm comm = MPI_COMM_WORLD;
  int ranks = 1;
  Index piece = kRingPieceValues;
  /// [buffers][plan.largest_packed]: the blocking sum's [0] if any bucket packs, and up to
  /// packed_in_flight from the first overlapped sum on more than one rank.
  std::vector<std::vector<T>> packed;
  std::size_t packed_in_flight = 2;
};

/// The sums of the buckets of `gradients`, each started as backward finishes it: begin(), then
/// gradients_final() from backward's hook, then finish(). Every rank calls them in the same order.
/// DataParallel makes the plan and checks it first: every bucket's ring chunks fit one MPI
/// message (ring_chunks_fit), and there are no more buckets than max_buckets().
template <class T>
class OverlappedSums {
 public:
  explicit OverlappedSums(SummedGradients<T>& gradients) : g_(gradients) {}
  OverlappedSums(const OverlappedSums&) = delete;
  OverlappedSums& operator=(const OverlappedSums&) = delete;

  /// Between begin() and finish().
  bool active() const { return active_; }

  /// The next gradients_final() calls come from the last backward pass of an update.
  void begin() {
    ATTN_CHECK(!active_, StateError,
               "DataParallel::begin_overlapped: the previous overlapped sum was not finished");
    if (flights_.size() != g_.plan.buckets.size()) allocate_flights();
    for (std::size_t b = 0; b < flights_.size(); ++b) {
      flights_[b].waiting = g_.plan.buckets[b].members.size();
      flights_[b].ready = flights_[b].started = flights_[b].reduced = false;
    }
    final_.assign(g_.params.size(), 0);  // allocates only at the first begin()
    free_.resize(g_.packed.size());
    std::iota(free_.begin(), free_.end(), std::size_t{0});
    next_packed_ = 0;
    active_ = true;
  }

  /// The hook: the gradients of params[ids] are final. Starts each bucket whose members are all
  /// final and moves every sum in flight on without waiting. Ignored outside begin/finish.
  void gradients_final(const std::vector<Index>& ids) {
    if (!active_) return;
    for (Index id : ids) {
      ATTN_CHECK(id >= 0 && static_cast<std::size_t>(id) < g_.params.size(), IndexError,
                 "DataParallel::gradients_final: parameter index ", id, " outside [0, ",
                 g_.params.size(), ")");
      const auto i = static_cast<std::size_t>(id);
      ATTN_CHECK(!final_[i], StateError, "DataParallel::gradients_final: ", g_.params[i].name,
                 " reported final twice in one backward pass");
      final_[i] = 1;
      const std::size_t b = g_.plan.bucket_of[i];
      if (--flights_[b].waiting == 0) make_ready(b);
    }
    progress();
  }

  /// Starts the sum of every bucket not yet started, final or not: for a rank whose backward pass
  /// did not run to its end, so that the other ranks' rings complete.
  void start_remaining() {
    if (!active_) return;
    for (std::size_t b = 0; b < flights_.size(); ++b) {
      flights_[b].ready = true;
      if (!flights_[b].started && !g_.plan.buckets[b].packs())
        start(b, g_.plan.buckets[b].in_place);
    }
    start_packed_in_turn();
  }

  /// Waits for every sum, so each gradient holds its sum over the ranks. Throws StateError, on
  /// every rank alike, naming the parameters backward never reported final (their buckets' sums
  /// never started: a stage missing from the model's hook).
  void finish() {
    ATTN_CHECK(active_, StateError, "DataParallel::finish_overlapped: no begin_overlapped");
    active_ = false;
    // In bucket order, as every rank does: a packed bucket queued for a buffer gets one from a
    // sum before it, so it has started by the time its turn comes.
    for (std::size_t b = 0; b < flights_.size(); ++b) {
      if (!flights_[b].started || flights_[b].reduced) continue;
      flights_[b].ring.wait();
      complete(b);
      if (g_.plan.buckets[b].packs()) start_packed_in_turn();
    }
    check_all_started();
  }

  /// Buckets whose sum has started since begin(); 0 outside begin/finish.
  std::size_t buckets_started() const {
    if (!active_) return 0;
    std::size_t n = 0;
    for (const Flight& f : flights_) n += f.started;
    return n;
  }

  /// How many buckets can be in flight at once on `comm`: each needs an MPI tag of its own, from
  /// the first that ring_all_reduce() leaves free.
  static std::size_t max_buckets(MPI_Comm comm) {
    return static_cast<std::size_t>(detail::max_tag(comm) - kFirstTag + 1);
  }

 private:
  static constexpr int kFirstTag = 2;  // ring_all_reduce() uses tags 0 and 1

  // One bucket's sum.
  struct Flight {
    RingInFlight<T> ring;
    std::vector<T> scratch;   // [ring_scratch_values] one incoming piece
    std::size_t buffer = 0;   // g_.packed[buffer] holds a packed bucket's values while in flight
    std::size_t waiting = 0;  // members not yet final
    bool ready = false;       // members final (or start_remaining): may start, in turn if packed
    bool started = false, reduced = false;
  };

  // The flights, their scratch and the packed buffers; if an allocation fails, the next begin()
  // tries again (a flight without its scratch would have MPI receive into nothing).
  void allocate_flights() {
    std::vector<Flight> flights(g_.plan.buckets.size());
    if (g_.ranks > 1) {  // else nothing is sent
      for (std::size_t b = 0; b < flights.size(); ++b)
        flights[b].scratch.assign(static_cast<std::size_t>(ring_scratch_values(
                                      g_.plan.buckets[b].span, g_.ranks, g_.piece)),
                                  T(0));
      const std::size_t buffers = std::min(g_.packed_in_flight, g_.plan.packed.size());
      if (buffers > g_.packed.size())
        g_.packed.resize(buffers,
                         std::vector<T>(static_cast<std::size_t>(g_.plan.largest_packed), T(0)));
    }
    flights_ = std::move(flights);
  }

  // Bucket b may start: its members are final. One summed in place starts at once; packed ones
  // start in turn.
  void make_ready(std::size_t b) {
    flights_[b].ready = true;
    if (g_.plan.buckets[b].packs())
      start_packed_in_turn();
    else
      start(b, g_.plan.buckets[b].in_place);
  }

  // Packed buckets start in bucket order, the same on every rank, each once it is ready, all before
  // it have started, and a buffer is free (complete(b) returns one, and this is called again).
  // Nothing waits here: backward never stalls for a buffer.
  void start_packed_in_turn() {
    for (; next_packed_ < g_.plan.packed.size(); ++next_packed_) {
      const std::size_t b = g_.plan.packed[next_packed_];
      if (!flights_[b].ready) return;
      if (g_.ranks == 1) {
        start(b, nullptr);
        continue;
      }
      if (free_.empty()) return;
      T* data = g_.packed[free_.back()].data();
      pack_bucket(g_.plan.buckets[b], g_.params, data);
      start(b, data);  // if it throws, the buffer stays free and b unstarted
      flights_[b].buffer = free_.back();
      free_.pop_back();
    }
  }

  // Bucket b's ring starts on `data` (one tag per bucket: several run at once). On one rank the
  // gradients are their own sum.
  void start(std::size_t b, T* data) {
    Flight& f = flights_[b];
    if (g_.ranks > 1)
      f.ring.start(data, g_.plan.buckets[b].span, f.scratch.data(), g_.comm,
                   kFirstTag + static_cast<int>(b), g_.piece);
    f.started = true;
    f.reduced = g_.ranks == 1;
  }

  // Every ring in flight takes the steps whose messages have arrived; the packed buckets queued
  // for a buffer start as finished ones return theirs.
  void progress() {
    bool freed = false;
    for (std::size_t b = 0; b < flights_.size(); ++b)
      if (flights_[b].started && !flights_[b].reduced && flights_[b].ring.progress()) {
        complete(b);
        freed = freed || g_.plan.buckets[b].packs();
      }
    if (freed) start_packed_in_turn();
  }

  // Bucket b's ring is done: the sums go back into the gradients, and its buffer is free.
  void complete(std::size_t b) {
    Flight& f = flights_[b];
    if (g_.plan.buckets[b].packs()) {
      unpack_bucket(g_.plan.buckets[b], g_.params, g_.packed[f.buffer].data());
      free_.push_back(f.buffer);
    }
    f.reduced = true;
  }

  // After finish(): StateError unless every bucket's sum started (and so has ended).
  void check_all_started() const {
    std::string missing;
    for (std::size_t b = 0; b < flights_.size(); ++b)
      if (!flights_[b].ready)
        for (std::size_t i : g_.plan.buckets[b].members)
          if (!final_[i]) missing += (missing.empty() ? "" : ", ") + g_.params[i].name;
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

  SummedGradients<T>& g_;
  std::vector<Flight> flights_;    // [buckets] from the first begin()
  std::vector<char> final_;        // [params] reported final in this pass
  std::vector<std::size_t> free_;  // buffers of g_.packed no sum in flight holds
  std::size_t next_packed_ = 0;    // g_.plan.packed[next_packed_] is the next to start
  bool active_ = false;            // between begin() and finish()
};

}  // namespace attn
