// That every rank of a data-parallel job starts from the same point: each rank passes a
// fingerprint of what must agree (its parameters, its training data, its options) and all of them
// stop with the same message, naming the first rank that differs, if any does.
//
// This header needs MPI (link attn::mpi), like data_parallel.hpp, which includes it.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/nn/module.hpp"
#include "attn/random.hpp"
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

/// A 64-bit FNV-1a fingerprint of every parameter's bits, in order (for check_same_on_all_ranks).
template <class T>
std::uint64_t parameter_fingerprint(const std::vector<NamedParameter<T>>& params) {
  std::uint64_t h = kFnv1aOffset;
  for (const auto& p : params)
    h = fnv1a(h, p.value.data(), static_cast<std::size_t>(p.value.numel()) * sizeof(T));
  return h;
}

}  // namespace attn
