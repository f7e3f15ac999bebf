// attn/train/data_parallel.hpp's overlapped sums under mpirun (part of test_data_parallel): each
// bucket's sum started during backward, as its gradients become final, gives the bits of the
// blocking sum after backward, with one or many buckets, packed or not, accumulation, small ring
// pieces and a rank without backward; misuse is named.
#include <gtest/gtest.h>
#include <mpi.h>

#include <attn/train/data_parallel.hpp>

#include <algorithm>
#include <vector>

#include "error_helpers.hpp"
#include "mpi_testing.hpp"

namespace attn {
namespace {

// One update's forward and backward passes on this rank's share of `passes` batches, summed into
// the gradients (accumulation); `before_last` runs before the last backward pass.
template <class T, class F>
void accumulate(testing::Trainer<T>& t, Index step, Index passes, Index rows_per_rank,
                F&& before_last) {
  const int rank = testing::world_rank(), ranks = testing::world_size();
  t.model.train();
  t.adam.zero_grad();
  for (Index p = 0; p < passes; ++p) {
    const testing::Batch batch = testing::stream_batch(5 + p, step, rows_per_rank * ranks, 23);
    const testing::Batch mine = testing::share_of(batch, rank, ranks);
    t.loss.forward_backward(t.model.forward(mine.src, mine.tgt_in), mine.tgt_out, 1.0, step + 1);
    if (p + 1 == passes) before_last();
    t.model.backward(t.loss.dlogits());
  }
}

// k Adam steps of two replicas of one model on every rank, dropout on: one sums its gradients
// with all_reduce_gradients() after backward, the other with the overlapped form during the last
// backward pass of each update. The gradients are the same bits after every step, the
// parameters after k, and some bucket's sum started before backward had ended. `scatter`: both
// replicas' buckets that hold a decoder norm pack. `piece_bytes` and `packed_in_flight`: the
// overlapped replica's ring messages and buffers for packed buckets (the blocking one keeps the
// defaults).
template <class T>
void expect_overlapped_equals_blocking(
    std::size_t bucket_bytes, Index passes, bool scatter = false,
    std::size_t piece_bytes = DataParallelOptions{}.piece_bytes,
    std::size_t packed_in_flight = DataParallelOptions{}.packed_in_flight) {
  const Index steps = 3;
  const TransformerConfig config = testing::task_config(23, 0.1);
  testing::Trainer<T> blocking(config), overlapped(config);
  if (scatter) {
    testing::scatter_norm_gradients(blocking);
    testing::scatter_norm_gradients(overlapped);
  }
  DataParallelOptions options = testing::buckets_of(bucket_bytes);
  DataParallel<T> dp_blocking(blocking.model.parameters(), MPI_COMM_WORLD, options);
  options.piece_bytes = piece_bytes;
  options.packed_in_flight = packed_in_flight;
  DataParallel<T> dp(overlapped.model.parameters(), MPI_COMM_WORLD, options);
  EXPECT_EQ(dp.packed_buckets() > 0, scatter);
  EXPECT_EQ(dp.packed_buffers(), scatter ? 1u : 0u);  // the blocking form's
  dp.reduce_during_backward(overlapped.model);
  // The same hook, and a record of how many sums had started at each of its calls.
  std::vector<std::size_t> started;
  overlapped.model.set_gradient_hook([&](const std::vector<Index>& ids) {
    dp.gradients_final(ids);
    started.push_back(dp.buckets_started());
  });
  const auto a = blocking.model.parameters(), b = overlapped.model.parameters();
  for (Index k = 0; k < steps; ++k) {
    accumulate(blocking, k, passes, 2, [] {});
    dp_blocking.all_reduce_gradients();
    started.clear();
    accumulate(overlapped, k, passes, 2, [&] { dp.begin_overlapped(); });
    const std::size_t stages = overlapped.model.backward_stages().size();
    ASSERT_EQ(started.size(), passes * stages);  // the hook fired in every pass ...
    // ... and counted only in the last, where the sums started before its last stage.
    if (passes > 1) {
      EXPECT_EQ(started[stages - 1], 0u);
    }
    // By the end of backward every sum had started but for packed ones queued for a buffer.
    const std::size_t may_queue =
        dp.packed_buckets() - std::min(packed_in_flight, dp.packed_buckets());
    EXPECT_GE(started.back() + may_queue, dp.buckets());
    EXPECT_LE(started.back(), dp.buckets());
    if (dp.buckets() > 1) {
      EXPECT_GT(started[started.size() - 2], 0u);
    }
    dp.finish_overlapped();
    for (std::size_t i = 0; i < a.size(); ++i)
      ASSERT_TRUE(testing::same_bits(a[i].grad, b[i].grad)) << a[i].name << " at step " << k;
    // The packed sums in flight shared packed_in_flight buffers, the first being the blocking
    // form's (one rank has no other sum to send, and nothing to pack).
    const std::size_t buffers = std::min(packed_in_flight, dp.packed_buckets());
    EXPECT_EQ(dp.packed_buffers(), testing::world_size() > 1 ? buffers
                                   : dp.packed_buckets() > 0 ? 1
                                                             : 0);
    const double lr = noam_lr(k + 1, config.d_model, 2, 1.0);
    blocking.adam.step(lr);
    overlapped.adam.step(lr);
  }
  const testing::Trainer<T> untrained(config);
  const auto initial = untrained.model.parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(testing::same_bits(a[i].value, b[i].value)) << a[i].name;
    EXPECT_FALSE(testing::same_bits(initial[i].value, b[i].value)) << b[i].name << " never moved";
  }
  // The gradients were summed: the ranks, which trained on different rows, agree.
  EXPECT_NO_THROW(check_same_on_all_ranks(parameter_fingerprint(b), "parameters"));
}

TEST(DataParallelOverlapped, OneBucketGivesTheSameBitsAsTheBlockingSum) {
  expect_overlapped_equals_blocking<float>(DataParallelOptions{}.bucket_bytes, 1);
}

TEST(DataParallelOverlapped, ManyBucketsInFlightGiveTheSameBitsFloat) {
  expect_overlapped_equals_blocking<float>(4096, 1);
}

TEST(DataParallelOverlapped, ManyBucketsInFlightGiveTheSameBitsDouble) {
  expect_overlapped_equals_blocking<double>(8192, 1);
}

TEST(DataParallelOverlapped, PackedBucketsInFlightGiveTheSameBits) {
  expect_overlapped_equals_blocking<float>(4096, 1, true);
  expect_overlapped_equals_blocking<double>(8192, 2, true);
}

TEST(DataParallelOverlapped, PackedBucketsShareAFewBuffersAndGiveTheSameBits) {
  // 512-byte buckets: the decoder norms' gradients make more packed buckets (4 in float, 6 in
  // double) than buffers, so they queue in turn for one, two or three.
  testing::Trainer<float> f(testing::task_config(23, 0.1));
  testing::Trainer<double> d(testing::task_config(23, 0.1));
  testing::scatter_norm_gradients(f);
  testing::scatter_norm_gradients(d);
  ASSERT_GT(DataParallel<float>(f.model.parameters(), MPI_COMM_WORLD, testing::buckets_of(512))
                .packed_buckets(),
            3u);
  ASSERT_GT(DataParallel<double>(d.model.parameters(), MPI_COMM_WORLD, testing::buckets_of(512))
                .packed_buckets(),
            3u);
  for (std::size_t buffers : {1, 2, 3}) {
    SCOPED_TRACE(buffers);
    expect_overlapped_equals_blocking<float>(512, 1, true, DataParallelOptions{}.piece_bytes,
                                             buffers);
    expect_overlapped_equals_blocking<double>(512, 2, true, 200, buffers);
  }
  testing::Trainer<float> t(testing::task_config(23, 0.0));
  DataParallelOptions options;
  options.packed_in_flight = 0;
  EXPECT_THROW(DataParallel<float>(t.model.parameters(), MPI_COMM_WORLD, options), ConfigError);
}

TEST(DataParallelOverlapped, OneTensorPerBucketWithAccumulationGivesTheSameBits) {
  expect_overlapped_equals_blocking<float>(sizeof(float), 2);  // every tensor reduced in place
}

TEST(DataParallelOverlapped, SmallRingPiecesGiveTheSameBits) {
  expect_overlapped_equals_blocking<float>(4096, 1, false, 64);  // 16 floats per message
  expect_overlapped_equals_blocking<double>(DataParallelOptions{}.bucket_bytes, 2, true, 200);
  testing::Trainer<float> t(testing::task_config(23, 0.0));
  DataParallelOptions options;
  options.piece_bytes = sizeof(float) - 1;
  EXPECT_THROW(DataParallel<float>(t.model.parameters(), MPI_COMM_WORLD, options), ConfigError);
}

TEST(DataParallelOverlapped, ARankWithoutBackwardStartsItsSumsAtFinish) {
  // The last rank has no rows in its share (or failed before backward): its gradients are zero
  // and it starts every sum at the end, while the others start theirs during backward.
  const int rank = testing::world_rank(), ranks = testing::world_size();
  const TransformerConfig config = testing::task_config(23, 0.0);
  testing::Trainer<float> blocking(config), overlapped(config);
  DataParallel<float> dp_blocking(blocking.model.parameters(), MPI_COMM_WORLD,
                                  testing::buckets_of(4096));
  DataParallel<float> dp(overlapped.model.parameters(), MPI_COMM_WORLD, testing::buckets_of(4096));
  dp.reduce_during_backward(overlapped.model);
  if (rank + 1 == ranks) {
    blocking.adam.zero_grad();
    overlapped.adam.zero_grad();
    dp.begin_overlapped();
    dp.start_remaining();
  } else {
    accumulate(blocking, 0, 1, 2, [] {});
    accumulate(overlapped, 0, 1, 2, [&] { dp.begin_overlapped(); });
  }
  dp_blocking.all_reduce_gradients();
  dp.finish_overlapped();
  const auto a = blocking.model.parameters(), b = overlapped.model.parameters();
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(testing::same_bits(a[i].grad, b[i].grad)) << a[i].name;
}

TEST(DataParallelOverlapped, AParameterBackwardNeverReportedIsNamedAtFinish) {
  testing::Trainer<float> t(testing::task_config(23, 0.0));
  const auto params = t.model.parameters();
  DataParallel<float> dp(params, MPI_COMM_WORLD, testing::buckets_of(4096));
  ASSERT_EQ(params[0].name, "src_embed.weight");
  // A hook that forgets the shared embedding: every other bucket's sum runs, its never starts.
  std::vector<Index> all_but_first;
  for (std::size_t i = 1; i < params.size(); ++i) all_but_first.push_back(static_cast<Index>(i));
  dp.begin_overlapped();
  dp.gradients_final(all_but_first);
  EXPECT_EQ(testing::error_of<Error>([&] { dp.finish_overlapped(); }),
            "DataParallel::finish_overlapped: backward never reported src_embed.weight final, so "
            "its sum over the ranks never started (does the model's backward call its gradient "
            "hook after every stage?)");
  // Reported twice is refused at once.
  dp.begin_overlapped();
  dp.gradients_final({1});
  EXPECT_THROW(dp.gradients_final({1}), StateError);
  EXPECT_THROW(dp.gradients_final({static_cast<Index>(params.size())}), IndexError);
  // The ranks are in step again: the next overlapped sum completes.
  dp.start_remaining();
  EXPECT_NO_THROW(dp.finish_overlapped());
  EXPECT_THROW(dp.finish_overlapped(), StateError);  // no begin_overlapped
}

TEST(DataParallelOverlapped, AModelWithOtherParametersIsRefused) {
  testing::Trainer<float> t(testing::task_config(23, 0.0)), other(testing::task_config(23, 0.0));
  DataParallel<float> dp(t.model.parameters());
  EXPECT_THROW(dp.reduce_during_backward(other.model), ConfigError);
}

}  // namespace
}  // namespace attn
