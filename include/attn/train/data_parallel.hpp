// Data-parallel training over MPI: every rank holds the same model, computes the gradients of its
// own share of each batch, and the ranks sum their gradients before every optimiser step, so the
// update is the one a single process would make on the whole batch.
//
// This header needs MPI (link attn::mpi); the rest of attn needs only Eigen.
//
// Reduction order. MPI_Allreduce leaves the order of the floating-point additions to the
// implementation (Open MPI's tuned component picks an algorithm from the message size and the
// number of ranks), and some algorithms can even leave different bits on different ranks. Both
// would make runs irreproducible and let replicas drift apart. ring_all_reduce() below therefore
// runs the ring algorithm itself over MPI_Sendrecv: chunk c of the buffer is summed in the fixed
// order g_c + g_{c+1} + ... + g_{c-1} (ranks mod N), and the finished chunks are then copied
// around the ring. So the result depends only on N, is the same from run to run, and is the same
// bits on every rank. It sends 2 (N - 1) / N of the buffer per rank, as MPI's own ring does. For
// N = 2 the sum is g_0 + g_1 on every chunk (addition commutes exactly in IEEE arithmetic).
//
// Buckets. Gradients are packed into buckets of about DataParallelOptions::bucket_bytes, in the
// reverse of registration order (the order backward finishes them), and each bucket is one ring
// all-reduce: a few large messages instead of one per tensor. A tensor larger than a bucket is
// reduced in place without packing. Module::parameters() lists a tied weight once, so it is
// reduced once. Buffers are allocated at construction (statistics: at the first step); later
// steps allocate nothing.
//
// Overlap with backward. The reduction runs after backward, not during it. On one machine the
// ranks talk through shared memory at memory speed (GB/s): the 'small' model's 30 MB of float
// gradients should take some 10 ms against its ~0.7 s step (an estimate; scripts/bench_mpi.sh
// measures it). Starting buckets during backward would need hooks inside Transformer::backward,
// and the largest tensor (the shared embedding) is finished last. Across machines it would pay:
// base's 252 MB take 0.2-0.4 s at 10 Gbit/s against a ~3.5 s step (README, "Training on several
// machines").
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

namespace attn {

namespace detail {

template <class T>
MPI_Datatype mpi_datatype();
template <>
inline MPI_Datatype mpi_datatype<float>() {
  return MPI_FLOAT;
}
template <>
inline MPI_Datatype mpi_datatype<double>() {
  return MPI_DOUBLE;
}

inline void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  ATTN_CHECK(false, Error, call, " failed: ", std::string(text, static_cast<std::size_t>(len)));
}

inline int comm_rank(MPI_Comm comm) {
  int r = 0;
  mpi_check(MPI_Comm_rank(comm, &r), "MPI_Comm_rank");
  return r;
}

inline int comm_size(MPI_Comm comm) {
  int n = 1;
  mpi_check(MPI_Comm_size(comm, &n), "MPI_Comm_size");
  return n;
}

}  // namespace detail

/// Thrown on every rank when one rank reported an error to all_reduce(): the message names the
/// first failing rank, so each rank stops with the same message instead of waiting for it.
class ReplicaError : public Error {
 public:
  using Error::Error;
};

/// The element count of chunk c when n elements are split over N ranks: [n c / N, n (c+1) / N).
inline Index ring_chunk_begin(Index n, int c, int ranks) { return n * c / ranks; }

/// Sums data[0, n) over the ranks of `comm` in place with a ring (reduce-scatter, then
/// all-gather), in the fixed order described at the top of this file: the same bits on every
/// rank and in every run with the same number of ranks. `scratch` must hold n / N + 1 elements.
/// Every rank must call it with the same n.
template <class T>
void ring_all_reduce(T* data, Index n, T* scratch, MPI_Comm comm) {
  const int ranks = detail::comm_size(comm), rank = detail::comm_rank(comm);
  if (ranks == 1 || n == 0) return;
  ATTN_CHECK(n / ranks + 1 <= static_cast<Index>(std::numeric_limits<int>::max()), ConfigError,
             "ring_all_reduce: ", n, " elements make chunks too large for one MPI message");
  const MPI_Datatype type = detail::mpi_datatype<T>();
  const int right = (rank + 1) % ranks, left = (rank + ranks - 1) % ranks;
  auto mod = [ranks](int c) { return ((c % ranks) + ranks) % ranks; };
  auto begin = [&](int c) { return ring_chunk_begin(n, c, ranks); };
  auto count = [&](int c) { return static_cast<int>(begin(c + 1) - begin(c)); };
  // Reduce-scatter: step s sends the partial sum of chunk rank - s and adds this rank's gradient
  // to the partial sum of chunk rank - s - 1 that arrives from the left. Chunk c starts at rank
  // c, so after N - 1 steps rank r holds the finished chunk r + 1.
  for (int s = 0; s + 1 < ranks; ++s) {
    const int send = mod(rank - s), recv = mod(rank - s - 1);
    detail::mpi_check(MPI_Sendrecv(data + begin(send), count(send), type, right, 0, scratch,
                                   count(recv), type, left, 0, comm, MPI_STATUS_IGNORE),
                      "MPI_Sendrecv");
    T* mine = data + begin(recv);
    for (int i = 0; i < count(recv); ++i) mine[i] = scratch[i] + mine[i];
  }
  // All-gather: the finished chunks travel once around the ring, copied, not added.
  for (int s = 0; s + 1 < ranks; ++s) {
    const int send = mod(rank + 1 - s), recv = mod(rank - s);
    detail::mpi_check(
        MPI_Sendrecv(data + begin(send), count(send), type, right, 1, data + begin(recv),
                     count(recv), type, left, 1, comm, MPI_STATUS_IGNORE),
        "MPI_Sendrecv");
  }
}

