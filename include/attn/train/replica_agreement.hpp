// That every rank of a data-parallel job starts from the same point: each rank passes a
// fingerprint of what must agree (its parameters, its training data, its options) and all of them
// stop with the same message, naming the first rank that differs, if any does. And, at every
// update, the sum of the ranks' loss statistics, through which one rank's error stops them all.
//
// This header needs MPI (link attn::mpi), like data_parallel.hpp, which includes it.
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/nn/module.hpp"
#include "attn/random.hpp"
#include "attn/train/label_smoothed_loss.hpp"
#include "attn/train/ring_all_reduce.hpp"

namespace attn {

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

/// check_same_on_all_ranks for ranks that may have refused their own input (a non-empty
/// `refusal`, with any `value`): such a rank takes part all the same, so that no rank waits for
/// it, and throws ConfigError(refusal); the others throw the comparison's message, or their own
/// refusal if theirs agree.
inline void check_same_on_all_ranks_or_refuse(std::uint64_t value, const std::string& refusal,
                                              const std::string& what,
                                              MPI_Comm comm = MPI_COMM_WORLD) {
  try {
    check_same_on_all_ranks(value, what, comm);
  } catch (const ConfigError&) {
    if (refusal.empty()) throw;
  }
  ATTN_CHECK(refusal.empty(), ConfigError, refusal);
}

/// Thrown on every rank when one rank reported an error to sum_over_ranks (DataParallel::
/// all_reduce): the message names the first failing rank, so each rank stops with the same
/// message instead of waiting for it.
class ReplicaError : public Error {
 public:
  using Error::Error;
};

/// The sums of every rank's statistics, added in rank order (the same bits on every rank), with
/// `all` as scratch ([N, 4]). If any rank passes a non-empty `local_error`, every rank throws
/// ReplicaError with the message of the lowest such rank instead: one rank's bad batch stops all,
/// none hangs.
inline LossStats sum_over_ranks(const LossStats& local, const std::string& local_error,
                                MPI_Comm comm, std::vector<double>& all) {
  const int ranks = detail::comm_size(comm);
  const std::array<double, 4> mine{local.smoothed_loss, local.nll,
                                   static_cast<double>(local.tokens),
                                   static_cast<double>(local_error.size())};
  all.resize(4 * static_cast<std::size_t>(ranks));
  detail::mpi_check(MPI_Allgather(mine.data(), 4, MPI_DOUBLE, all.data(), 4, MPI_DOUBLE, comm),
                    "MPI_Allgather");
  LossStats sum;
  for (int r = 0; r < ranks; ++r) {
    const double* s = all.data() + 4 * r;
    if (s[3] > 0) {  // the first failing rank's message, sent to all
      const int length = static_cast<int>(s[3]);
      std::string message = r == detail::comm_rank(comm) ? local_error : std::string(length, '\0');
      detail::mpi_check(MPI_Bcast(message.data(), length, MPI_CHAR, r, comm), "MPI_Bcast");
      throw ReplicaError(detail::concat("rank ", r, " of ", ranks, ": ", message));
    }
    sum.smoothed_loss += s[0];
    sum.nll += s[1];
    sum.tokens += static_cast<Index>(s[2]);
  }
  return sum;
}

/// A 64-bit FNV-1a fingerprint of every parameter's bits, in order (for check_same_on_all_ranks).
template <class T>
std::uint64_t parameter_fingerprint(const std::vector<NamedParameter<T>>& params) {
  std::uint64_t h = kFnv1aOffset;
  for (const auto& p : params)
    h = fnv1a(h, p.value.data(), static_cast<std::size_t>(p.value.numel()) * sizeof(T));
  return h;
}

}  // namespace attn
