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
// Buckets. Gradients are packed into buckets of about DataParallelOptions::bucket_bytes, in the
// reverse of registration order (the order backward finishes them), and each bucket is one ring
// all-reduce: a few large messages instead of one per tensor. A model smaller than min_buckets
// buckets is cut into min_buckets smaller ones, so that its top layers' sums can still start
// during backward (see Overlap). A bucket whose gradients lie in one range of memory is reduced
// there, without packing: a tensor larger than a bucket, and every bucket of a model that keeps
// its gradients in one buffer (Module::gather_gradients; a Transformer does), where the zero
// padding between tensors is summed along with them. Module::parameters() lists a tied weight
// once, so it is reduced once. Buffers are allocated at construction (statistics and the
// overlapped sums: at the first step); later steps allocate nothing.
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
// piece_bytes), and a bucket that packs its own copy.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/nn/module.hpp"
#include "attn/train/label_smoothed_loss.hpp"
#include "attn/train/replica_agreement.hpp"
#include "attn/train/ring_all_reduce.hpp"

namespace attn {

/// Thrown on every rank when one rank reported an error to all_reduce(): the message names the
/// first failing rank, so each rank stops with the same message instead of waiting for it.
class ReplicaError : public Error {
 public:
  using Error::Error;
};

struct DataParallelOptions {
  std::size_t bucket_bytes = std::size_t{32} << 20;  ///< gradients packed per all-reduce, at most
  std::size_t min_buckets = 4;  ///< buckets are at most 1/min_buckets of all gradients (>= 1)
  /// Values per message of the ring's reduce-scatter steps, in bytes: each sum in flight holds
  /// one such piece as scratch (kRingPieceValues of float by default).
  std::size_t piece_bytes = std::size_t{4} << 20;
};

/// Sums gradients and loss statistics over the ranks of a communicator. Every rank constructs
/// it with the same model (the same parameter list) and calls its members in the same order.
/// The model's hook (reduce_during_backward) points at this object: it neither copies nor moves.
template <class T>
class DataParallel {
 public:
  explicit DataParallel(std::vector<NamedParameter<T>> params, MPI_Comm comm = MPI_COMM_WORLD,
                        DataParallelOptions options = {})
      : params_(std::move(params)), comm_(comm) {
    ATTN_CHECK(options.bucket_bytes >= sizeof(T), ConfigError,
               "DataParallel: bucket_bytes must hold one value, got ", options.bucket_bytes);
    ATTN_CHECK(options.min_buckets >= 1, ConfigError,
               "DataParallel: min_buckets must be at least 1, got ", options.min_buckets);
    ATTN_CHECK(options.piece_bytes >= sizeof(T), ConfigError,
               "DataParallel: piece_bytes must hold one value, got ", options.piece_bytes);
    piece_ = static_cast<Index>(
        std::min<std::size_t>(options.piece_bytes / sizeof(T), std::numeric_limits<int>::max()));
    rank_ = detail::comm_rank(comm_);
    ranks_ = detail::comm_size(comm_);
    plan_buckets(bucket_capacity(options));
    const int tags = detail::max_tag(comm_) - kFirstTag + 1;
    ATTN_CHECK(buckets_.size() <= static_cast<std::size_t>(tags), ConfigError,
               "DataParallel: ", buckets_.size(), " buckets need more MPI tags than the ", tags,
               " this MPI offers; raise bucket_bytes");
  }
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return rank_; }
  int size() const { return ranks_; }
  /// The all-reduce calls one step makes.
  std::size_t buckets() const { return buckets_.size(); }
  /// The buckets whose gradients are copied into a buffer of their own to be summed (0 for a
  /// Transformer, whose gradients lie in one buffer).
  std::size_t packed_buckets() const {
    return static_cast<std::size_t>(std::count_if(
        buckets_.begin(), buckets_.end(), [](const Bucket& b) { return b.in_place == nullptr; }));
  }

  /// Replaces every parameter gradient by its sum over the ranks (same bits on every rank).
  void all_reduce_gradients() {
    if (ranks_ == 1) return;
    for (const Bucket& b : buckets_) {
      if (b.in_place != nullptr) {
        ring_all_reduce(b.in_place, b.span, scratch_.data(), comm_, piece_);
        continue;
      }
      pack(b, packed_.data());
      ring_all_reduce(packed_.data(), b.span, scratch_.data(), comm_, piece_);
      unpack(b, packed_.data());
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
    ATTN_CHECK(!overlapping_, Error,
               "DataParallel::begin_overlapped: the previous overlapped sum was not finished");
    if (flights_.size() != buckets_.size()) allocate_flights();
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      flights_[b].waiting = buckets_[b].members.size();
      flights_[b].started = flights_[b].reduced = false;
    }
    std::fill(final_.begin(), final_.end(), 0);
    overlapping_ = true;
  }

