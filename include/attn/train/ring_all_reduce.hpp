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
// arithmetic). The reduce-scatter steps move their chunks in pieces of a bounded size, so a sum
// needs a few MiB of scratch however large its buffer is.
//
// This header needs MPI (link attn::mpi).
#pragma once

#include <mpi.h>

#include <algorithm>
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

/// Whether the chunks of n elements over `ranks` fit one MPI message each (an int count of
/// values): the all-gather steps send a whole chunk at once. One rank sends nothing, so any n fits.
inline bool ring_chunks_fit(Index n, int ranks) {
  return ranks == 1 || n / ranks + 1 <= static_cast<Index>(std::numeric_limits<int>::max());
}

/// Values per message of a ring's reduce-scatter steps unless told otherwise. What arrives in such
/// a step waits in scratch until it is added, so this bounds the scratch of each sum in flight
/// (4 MiB of float) whatever the size of the buffer; messages this long still run at the link's
/// bandwidth.
inline constexpr Index kRingPieceValues = Index{1} << 20;

/// One message of a ring step: send [send_begin, + send_count) to the right neighbour, receive
/// recv_count values from the left, into scratch to be added at recv_begin (`adds`), or straight
/// to recv_begin.
struct RingMessage {
  Index send_begin = 0, recv_begin = 0;
  int send_count = 0, recv_count = 0;
  bool adds = false;
};

/// The steps of a ring all-reduce of n elements as rank `rank` of `ranks` runs them. Step s sends
/// chunk rank - s to the right neighbour and receives chunk rank - s - 1 (mod N) from the left.
/// The first N - 1 steps (reduce-scatter) add what arrives to this rank's own values of that chunk:
/// chunk c starts at rank c, so after them rank r holds the finished chunk r + 1. They move each
/// chunk in pieces of at most `piece` values, one message each; each element is still added once
/// per step, in the same order. The other N - 1 steps (all-gather) copy the finished chunks once
/// around the ring, one message each.
class RingSchedule {
 public:
  RingSchedule(Index n, int rank, int ranks, Index piece = kRingPieceValues)
      : n_(n), piece_(piece), rank_(rank), ranks_(ranks) {
    ATTN_CHECK(ring_chunks_fit(n, ranks), ConfigError, "ring all-reduce: ", n,
               " elements make chunks too large for one MPI message");
    ATTN_CHECK(piece >= 1, ConfigError, "ring all-reduce: pieces must hold a value, got ", piece);
  }
  int steps() const { return ranks_ == 1 || n_ == 0 ? 0 : 2 * (ranks_ - 1); }
  bool adds(int s) const { return s + 1 < ranks_; }
  int send_chunk(int s) const { return mod(rank_ - s); }
  int recv_chunk(int s) const { return mod(rank_ - s - 1); }
  Index begin(int c) const { return ring_chunk_begin(n_, c, ranks_); }
  int count(int c) const { return static_cast<int>(begin(c + 1) - begin(c)); }
  int right() const { return (rank_ + 1) % ranks_; }
  int left() const { return (rank_ + ranks_ - 1) % ranks_; }

  /// The messages of step s: one for an all-gather step; for a reduce-scatter step, the pieces of
  /// the largest chunk (at least one), the same number on every rank, so that each message sent
  /// meets one posted to receive it (a chunk with fewer pieces sends empty ones at the end).
  int messages(int s) const {
    if (!adds(s)) return 1;
    const Index most = (n_ + ranks_ - 1) / ranks_;
    return most == 0 ? 1 : static_cast<int>(1 + (most - 1) / piece_);
  }

  /// Message k of step s (k < messages(s)).
  RingMessage message(int s, int k) const {
    if (!adds(s))
      return {begin(send_chunk(s)), begin(recv_chunk(s)), count(send_chunk(s)),
              count(recv_chunk(s)), false};
    const auto first = [&](int c) { return std::min<Index>(Index{k} * piece_, count(c)); };
    const auto size = [&](int c) {
      return static_cast<int>(std::min<Index>(piece_, count(c) - first(c)));
    };
    const int send = send_chunk(s), recv = recv_chunk(s);
    return {begin(send) + first(send), begin(recv) + first(recv), size(send), size(recv), true};
  }

 private:
  int mod(int c) const { return ((c % ranks_) + ranks_) % ranks_; }
  Index n_, piece_;
  int rank_, ranks_;
};

/// The scratch a ring all-reduce of n values over `ranks` needs: one piece that arrives in a
/// reduce-scatter step (a chunk, n / ranks + 1 values at most, if that is smaller).
inline Index ring_scratch_values(Index n, int ranks, Index piece = kRingPieceValues) {
  return std::min(piece, n / ranks + 1);
}

