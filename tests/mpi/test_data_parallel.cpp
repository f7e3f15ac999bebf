// attn/train/data_parallel.hpp under mpirun (ctest runs it on 2 and on 3 ranks): the ring
// all-reduce, the gradient all-reduce against one process on the whole batch, the overlapped
// all-reduce against the blocking one, loss statistics and the agreement on errors. Every rank runs
// every test; a failure on any rank fails the job.
#include <gtest/gtest.h>
#include <mpi.h>

#include <attn/train/clip.hpp>
#include <attn/train/data_parallel.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "error_helpers.hpp"
#include "training_task.hpp"

namespace attn {
namespace {

int world_rank() { return detail::comm_rank(MPI_COMM_WORLD); }
int world_size() { return detail::comm_size(MPI_COMM_WORLD); }

/// The default options but for the bucket size (bytes).
DataParallelOptions buckets_of(std::size_t bytes) {
  DataParallelOptions options;
  options.bucket_bytes = bytes;
  return options;
}

/// The default options but for the fewest buckets a model is cut into.
DataParallelOptions at_least(std::size_t buckets) {
  DataParallelOptions options;
  options.min_buckets = buckets;
  return options;
}

/// Rows rank, rank + N, ... of `b`: this rank's share of a batch (padding kept).
testing::Batch share_of(const testing::Batch& b, int rank, int ranks) {
  const Index rows = b.src.size(0);
  const Index mine = (rows - rank + ranks - 1) / ranks;
  testing::Batch s;
  s.src = Tensor<TokenId>({mine, b.src.size(1)});
  s.tgt_in = Tensor<TokenId>({mine, b.tgt_in.size(1)});
  s.tgt_out = Tensor<TokenId>({mine, b.tgt_out.size(1)});
  for (Index i = 0; i < mine; ++i) {
    const Index r = rank + i * ranks;
    for (Index j = 0; j < b.src.size(1); ++j) s.src(i, j) = b.src(r, j);
    for (Index j = 0; j < b.tgt_in.size(1); ++j) {
      s.tgt_in(i, j) = b.tgt_in(r, j);
      s.tgt_out(i, j) = b.tgt_out(r, j);
    }
  }
  return s;
}

TEST(RingAllReduce, SumsIntegersExactlyForEverySizeIncludingFewerElementsThanRanks) {
  const int rank = world_rank(), ranks = world_size();
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
  const int rank = world_rank();
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
  const int rank = world_rank(), ranks = world_size();
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

// Gives the norms of every decoder layer gradients of their own, as a model that does not gather
// its gradients into one buffer has (Module::gather_gradients): the buckets that hold them then
// pack. The optimiser is rebuilt, as it holds handles to the gradients.
template <class T>
void scatter_norm_gradients(testing::Trainer<T>& t) {
  for (auto& layer : t.model.decoder.layers)
    for (LayerNorm<T>* norm : {&layer->norm1, &layer->norm2, &layer->norm3})
      for (Parameter<T>* p : {&norm->weight, &norm->bias}) p->grad = Tensor<T>(p->grad.shape());
  t.adam = Adam<T>(t.model.parameters());
}

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
  const int rank = world_rank(), ranks = world_size();
  const Index vocab = 23, b = 3, steps = 4;
  const double lr = 0.5;
  const TransformerConfig config = testing::task_config(vocab, 0.0);
  ASSERT_TRUE(config.share_embeddings);  // the tied weight must be reduced once
  testing::Trainer<double> whole(config), replica(config);
  if (scatter) scatter_norm_gradients(replica);
  DataParallel<double> dp(replica.model.parameters(), MPI_COMM_WORLD, buckets_of(bucket_bytes));
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

    const testing::Batch mine = share_of(batch, rank, ranks);
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

TEST(DataParallel, BucketsAreFewAndCoverEveryParameterOnce) {
  testing::Trainer<float> t(testing::task_config(23, 0.0));
  const auto params = t.model.parameters();
  DataParallel<float> one_bucket(params, MPI_COMM_WORLD, at_least(1));
  EXPECT_EQ(one_bucket.buckets(), 1u);  // ~60 K floats fit one 32 MB bucket
  // By default a model that fits one bucket is cut into quarters (greedily, so 4 to 8 buckets),
  // so that the sums of its top layers can start while backward computes the lower ones.
  DataParallel<float> quarters(params);
  EXPECT_GE(quarters.buckets(), 4u);
  EXPECT_LE(quarters.buckets(), 8u);
  EXPECT_THROW(DataParallel<float>(params, MPI_COMM_WORLD, at_least(0)), ConfigError);
  DataParallel<float> several(params, MPI_COMM_WORLD, buckets_of(16384));
  EXPECT_GT(several.buckets(), 1u);
  EXPECT_LT(several.buckets(), params.size());
}

// One update's forward and backward passes on this rank's share of `passes` batches, summed into
// the gradients (accumulation); `before_last` runs before the last backward pass.
template <class T, class F>
void accumulate(testing::Trainer<T>& t, Index step, Index passes, Index rows_per_rank,
                F&& before_last) {
  const int rank = world_rank(), ranks = world_size();
  t.model.train();
  t.adam.zero_grad();
  for (Index p = 0; p < passes; ++p) {
    const testing::Batch batch = testing::stream_batch(5 + p, step, rows_per_rank * ranks, 23);
    const testing::Batch mine = share_of(batch, rank, ranks);
    t.loss.forward_backward(t.model.forward(mine.src, mine.tgt_in), mine.tgt_out, 1.0, step + 1);
    if (p + 1 == passes) before_last();
    t.model.backward(t.loss.dlogits());
  }
}

template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data(), b.data(), sizeof(T) * static_cast<std::size_t>(a.numel())) == 0;
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
    scatter_norm_gradients(blocking);
    scatter_norm_gradients(overlapped);
  }
  DataParallelOptions options = buckets_of(bucket_bytes);
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
      ASSERT_TRUE(same_bits(a[i].grad, b[i].grad)) << a[i].name << " at step " << k;
    // The packed sums in flight shared packed_in_flight buffers, the first being the blocking
    // form's (one rank has no other sum to send, and nothing to pack).
    const std::size_t buffers = std::min(packed_in_flight, dp.packed_buckets());
    EXPECT_EQ(dp.packed_buffers(), world_size() > 1 ? buffers : dp.packed_buckets() > 0 ? 1 : 0);
    const double lr = noam_lr(k + 1, config.d_model, 2, 1.0);
    blocking.adam.step(lr);
    overlapped.adam.step(lr);
  }
  const testing::Trainer<T> untrained(config);
  const auto initial = untrained.model.parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(same_bits(a[i].value, b[i].value)) << a[i].name;
    EXPECT_FALSE(same_bits(initial[i].value, b[i].value)) << b[i].name << " never moved";
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
  scatter_norm_gradients(f);
  scatter_norm_gradients(d);
  ASSERT_GT(
      DataParallel<float>(f.model.parameters(), MPI_COMM_WORLD, buckets_of(512)).packed_buckets(),
      3u);
  ASSERT_GT(
      DataParallel<double>(d.model.parameters(), MPI_COMM_WORLD, buckets_of(512)).packed_buckets(),
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
  const int rank = world_rank(), ranks = world_size();
  const TransformerConfig config = testing::task_config(23, 0.0);
  testing::Trainer<float> blocking(config), overlapped(config);
  DataParallel<float> dp_blocking(blocking.model.parameters(), MPI_COMM_WORLD, buckets_of(4096));
  DataParallel<float> dp(overlapped.model.parameters(), MPI_COMM_WORLD, buckets_of(4096));
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
    EXPECT_TRUE(same_bits(a[i].grad, b[i].grad)) << a[i].name;
}

TEST(DataParallelOverlapped, AParameterBackwardNeverReportedIsNamedAtFinish) {
  testing::Trainer<float> t(testing::task_config(23, 0.0));
  const auto params = t.model.parameters();
  DataParallel<float> dp(params, MPI_COMM_WORLD, buckets_of(4096));
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

TEST(DataParallel, LossStatisticsAreSummedOverRanks) {
  const int rank = world_rank(), ranks = world_size();
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

TEST(DataParallel, AnErrorOnOneRankIsThrownOnEveryRankWithItsMessage) {
  const int rank = world_rank(), ranks = world_size();
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
  const int rank = world_rank();
  const std::string message = testing::error_of<ConfigError>(
      [&] { check_same_on_all_ranks(rank == 1 ? 2 : 1, "training data"); });
  EXPECT_TRUE(testing::contains(message, "rank 1's training data differ from rank 0's")) << message;
}

}  // namespace
}  // namespace attn

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int failed = RUN_ALL_TESTS(), any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
