// What the ranks must agree on before they sum (part of test_data_parallel): a DataParallel
// whose ranks would sum other layouts, or a ring all-reduce whose ranks pass other counts, ends
// with an attn::Error on every rank. Before, the first hung or let Open MPI write past the ring's
// scratch (found with ASan), and the second returned a wrong sum without a word.
#include <gtest/gtest.h>
#include <mpi.h>

#include <attn/train/data_parallel.hpp>

#include <string>
#include <vector>

#include "error_helpers.hpp"
#include "mpi_testing.hpp"

namespace attn {
namespace {

// Gradients of the given sizes, one allocation each.
std::vector<NamedParameter<float>> parameters_of(const std::vector<Index>& sizes) {
  std::vector<NamedParameter<float>> params;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    params.push_back(
        {"p" + std::to_string(i), Tensor<float>({sizes[i]}), Tensor<float>({sizes[i]})});
  return params;
}

// The message of the ConfigError constructing a DataParallel with these arguments throws.
std::string refusal(const std::vector<Index>& sizes, const DataParallelOptions& options) {
  return testing::error_of<ConfigError>(
      [&] { DataParallel<float> dp(parameters_of(sizes), MPI_COMM_WORLD, options); });
}

TEST(RankAgreement, AnotherParameterOnTheLastRankIsRefusedOnEveryRank) {
  const bool last = testing::world_rank() == testing::world_size() - 1;
  const std::vector<Index> sizes =
      last ? std::vector<Index>{10, 20, 3} : std::vector<Index>{10, 20};
  const std::string message = refusal(sizes, {});
  EXPECT_TRUE(testing::contains(message, "gradient layout")) << message;
  EXPECT_TRUE(testing::contains(message, "rank " + std::to_string(testing::world_size() - 1)))
      << message;
}

TEST(RankAgreement, AnotherShapeOrBucketSizeOrPieceSizeIsRefusedOnEveryRank) {
  const bool last = testing::world_rank() == testing::world_size() - 1;
  EXPECT_TRUE(testing::contains(refusal({10, last ? 21 : 20}, {}), "gradient layout"));
  DataParallelOptions buckets;  // one bucket of both gradients, or one bucket each
  buckets.min_buckets = 1;
  buckets.bucket_bytes = last ? 40 : 4000;
  EXPECT_TRUE(testing::contains(refusal({10, 20}, buckets), "gradient layout"));
  DataParallelOptions pieces;
  pieces.piece_bytes = last ? 8 : 4096;
  EXPECT_TRUE(testing::contains(refusal({10, 20}, pieces), "gradient layout"));
  // The same layout everywhere still constructs, and sums.
  auto params = parameters_of({10, 20});
  for (auto& p : params) p.grad.fill(1.0f);
  DataParallel<float> dp(params);
  dp.all_reduce_gradients();
  EXPECT_EQ(params[1].grad(19), static_cast<float>(testing::world_size()));
}

TEST(RankAgreement, ARankThatRefusesItsOptionsIsNotWaitedFor) {
  // The options are checked on each rank alone; the refusing rank still takes part in the
  // comparison, so the others throw too instead of waiting for it there.
  const bool last = testing::world_rank() == testing::world_size() - 1;
  DataParallelOptions options;
  options.packed_in_flight = last ? 0 : 2;
  const std::string message = refusal({10, 20}, options);
  if (last)
    EXPECT_TRUE(testing::contains(message, "packed_in_flight must be at least 1")) << message;
  else
    EXPECT_TRUE(testing::contains(message, "or a refused option")) << message;
}

// Two ranks whose counts differ so that each receives a chunk of another size in the first step:
// rank 0 sums 1,000 values (chunks of 500), rank 1 1,002 (chunks of 501). Rank 1 receives 500
// values where it expects 501, rank 0 501 where it expects 500 (MPI_ERR_TRUNCATE): both throw.
// On more ranks some ranks would wait for a message that never comes, so it runs on 2 only.
TEST(RankAgreement, ARingAllReduceOverAnotherCountThrowsInsteadOfSummingWrong) {
  if (testing::world_size() != 2) GTEST_SKIP() << "needs exactly 2 ranks";
  MPI_Comm comm;
  ASSERT_EQ(MPI_Comm_dup(MPI_COMM_WORLD, &comm), MPI_SUCCESS);
  ASSERT_EQ(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), MPI_SUCCESS);
  const Index n = testing::world_rank() == 0 ? 1000 : 1002;
  std::vector<float> data(static_cast<std::size_t>(n), 1.0f);
  std::vector<float> scratch(static_cast<std::size_t>(ring_scratch_values(1002, 2)));
  const std::string message =
      testing::error_of<Error>([&] { ring_all_reduce(data.data(), n, scratch.data(), comm); });
  if (testing::world_rank() == 1)
    EXPECT_TRUE(testing::contains(message, "rank 0 sent 500 values where 501 were expected"))
        << message;
  else
    EXPECT_FALSE(message.empty());
  MPI_Comm_free(&comm);
}

TEST(DataParallel, AnErrorOnOneRankIsThrownOnEveryRankWithItsMessage) {
  const int rank = testing::world_rank(), ranks = testing::world_size();
  testing::Trainer<float> t(testing::task_config(23, 0.0));
  DataParallel<float> dp(t.model.parameters());
  const int bad = ranks - 1;
  const std::string error = rank == bad ? "loss is NaN at step 7" : "";
  EXPECT_EQ(
      testing::error_of<ReplicaError>([&] { dp.all_reduce(LossStats{}, error); }),
      "rank " + std::to_string(bad) + " of " + std::to_string(ranks) + ": loss is NaN at step 7")
      << "on rank " << rank;
  // The ranks are in step again: the next reduction works.
  EXPECT_EQ(dp.all_reduce(LossStats{}).tokens, 0);
}

TEST(DataParallel, DifferentStartingPointsAreNamed) {
  const int rank = testing::world_rank();
  const std::string message = testing::error_of<ConfigError>(
      [&] { check_same_on_all_ranks(rank == 1 ? 2 : 1, "training data"); });
  EXPECT_TRUE(testing::contains(message, "rank 1's training data differ from rank 0's")) << message;
}

}  // namespace
}  // namespace attn
