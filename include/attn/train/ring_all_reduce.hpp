// The ring all-reduce of data-parallel training (data_parallel.hpp), in two forms that compute the
// same bits: ring_all_reduce() blocks until the sum is done; RingInFlight runs the same steps over
// non-blocking messages, so that backward can compute while the sum travels.
//
// Reduction order. MPI_Allreduce leaves the order of the floating-point additions to the
// implementation (Open MPI's tuned component picks an algorithm from the message size and the
// number of ranks), and some algorithms can even leave different bits on different ranks. Both
// would make runs irreproducible and let replicas drift apart. The ring here fixes the order: chunk
// c of the buffer is summed as g_c + g_{c+1} + ... + g_{c-1} (ranks mod N), and the finished chunks
// are then copied around the ring. So the result depends only on N, is the same from run to run,
// and is the same bits on every rank. It sends 2 (N - 1) / N of the buffer per rank, as MPI's own
// ring does. For N = 2 the sum is g_0 + g_1 on every chunk (addition commutes exactly in IEEE
// arithmetic).
//
// This header needs MPI (link attn::mpi).
#pragma once

#include <mpi.h>

#include <array>
#include <limits>
#include <string>

#include "attn/error.hpp"
#include "attn/tensor.hpp"

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

/// The largest tag `comm` accepts (at least 32767 by the standard).
inline int max_tag(MPI_Comm comm) {
  int* value = nullptr;
  int found = 0;
  mpi_check(MPI_Comm_get_attr(comm, MPI_TAG_UB, &value, &found), "MPI_Comm_get_attr");
  return found && value ? *value : 32767;
}

}  // namespace detail

/// The first element of chunk c when n elements are split over N ranks: [n c / N, n (c+1) / N).
inline Index ring_chunk_begin(Index n, int c, int ranks) { return n * c / ranks; }

/// The steps of a ring all-reduce of n elements as rank `rank` of `ranks` runs them. Step s sends
/// chunk rank - s to the right neighbour and receives chunk rank - s - 1 (mod N) from the left.
/// The first N - 1 steps (reduce-scatter) add what arrives to this rank's own values of that chunk:
/// chunk c starts at rank c, so after them rank r holds the finished chunk r + 1. The other N - 1
/// steps (all-gather) copy the finished chunks once around the ring.
class RingSchedule {
 public:
  RingSchedule(Index n, int rank, int ranks) : n_(n), rank_(rank), ranks_(ranks) {
    ATTN_CHECK(n / ranks + 1 <= static_cast<Index>(std::numeric_limits<int>::max()), ConfigError,
               "ring all-reduce: ", n, " elements make chunks too large for one MPI message");
  }
  int steps() const { return ranks_ == 1 || n_ == 0 ? 0 : 2 * (ranks_ - 1); }
  bool adds(int s) const { return s + 1 < ranks_; }
  int send_chunk(int s) const { return mod(rank_ - s); }
  int recv_chunk(int s) const { return mod(rank_ - s - 1); }
  Index begin(int c) const { return ring_chunk_begin(n_, c, ranks_); }
  int count(int c) const { return static_cast<int>(begin(c + 1) - begin(c)); }
  int right() const { return (rank_ + 1) % ranks_; }
  int left() const { return (rank_ + ranks_ - 1) % ranks_; }

 private:
  int mod(int c) const { return ((c % ranks_) + ranks_) % ranks_; }
  Index n_;
  int rank_, ranks_;
};

namespace detail {

/// The one addition of the ring, shared by both forms so that they give the same bits.
template <class T>
void ring_add(T* mine, const T* arrived, int count) {
  for (int i = 0; i < count; ++i) mine[i] = arrived[i] + mine[i];
}

}  // namespace detail

/// Sums data[0, n) over the ranks of `comm` in place (RingSchedule, over MPI_Sendrecv): the same
/// bits on every rank and in every run with the same number of ranks. `scratch` must hold
/// n / N + 1 elements. Every rank must call it with the same n.
template <class T>
void ring_all_reduce(T* data, Index n, T* scratch, MPI_Comm comm) {
  const RingSchedule ring(n, detail::comm_rank(comm), detail::comm_size(comm));
  const MPI_Datatype type = detail::mpi_datatype<T>();
  for (int s = 0; s < ring.steps(); ++s) {
    const int send = ring.send_chunk(s), recv = ring.recv_chunk(s), tag = ring.adds(s) ? 0 : 1;
    T* into = ring.adds(s) ? scratch : data + ring.begin(recv);
    detail::mpi_check(
        MPI_Sendrecv(data + ring.begin(send), ring.count(send), type, ring.right(), tag, into,
                     ring.count(recv), type, ring.left(), tag, comm, MPI_STATUS_IGNORE),
        "MPI_Sendrecv");
    if (ring.adds(s)) detail::ring_add(data + ring.begin(recv), scratch, ring.count(recv));
  }
}

/// One ring_all_reduce() in flight: the same steps, chunks and additions, each step an MPI_Isend
/// and an MPI_Irecv, and step s + 1 posted only once both of step s have completed (its partial sum
/// arrived and was added). progress() never waits; wait() does. Allocates nothing.
template <class T>
class RingInFlight {
 public:
  /// Starts summing data[0, n) in place; `scratch` holds n / N + 1 elements. Both must stay
  /// untouched until done(). Every rank must start the same sums with the same n and tag; sums
  /// in flight at once between the same ranks need different tags.
  void start(T* data, Index n, T* scratch, MPI_Comm comm, int tag) {
    ATTN_ASSERT(done());
    ring_ = RingSchedule(n, detail::comm_rank(comm), detail::comm_size(comm));
    data_ = data;
    scratch_ = scratch;
    comm_ = comm;
    tag_ = tag;
    step_ = 0;
    if (step_ < ring_.steps()) post();
  }

  bool done() const { return step_ >= ring_.steps(); }

  /// Completes the steps whose messages have arrived, without waiting; true when the sum is done.
  bool progress() {
    while (!done()) {
      int complete = 0;
      detail::mpi_check(MPI_Testall(2, requests_.data(), &complete, MPI_STATUSES_IGNORE),
                        "MPI_Testall");
      if (!complete) return false;
      next_step();
    }
    return true;
  }

  /// Waits for the remaining steps.
  void wait() {
    while (!done()) {
      detail::mpi_check(MPI_Waitall(2, requests_.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
      next_step();
    }
  }

 private:
  void post() {
    const MPI_Datatype type = detail::mpi_datatype<T>();
    const int send = ring_.send_chunk(step_), recv = ring_.recv_chunk(step_);
    T* into = ring_.adds(step_) ? scratch_ : data_ + ring_.begin(recv);
    detail::mpi_check(
        MPI_Irecv(into, ring_.count(recv), type, ring_.left(), tag_, comm_, &requests_[0]),
        "MPI_Irecv");
    detail::mpi_check(MPI_Isend(data_ + ring_.begin(send), ring_.count(send), type, ring_.right(),
                                tag_, comm_, &requests_[1]),
                      "MPI_Isend");
  }

  // Step step_ has arrived and been sent: add what arrived (reduce-scatter), post the next.
  void next_step() {
    if (ring_.adds(step_)) {
      const int recv = ring_.recv_chunk(step_);
      detail::ring_add(data_ + ring_.begin(recv), scratch_, ring_.count(recv));
    }
    if (++step_ < ring_.steps()) post();
  }

  RingSchedule ring_{0, 0, 1};
  T* data_ = nullptr;
  T* scratch_ = nullptr;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int tag_ = 0, step_ = 0;
  std::array<MPI_Request, 2> requests_{MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

}  // namespace attn
