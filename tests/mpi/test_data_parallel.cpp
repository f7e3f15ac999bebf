// attn/train/data_parallel.hpp's blocking sums under mpirun (ctest runs the MPI tests on 2 and on
// 3 ranks): the gradient all-reduce against one process on the whole batch, how a model is cut
// into buckets, and the loss statistics. The overlapped sums are test_overlapped_sums.cpp's.
#include <gtest/gtest.h>
#include <mpi.h>

#include <attn/train/clip.hpp>
#include <attn/train/data_parallel.hpp>

#include <vector>

#include "mpi_testing.hpp"

namespace attn {
namespace {

// Plain SGD, theta -= lr g: the parameters then differ exactly as much as the gradients do.
// (Adam would divide each gradient by sqrt(v) + eps, eps = 1e-9: the key part of in_proj_bias has
// a gradient that is zero in exact arithmetic, softmax being invariant to a per-query shift, so
// its ~1e-17 rounding noise, which differs between the two computations, becomes updates of
// lr * 1e-8 that are all noise. That is Adam's property, not the reduction's.)
template <class T>
void sgd_step(const std::vector<NamedParameter<T>>& params, double lr) {
  for (auto p : params) p.value.vector() -= static_cast<T>(lr) * p.grad.vector();
}

// k steps with per-rank batch b on N ranks against one process with batch N b, in double,
// dropout off: the parameters agree to 1e-12 relative on every rank. `scatter`: the replica's
// buckets that hold a decoder norm pack (scatter_norm_gradients); else every bucket is summed
// where the gradients lie.
void expect_same_as_one_process(std::size_t bucket_bytes, bool scatter) {
  const int rank = testing::world_rank(), ranks = testing::world_size();
  const Index vocab = 23, b = 3, steps = 4;
  const double lr = 0.5;
  const TransformerConfig config = testing::task_config(vocab, 0.0);
  ASSERT_TRUE(config.share_embeddings);  // the tied weight must be reduced once
  testing::Trainer<double> whole(config), replica(config);
  if (scatter) testing::scatter_norm_gradients(replica);
  DataParallel<double> dp(replica.model.parameters(), MPI_COMM_WORLD,
                          testing::buckets_of(bucket_bytes));
  if (scatter) {
    EXPECT_GT(dp.packed_buckets(), 0u);
    EXPECT_LT(dp.packed_buckets(), dp.buckets());
  } else {
    EXPECT_EQ(dp.packed_buckets(), 0u);
  }
  for (Index k = 0; k < steps; ++k) {
    const testing::Batch batch = testing::stream_batch(5, k, b * ranks, vocab);
    const Index tokens = count_tokens(batch.tgt_out, testing::kPad);
    whole.adam.zero_grad();
    whole.loss.forward_backward(whole.model.forward(batch.src, batch.tgt_in), batch.tgt_out,
                                1.0 / static_cast<double>(tokens), k + 1);
    whole.model.backward(whole.loss.dlogits());
    sgd_step(whole.model.parameters(), lr);

    const testing::Batch mine = testing::share_of(batch, rank, ranks);
    replica.adam.zero_grad();
    const LossStats local = replica.loss.forward_backward(
        replica.model.forward(mine.src, mine.tgt_in), mine.tgt_out, 1.0, k + 1);
    replica.model.backward(replica.loss.dlogits());
    const LossStats global = dp.all_reduce(local);
    ASSERT_EQ(global.tokens, tokens);
    dp.all_reduce_gradients();
    scale_gradients(replica.model.parameters(), 1.0 / static_cast<double>(global.tokens));
    sgd_step(replica.model.parameters(), lr);
  }
  const auto expected = whole.model.parameters(), got = replica.model.parameters();
  const testing::Trainer<double> untrained(config);
  const auto initial = untrained.model.parameters();
  ASSERT_EQ(expected.size(), got.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double scale = expected[i].value.vector().cwiseAbs().maxCoeff();
    const double diff = (expected[i].value.vector() - got[i].value.vector()).cwiseAbs().maxCoeff();
    EXPECT_LE(diff, 1e-12 * scale) << got[i].name << " on rank " << rank;
    // The test means something: every tensor moved, by far more than the tolerance.
    EXPECT_GT((initial[i].value.vector() - got[i].value.vector()).cwiseAbs().maxCoeff(),
              1e-6 * scale)
        << got[i].name;
  }
  EXPECT_NO_THROW(check_same_on_all_ranks(parameter_fingerprint(got), "parameters"));
}

TEST(DataParallel, RanksWithShareOfBatchEqualOneProcessWithWholeBatch) {
  expect_same_as_one_process(DataParallelOptions{}.bucket_bytes, false);
}

TEST(DataParallel, SmallBucketsOfSeveralTensorsGiveTheSameResult) {
  expect_same_as_one_process(4096, false);
}

TEST(DataParallel, PackedBucketsGiveTheSameResult) {
  expect_same_as_one_process(4096, true);
  expect_same_as_one_process(DataParallelOptions{}.bucket_bytes, true);
}

TEST(DataParallel, BucketCountFollowsBucketBytesAndMinBuckets) {
  testing::Trainer<float> t(testing::task_config(23, 0.0));
  const auto params = t.model.parameters();
  DataParallel<float> one_bucket(params, MPI_COMM_WORLD, testing::at_least(1));
  EXPECT_EQ(one_bucket.buckets(), 1u);  // ~60 K floats fit one 32 MB bucket
  // By default a model that fits one bucket is cut into quarters (greedily, so 4 to 8 buckets),
  // so that the sums of its top layers can start while backward computes the lower ones.
  DataParallel<float> quarters(params);
  EXPECT_GE(quarters.buckets(), 4u);
  EXPECT_LE(quarters.buckets(), 8u);
  EXPECT_THROW(DataParallel<float>(params, MPI_COMM_WORLD, testing::at_least(0)), ConfigError);
  DataParallel<float> several(params, MPI_COMM_WORLD, testing::buckets_of(16384));
  EXPECT_GT(several.buckets(), 1u);
  EXPECT_LT(several.buckets(), params.size());
}

TEST(DataParallel, LossStatisticsAreSummedOverRanks) {
  const int rank = testing::world_rank(), ranks = testing::world_size();
  testing::Trainer<float> t(testing::task_config(23, 0.0));
  DataParallel<float> dp(t.model.parameters());
  LossStats local;
  local.smoothed_loss = 1.5 * (rank + 1);
  local.nll = 0.25 * (rank + 1);
  local.tokens = 10 * (rank + 1);
  const LossStats sum = dp.all_reduce(local);
  const double n = ranks * (ranks + 1) / 2;
  EXPECT_EQ(sum.smoothed_loss, 1.5 * n);
  EXPECT_EQ(sum.nll, 0.25 * n);
  EXPECT_EQ(sum.tokens, static_cast<Index>(10 * n));
}

}  // namespace
}  // namespace attn