/// Every rank passes its value; throws ConfigError on every rank, naming the first rank whose
/// value differs from rank 0's and `what` ("training data", "parameters", ...), unless all agree.
inline void check_same_on_all_ranks(std::uint64_t value, const std::string& what,
                                    MPI_Comm comm = MPI_COMM_WORLD) {
  const int ranks = detail::comm_size(comm);
  std::vector<std::uint64_t> all(static_cast<std::size_t>(ranks));
  detail::mpi_check(MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm),
                    "MPI_Allgather");
  for (int r = 1; r < ranks; ++r)
    ATTN_CHECK(all[static_cast<std::size_t>(r)] == all[0], ConfigError, "rank ", r, "'s ", what,
               " differ from rank 0's (fingerprint ", all[static_cast<std::size_t>(r)], " vs ",
               all[0], "); every rank must start from the same files and options");
}

/// A 64-bit FNV-1a fingerprint of every parameter's bits, in order (for check_same_on_all_ranks).
template <class T>
std::uint64_t parameter_fingerprint(const std::vector<NamedParameter<T>>& params) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const auto& p : params) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(p.value.data());
    for (std::size_t i = 0; i < static_cast<std::size_t>(p.value.numel()) * sizeof(T); ++i)
      h = (h ^ bytes[i]) * 0x100000001b3ULL;
  }
  return h;
}

struct DataParallelOptions {
  std::size_t bucket_bytes = std::size_t{32} << 20;  ///< gradients packed per all-reduce
};

/// Sums gradients and loss statistics over the ranks of a communicator. Every rank constructs
/// it with the same model (the same parameter list) and calls its members in the same order.
template <class T>
class DataParallel {
 public:
  explicit DataParallel(std::vector<NamedParameter<T>> params, MPI_Comm comm = MPI_COMM_WORLD,
                        DataParallelOptions options = {})
      : params_(std::move(params)), comm_(comm) {
    ATTN_CHECK(options.bucket_bytes >= sizeof(T), ConfigError,
               "DataParallel: bucket_bytes must hold one value, got ", options.bucket_bytes);
    rank_ = detail::comm_rank(comm_);
    ranks_ = detail::comm_size(comm_);
    plan_buckets(static_cast<Index>(options.bucket_bytes / sizeof(T)));
  }

  int rank() const { return rank_; }
  int size() const { return ranks_; }
  /// The all-reduce calls one step makes.
  std::size_t buckets() const { return buckets_.size(); }

  /// Replaces every parameter gradient by its sum over the ranks (same bits on every rank).
  void all_reduce_gradients() {
    if (ranks_ == 1) return;
    for (const Bucket& b : buckets_) {
      if (b.members.size() == 1) {  // one tensor: reduce it where it lies
        Tensor<T>& g = params_[b.members[0]].grad;
        ring_all_reduce(g.data(), g.numel(), scratch_.data(), comm_);
        continue;
      }
      T* out = packed_.data();
      for (std::size_t i : b.members) {
        const Tensor<T>& g = params_[i].grad;
        out = std::copy(g.data(), g.data() + g.numel(), out);
      }
      ring_all_reduce(packed_.data(), b.elements, scratch_.data(), comm_);
      const T* in = packed_.data();
      for (std::size_t i : b.members) {
        Tensor<T>& g = params_[i].grad;
        std::copy(in, in + g.numel(), g.data());
        in += g.numel();
      }
    }
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
  struct Bucket {
    std::vector<std::size_t> members;  // indices into params_
    Index elements = 0;
  };

  void plan_buckets(Index capacity) {
    Index largest_packed = 0, largest = 0;
    Bucket open;
    auto close = [&] {
      if (open.members.empty()) return;
      if (open.members.size() > 1) largest_packed = std::max(largest_packed, open.elements);
      largest = std::max(largest, open.elements);
      buckets_.push_back(std::move(open));
      open = Bucket{};
    };
    for (std::size_t i = params_.size(); i-- > 0;) {  // backward finishes the last layers first
      const Index n = params_[i].grad.numel();
      if (open.elements > 0 && open.elements + n > capacity) close();
      open.members.push_back(i);
      open.elements += n;
    }
    close();
    packed_.assign(static_cast<std::size_t>(largest_packed), T(0));
    scratch_.assign(static_cast<std::size_t>(largest / ranks_ + 1), T(0));
  }

  [[noreturn]] void throw_error_of(int failed, int length, const std::string& local_error) const {
    std::string message = failed == rank_ ? local_error : std::string(length, '\0');
    detail::mpi_check(MPI_Bcast(message.data(), length, MPI_CHAR, failed, comm_), "MPI_Bcast");
    throw ReplicaError(detail::concat("rank ", failed, " of ", ranks_, ": ", message));
  }

  std::vector<NamedParameter<T>> params_;
  MPI_Comm comm_;
  int rank_ = 0, ranks_ = 1;
  std::vector<Bucket> buckets_;
  std::vector<T> packed_;                  // [largest packed bucket]
  std::vector<T> scratch_;                 // [largest bucket / N + 1] one incoming chunk
  mutable std::vector<double> all_stats_;  // [N, 4] every rank's statistics
};

}  // namespace attn
