// attn/train/data_parallel.hpp's packed buckets under mpirun (part of test_data_parallel): the
// gradients of a model that does not gather them into one buffer are packed, and their overlapped
// sums share DataParallelOptions::packed_in_flight buffers. Sums whose buckets become final in a
// different order on every rank, through fewer buffers than buckets, are exact and never hang.
#include <gtest/gtest.h>
#include <mpi.h>

#include <attn/train/data_parallel.hpp>

#include <string>
#include <vector>

#include "error_helpers.hpp"
#include "mpi_testing.hpp"

namespace attn {
namespace {

constexpr Index kTensors = 8, kValues = 100;

// Sets every gradient to (rank + 1) times its global index: small integers, so every sum over
// ranks is exact in float.
void set_gradients(std::vector<NamedParameter<float>>& params, int rank) {
  for (Index t = 0; t < kTensors; ++t)
    for (Index j = 0; j < kValues; ++j)
      params[t].grad(j) = static_cast<float>((rank + 1) * (t * kValues + j));
}

// kTensors gradients of kValues each, every one its own allocation (set_gradients).
std::vector<NamedParameter<float>> separate_gradients(int rank) {
  std::vector<NamedParameter<float>> params;
  for (Index t = 0; t < kTensors; ++t)
    params.push_back({"p" + std::to_string(t), Tensor<float>({kValues}), Tensor<float>({kValues})});
  set_gradients(params, rank);
  return params;
}

// Buckets of two tensors each: four packed buckets.
DataParallelOptions two_tensors_per_bucket(std::size_t packed_in_flight) {
  DataParallelOptions options;
  options.bucket_bytes = 2 * kValues * sizeof(float);
  options.min_buckets = 1;
  options.packed_in_flight = packed_in_flight;
  return options;
}

// The order in which this rank's backward reports its parameters final: the buckets' order on
// rank 0, the reverse on rank 1 (its first ready bucket is the last to start), outside in on the
// others.
std::vector<Index> report_order(int rank) {
  std::vector<Index> ids;
  for (Index k = 0; k < kTensors; ++k) {
    const Index outside_in = k % 2 == 0 ? k / 2 : kTensors - 1 - k / 2;
    ids.push_back(rank == 0 ? kTensors - 1 - k : rank == 1 ? k : outside_in);
  }
  return ids;
}

// Sums over the ranks of `contributing` ranks' gradients (the others' are zero).
void expect_exact_sums(const std::vector<NamedParameter<float>>& params, int contributing) {
  const int weight = contributing * (contributing + 1) / 2;  // sum of rank + 1 over them
  for (Index t = 0; t < kTensors; ++t)
    for (Index j = 0; j < kValues; ++j)
      ASSERT_EQ(params[t].grad(j), static_cast<float>(weight * (t * kValues + j)))
          << params[t].name << "[" << j << "]";
}

// Should the packed buckets start in different orders on different ranks, this test hangs until
// ctest's timeout instead of failing.
TEST(PackedBuckets, FinalInAnotherOrderOnEachRankWithFewerBuffersThanBuckets) {
  const int rank = testing::world_rank(), ranks = testing::world_size();
  for (std::size_t buffers : {1, 2, 4}) {
    SCOPED_TRACE(buffers);
    auto params = separate_gradients(rank);
    DataParallel<float> dp(params, MPI_COMM_WORLD, two_tensors_per_bucket(buffers));
    ASSERT_EQ(dp.buckets(), 4u);
    ASSERT_EQ(dp.packed_buckets(), 4u);
    dp.begin_overlapped();
    for (Index id : report_order(rank)) dp.gradients_final({id});
    dp.finish_overlapped();
    expect_exact_sums(params, ranks);
    EXPECT_EQ(dp.packed_buffers(), ranks > 1 ? buffers : 1u);
  }
}

TEST(PackedBuckets, ARankWithoutBackwardStartsThemInTurnAtFinish) {
  // The last rank has no rows (or failed before backward): its gradients are zero and it starts
  // every sum at the end, through one buffer, while the others report theirs.
  const int rank = testing::world_rank(), ranks = testing::world_size();
  auto params = separate_gradients(rank);
  DataParallel<float> dp(params, MPI_COMM_WORLD, two_tensors_per_bucket(1));
  dp.begin_overlapped();
  if (rank + 1 == ranks) {
    for (auto& p : params) p.grad.vector().setZero();
    dp.start_remaining();
  } else {
    for (Index id : report_order(rank)) dp.gradients_final({id});
  }
  dp.finish_overlapped();
  expect_exact_sums(params, ranks - 1);
}

TEST(PackedBuckets, TheBlockingSumMayNotRunWhileOverlappedSumsAreInFlight) {
  auto params = separate_gradients(testing::world_rank());
  DataParallel<float> dp(params, MPI_COMM_WORLD, two_tensors_per_bucket(2));
  dp.begin_overlapped();
  EXPECT_THROW(dp.all_reduce_gradients(), Error);
  dp.start_remaining();
  dp.finish_overlapped();
  expect_exact_sums(params, testing::world_size());
}

TEST(PackedBuckets, OneRankSumsNothingAndHoldsOneBuffer) {
  const int rank = testing::world_rank();
  auto params = separate_gradients(rank);
  DataParallel<float> dp(params, MPI_COMM_SELF, two_tensors_per_bucket(2));
  dp.begin_overlapped();
  for (Index id : report_order(1)) dp.gradients_final({id});  // the last bucket first
  EXPECT_EQ(dp.buckets_started(), 4u);
  dp.finish_overlapped();
  dp.all_reduce_gradients();
  const auto mine = separate_gradients(rank);
  for (Index t = 0; t < kTensors; ++t)
    EXPECT_TRUE(params[t].grad.vector() == mine[t].grad.vector()) << params[t].name;
  EXPECT_EQ(dp.packed_buffers(), 1u);  // the blocking form's, never used
}

TEST(PackedBuckets, AnUnreportedParameterIsNamedAndTheBucketsQueuedBehindItToo) {
  // p7 is in the first bucket: the three packed buckets after it queue behind it.
  auto params = separate_gradients(testing::world_rank());
  DataParallel<float> dp(params, MPI_COMM_WORLD, two_tensors_per_bucket(1));
  dp.begin_overlapped();
  for (Index id = 0; id + 1 < kTensors; ++id) dp.gradients_final({id});
  EXPECT_EQ(dp.buckets_started(), 0u);
  EXPECT_EQ(testing::error_of<Error>([&] { dp.finish_overlapped(); }),
            "DataParallel::finish_overlapped: backward never reported p7 final, so its sum over "
            "the ranks never started (does the model's backward call its gradient hook after "
            "every stage?); nor did the 3 packed buckets after it, which start in turn");
  // The ranks are in step again: the next overlapped sum completes.
  set_gradients(params, testing::world_rank());
  dp.begin_overlapped();
  dp.start_remaining();
  dp.finish_overlapped();
  expect_exact_sums(params, testing::world_size());
}

}  // namespace
}  // namespace attn