  /// The hook: the gradients of params[ids] are final. Starts each bucket whose members are all
  /// final and moves every sum in flight on without waiting. Ignored outside begin/finish.
  void gradients_final(const std::vector<Index>& ids) {
    if (!overlapping_) return;
    for (Index id : ids) {
      ATTN_CHECK(id >= 0 && static_cast<std::size_t>(id) < params_.size(), Error,
                 "DataParallel::gradients_final: parameter index ", id, " outside [0, ",
                 params_.size(), ")");
      const auto i = static_cast<std::size_t>(id);
      ATTN_CHECK(!final_[i], Error, "DataParallel::gradients_final: ", params_[i].name,
                 " reported final twice in one backward pass");
      final_[i] = 1;
      if (--flights_[bucket_of_[i]].waiting == 0) start(bucket_of_[i]);
    }
    progress();
  }

  /// Starts the sum of every bucket not yet started, final or not: for a rank whose backward pass
  /// did not run to its end, so that the other ranks' rings complete.
  void start_remaining() {
    if (!overlapping_) return;
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      if (!flights_[b].started) start(b);
  }

  /// Waits for every sum in flight, so each gradient holds its sum over the ranks. Throws Error,
  /// on every rank alike, naming the parameters backward never reported final (their buckets'
  /// sums never started: a stage missing from the model's hook).
  void finish_overlapped() {
    ATTN_CHECK(overlapping_, Error, "DataParallel::finish_overlapped: no begin_overlapped");
    overlapping_ = false;
    std::string missing;
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      Flight& f = flights_[b];
      if (!f.started) {
        for (std::size_t i : buckets_[b].members)
          if (!final_[i]) missing += (missing.empty() ? "" : ", ") + params_[i].name;
        continue;
      }
      if (f.reduced) continue;
      f.ring.wait();
      finish(b);
    }
    ATTN_CHECK(missing.empty(), Error, "DataParallel::finish_overlapped: backward never reported ",
               missing, " final, so ", missing.find(',') == std::string::npos ? "its" : "their",
               " sum over the ranks never started (does the model's backward call its gradient "
               "hook after every stage?)");
  }

  /// Buckets whose sum has started since begin_overlapped(); 0 outside begin/finish (for tests
  /// and diagnostics).
  std::size_t buckets_started() const {
    if (!overlapping_) return 0;
    std::size_t n = 0;
    for (const Flight& f : flights_) n += f.started;
    return n;
  }

  /// The sums of every rank's statistics, added in rank order (the same bits on every rank).
  /// If any rank passes a non-empty `local_error`, every rank throws ReplicaError with the
  /// message of the lowest such rank instead: one rank's bad batch stops all, none hangs.
  LossStats all_reduce(const LossStats& local, const std::string& local_error = {}) const {
    const std::array<double, 4> mine{local.smoothed_loss, local.nll,
                                     static_cast<double>(local.tokens),
                                     static_cast<double>(local_error.size())};
    all_stats_.resize(4 * static_cast<std::size_t>(ranks_));
    detail::mpi_check(
        MPI_Allgather(mine.data(), 4, MPI_DOUBLE, all_stats_.data(), 4, MPI_DOUBLE, comm_),
        "MPI_Allgather");
    LossStats sum;
    for (int r = 0; r < ranks_; ++r) {
      const double* s = all_stats_.data() + 4 * r;
      if (s[3] > 0) throw_error_of(r, static_cast<int>(s[3]), local_error);
      sum.smoothed_loss += s[0];
      sum.nll += s[1];
      sum.tokens += static_cast<Index>(s[2]);
    }
    return sum;
  }

 private:
  static constexpr int kFirstTag = 2;  // ring_all_reduce() uses tags 0 and 1

  struct Bucket {
    std::vector<std::size_t> members;  // indices into params_, descending
    Index elements = 0;                // the members' values
    T* in_place = nullptr;             // their one range of memory, if they lie in one
    Index span = 0;                    // values summed: elements, and any padding in the range
  };

  // One bucket's overlapped sum.
  struct Flight {
    RingInFlight<T> ring;
    std::vector<T> packed;    // [span] when the bucket packs
    std::vector<T> scratch;   // [ring_scratch_values] one incoming piece
    std::size_t waiting = 0;  // members not yet final
    bool started = false, reduced = false;
  };

  void pack(const Bucket& b, T* out) const {
    for (std::size_t i : b.members) {
      const Tensor<T>& g = params_[i].grad;
      out = std::copy(g.data(), g.data() + g.numel(), out);
    }
  }

  void unpack(const Bucket& b, const T* in) {
    for (std::size_t i : b.members) {
      Tensor<T>& g = params_[i].grad;
      std::copy(in, in + g.numel(), g.data());
      in += g.numel();
    }
  }

  void allocate_flights() {
    flights_ = std::vector<Flight>(buckets_.size());
    if (ranks_ == 1) return;  // nothing to send
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const Index n = buckets_[b].span;
      if (buckets_[b].in_place == nullptr)
        flights_[b].packed.assign(static_cast<std::size_t>(n), T(0));
      flights_[b].scratch.assign(static_cast<std::size_t>(ring_scratch_values(n, ranks_, piece_)),
                                 T(0));
    }
  }

  // Bucket b's members are final: its ring starts (one tag per bucket: several run at once).
  void start(std::size_t b) {
    Flight& f = flights_[b];
    f.started = true;
    if (ranks_ == 1) {
      f.reduced = true;
      return;
    }
    T* data = buckets_[b].in_place;
    if (data == nullptr) {
      data = f.packed.data();
      pack(buckets_[b], data);
    }
    f.ring.start(data, buckets_[b].span, f.scratch.data(), comm_, kFirstTag + static_cast<int>(b),
                 piece_);
  }

  // Every ring in flight takes the steps whose messages have arrived.
  void progress() {
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      if (flights_[b].started && !flights_[b].reduced && flights_[b].ring.progress()) finish(b);
  }

  // Bucket b's ring is done: the sums go back into the gradients.
  void finish(std::size_t b) {
    if (buckets_[b].in_place == nullptr) unpack(buckets_[b], flights_[b].packed.data());
    flights_[b].reduced = true;
  }

  /// Values per bucket: bucket_bytes' worth, but at most 1/min_buckets of all gradients.
  Index bucket_capacity(const DataParallelOptions& options) const {
    Index total = 0;
    for (const auto& p : params_) total += p.grad.numel();
    const Index min_buckets = static_cast<Index>(
        std::min<std::size_t>(options.min_buckets, std::numeric_limits<Index>::max()));
    const Index share = std::max<Index>(1, (total + min_buckets - 1) / min_buckets);
    const std::size_t values = options.bucket_bytes / sizeof(T);
    return static_cast<Index>(std::min<std::size_t>(values, static_cast<std::size_t>(share)));
  }

  void plan_buckets(Index capacity) {
    Index largest_packed = 0, largest = 0;
    Bucket open;
    bucket_of_.assign(params_.size(), 0);
    final_.assign(params_.size(), 0);
    auto close = [&] {
      if (open.members.empty()) return;
      locate(open);
      if (open.in_place == nullptr) largest_packed = std::max(largest_packed, open.span);
      largest = std::max(largest, open.span);
      buckets_.push_back(std::move(open));
      open = Bucket{};
    };
    for (std::size_t i = params_.size(); i-- > 0;) {  // backward finishes the last layers first
      const Index n = params_[i].grad.numel();
      if (open.elements > 0 && open.elements + n > capacity) close();
      open.members.push_back(i);
      open.elements += n;
      bucket_of_[i] = buckets_.size();
    }
    close();
    packed_.assign(static_cast<std::size_t>(largest_packed), T(0));
    scratch_.assign(static_cast<std::size_t>(ring_scratch_values(largest, ranks_, piece_)), T(0));
  }

  // Sets b.in_place and b.span: the members' gradients lie in one range when they are views of one
  // allocation in index order, each starting at the first detail::kAlignment boundary at or after
  // the end of the one before (Module::gather_gradients' layout, whose zero padding is summed
  // along). Else they are packed.
  void locate(Bucket& b) {
    const Tensor<T>* prev = nullptr;
    bool one_range = true;
    for (auto m = b.members.rbegin(); m != b.members.rend() && one_range; ++m) {
      const Tensor<T>& g = params_[*m].grad;
      if (prev != nullptr && g.shares_storage(*prev)) {
        const auto end = reinterpret_cast<std::uintptr_t>(prev->data() + prev->numel());
        const std::uintptr_t next =
            (end + detail::kAlignment - 1) / detail::kAlignment * detail::kAlignment;
        one_range = reinterpret_cast<std::uintptr_t>(g.data()) == next;
      } else if (prev != nullptr) {
        one_range = false;
      }
      prev = &g;
    }
    Tensor<T>& first = params_[b.members.back()].grad;
    const Tensor<T>& last = params_[b.members.front()].grad;
    one_range = one_range && first.data() != nullptr;
    b.in_place = one_range ? first.data() : nullptr;
    b.span = one_range ? static_cast<Index>(last.data() + last.numel() - first.data()) : b.elements;
  }

  [[noreturn]] void throw_error_of(int failed, int length, const std::string& local_error) const {
    std::string message = failed == rank_ ? local_error : std::string(length, '\0');
    detail::mpi_check(MPI_Bcast(message.data(), length, MPI_CHAR, failed, comm_), "MPI_Bcast");
    throw ReplicaError(detail::concat("rank ", failed, " of ", ranks_, ": ", message));
  }

  std::vector<NamedParameter<T>> params_;
  MPI_Comm comm_;
  int rank_ = 0, ranks_ = 1;
  Index piece_ = kRingPieceValues;  // values per reduce-scatter message
  std::vector<Bucket> buckets_;
  std::vector<T> packed_;                  // [largest packed bucket]
  std::vector<T> scratch_;                 // [ring_scratch_values(largest bucket)] one piece
  mutable std::vector<double> all_stats_;  // [N, 4] every rank's statistics
  std::vector<std::size_t> bucket_of_;     // [params] the bucket of each parameter
  std::vector<Flight> flights_;            // [buckets] overlapped sums, from the first
  std::vector<char> final_;                // [params] reported final in this pass
  bool overlapping_ = false;               // between begin_overlapped and finish_overlapped
};

}  // namespace attn