namespace detail {

/// ConfigError unless the message `status` describes holds `expected` values: a left neighbour that
/// sums another number of values sends chunks of other sizes (a shorter one was added as if whole,
/// and the sum came out wrong without a word).
inline void check_arrived(const MPI_Status& status, MPI_Datatype type, int expected) {
  int count = 0;
  mpi_check(MPI_Get_count(&status, type, &count), "MPI_Get_count");
  ATTN_CHECK(count != MPI_UNDEFINED, ConfigError, "ring all-reduce: rank ", status.MPI_SOURCE,
             " sent values of another type; every rank must sum the same type");
  ATTN_CHECK(count == expected, ConfigError, "ring all-reduce: rank ", status.MPI_SOURCE, " sent ",
             count, " values where ", expected,
             " were expected; every rank must sum the same number of values");
}

/// mpi_check of a call over the two requests of a ring step: MPI_ERR_IN_STATUS stands for the
/// error in the request's status, which is the one reported.
inline void check_step(int rc, const MPI_Status* statuses, const char* call) {
  if (rc == MPI_ERR_IN_STATUS)
    for (int i = 0; i < 2; ++i)
      if (statuses[i].MPI_ERROR != MPI_SUCCESS) rc = statuses[i].MPI_ERROR;
  mpi_check(rc, call);
}

/// The one addition of the ring, shared by both forms so that they give the same bits.
template <class T>
void ring_add(T* mine, const T* arrived, int count) {
  for (int i = 0; i < count; ++i) mine[i] = arrived[i] + mine[i];
}

}  // namespace detail

/// Sums data[0, n) over the ranks of `comm` in place (RingSchedule, over MPI_Sendrecv): the same
/// bits on every rank and in every run with the same number of ranks, whatever `piece`. `scratch`
/// must hold ring_scratch_values(n, N, piece) elements. Every rank must call it with the same n:
/// a rank that receives a piece of another size throws ConfigError (rather than adding it), and
/// its neighbour may then wait for a message that never comes, as for any rank that stops calling.
template <class T>
void ring_all_reduce(T* data, Index n, T* scratch, MPI_Comm comm, Index piece = kRingPieceValues) {
  const RingSchedule ring(n, detail::comm_rank(comm), detail::comm_size(comm), piece);
  const MPI_Datatype type = detail::mpi_datatype<T>();
  for (int s = 0; s < ring.steps(); ++s)
    for (int k = 0; k < ring.messages(s); ++k) {
      const RingMessage m = ring.message(s, k);
      const int tag = m.adds ? 0 : 1;
      T* into = m.adds ? scratch : data + m.recv_begin;
      MPI_Status status;
      detail::mpi_check(MPI_Sendrecv(data + m.send_begin, m.send_count, type, ring.right(), tag,
                                     into, m.recv_count, type, ring.left(), tag, comm, &status),
                        "MPI_Sendrecv");
      detail::check_arrived(status, type, m.recv_count);
      if (m.adds) detail::ring_add(data + m.recv_begin, scratch, m.recv_count);
    }
}

/// One ring_all_reduce() in flight: the same messages and additions, each message an MPI_Isend and
/// an MPI_Irecv, and the next posted only once both of the last have completed (its partial sum
/// arrived and was added). progress() never waits; wait() does. Allocates nothing.
template <class T>
class RingInFlight {
 public:
  /// Starts summing data[0, n) in place; `scratch` holds ring_scratch_values(n, N, piece)
  /// elements. Both must stay untouched until done(). Every rank must start the same sums with the
  /// same n, piece and tag; sums in flight at once between the same ranks need different tags.
  void start(T* data, Index n, T* scratch, MPI_Comm comm, int tag, Index piece = kRingPieceValues) {
    ATTN_ASSERT(done());
    ring_ = RingSchedule(n, detail::comm_rank(comm), detail::comm_size(comm), piece);
    data_ = data;
    scratch_ = scratch;
    comm_ = comm;
    tag_ = tag;
    step_ = 0;
    message_ = 0;
    if (step_ < ring_.steps()) post();
  }

  bool done() const { return step_ >= ring_.steps(); }

  /// Completes the steps whose messages have arrived, without waiting; true when the sum is done.
  bool progress() {
    while (!done()) {
      int complete = 0;
      detail::check_step(MPI_Testall(2, requests_.data(), &complete, statuses_.data()),
                         statuses_.data(), "MPI_Testall");
      if (!complete) return false;
      next_step();
    }
    return true;
  }

  /// Waits for the remaining steps.
  void wait() {
    while (!done()) {
      detail::check_step(MPI_Waitall(2, requests_.data(), statuses_.data()), statuses_.data(),
                         "MPI_Waitall");
      next_step();
    }
  }

 private:
  void post() {
    const MPI_Datatype type = detail::mpi_datatype<T>();
    const RingMessage m = ring_.message(step_, message_);
    T* into = m.adds ? scratch_ : data_ + m.recv_begin;
    detail::mpi_check(MPI_Irecv(into, m.recv_count, type, ring_.left(), tag_, comm_, &requests_[0]),
                      "MPI_Irecv");
    detail::mpi_check(MPI_Isend(data_ + m.send_begin, m.send_count, type, ring_.right(), tag_,
                                comm_, &requests_[1]),
                      "MPI_Isend");
  }

  // The last message has arrived and been sent: add what arrived (reduce-scatter), post the next.
  void next_step() {
    const RingMessage m = ring_.message(step_, message_);
    detail::check_arrived(statuses_[0], detail::mpi_datatype<T>(), m.recv_count);
    if (m.adds) detail::ring_add(data_ + m.recv_begin, scratch_, m.recv_count);
    if (++message_ == ring_.messages(step_)) {
      message_ = 0;
      ++step_;
    }
    if (!done()) post();
  }

  RingSchedule ring_{0, 0, 1};
  T* data_ = nullptr;
  T* scratch_ = nullptr;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int tag_ = 0, step_ = 0, message_ = 0;
  std::array<MPI_Request, 2> requests_{MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  std::array<MPI_Status, 2> statuses_{};  // of the last receive [0] and send [1]
};

}  // namespace attn
