// attn/train/ring_all_reduce.hpp under mpirun (part of test_data_parallel): exact integer sums for
// every size, the same bits on every rank and in every run, and pieces of any size giving the bits
// of one piece per step, blocking and in flight.
#include <gtest/gtest.h>
#include <mpi.h>

#include <attn/train/data_parallel.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "mpi_testing.hpp"

namespace attn {
namespace {

TEST(RingAllReduce, SumsIntegersExactlyForEverySizeIncludingFewerElementsThanRanks) {
  const int rank = testing::world_rank(), ranks = testing::world_size();
  for (Index n : {Index{0}, Index{1}, Index{2}, Index{5}, Index{1000}, Index{4097}}) {
    std::vector<float> data(static_cast<std::size_t>(n)), scratch(n / ranks + 1);
    for (Index i = 0; i < n; ++i) data[i] = static_cast<float>((rank + 1) * 1000 + i % 97);
    ring_all_reduce(data.data(), n, scratch.data(), MPI_COMM_WORLD);
    const double rank_sum = ranks * (ranks + 1) / 2 * 1000.0;
    for (Index i = 0; i < n; ++i)
      ASSERT_EQ(data[i], static_cast<float>(rank_sum + ranks * (i % 97)))
          << "n " << n << " i " << i;
  }
}

TEST(RingAllReduce, SameBitsOnEveryRankAndInEveryRun) {
  const int rank = testing::world_rank();
  const Index n = 10007;
  std::vector<float> first(n), again(n), scratch(n);
  Rng rng(42 + rank);
  for (float& v : first) v = static_cast<float>(rng.normal() * std::pow(10.0, rng.uniform(-6, 6)));
  again = first;
  ring_all_reduce(first.data(), n, scratch.data(), MPI_COMM_WORLD);
  ring_all_reduce(again.data(), n, scratch.data(), MPI_COMM_WORLD);
  ASSERT_EQ(0, std::memcmp(first.data(), again.data(), n * sizeof(float)));
  Tensor<float> t({n});
  std::copy(first.begin(), first.end(), t.data());
  EXPECT_NO_THROW(
      check_same_on_all_ranks(parameter_fingerprint<float>({{"sum", t, t}}), "reduced values"));
}

// Reduce-scatter steps in pieces of 1, 3, 7 ... values: the same bits as in one piece per step,
// in both forms, each with no more scratch than ring_scratch_values (exactly that much is
// allocated, so a longer write is out of bounds under ASan).
TEST(RingAllReduce, PiecesOfAnySizeGiveTheSameBitsInBothForms) {
  const int rank = testing::world_rank(), ranks = testing::world_size();
  for (Index n : {Index{0}, Index{1}, Index{5}, Index{1000}, Index{10007}}) {
    std::vector<float> values(static_cast<std::size_t>(n));
    Rng rng(7 + rank);
    for (float& v : values)
      v = static_cast<float>(rng.normal() * std::pow(10.0, rng.uniform(-4, 4)));
    std::vector<float> whole = values, scratch(static_cast<std::size_t>(n / ranks + 1));
    ring_all_reduce(whole.data(), n, scratch.data(), MPI_COMM_WORLD, n + 1);  // one per step
    for (Index piece : {Index{1}, Index{3}, Index{7}, Index{1000}, kRingPieceValues}) {
      const Index need = ring_scratch_values(n, ranks, piece);
      std::vector<float> blocking = values, in_flight = values,
                         room(static_cast<std::size_t>(need));
      ring_all_reduce(blocking.data(), n, room.data(), MPI_COMM_WORLD, piece);
      RingInFlight<float> ring;
      ring.start(in_flight.data(), n, room.data(), MPI_COMM_WORLD, 5, piece);
      ring.wait();
      ASSERT_TRUE(ring.done());
      const auto same = [&](const std::vector<float>& x) {  // (no memcmp of null for n = 0)
        return n == 0 || std::memcmp(whole.data(), x.data(), n * sizeof(float)) == 0;
      };
      ASSERT_TRUE(same(blocking)) << "n " << n << " piece " << piece;
      ASSERT_TRUE(same(in_flight)) << "n " << n << " piece " << piece;
    }
  }
}

}  // namespace
}  // namespace attn
