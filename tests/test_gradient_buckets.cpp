// attn/train/gradient_buckets.hpp: which gradients a data-parallel step sums together, and where.
// (The sums themselves run under MPI: tests/mpi/.)
#include <gtest/gtest.h>

#include <attn/train/gradient_buckets.hpp>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "training_task.hpp"

namespace attn {
namespace {

// Every parameter in exactly one bucket, the buckets in descending runs of indices from the last
// parameter down, none over `capacity` values unless it holds one tensor.
template <class T>
void expect_partition(const std::vector<GradientBucket<T>>& buckets,
                      const std::vector<NamedParameter<T>>& params, Index capacity) {
  std::size_t next = params.size();
  for (const GradientBucket<T>& b : buckets) {
    ASSERT_FALSE(b.members.empty());
    Index elements = 0;
    for (std::size_t i : b.members) {
      ASSERT_EQ(i + 1, next);
      next = i;
      elements += params[i].grad.numel();
    }
    EXPECT_EQ(b.elements, elements);
    EXPECT_TRUE(b.elements <= capacity || b.members.size() == 1) << b.elements;
  }
  EXPECT_EQ(next, 0u);
}

std::vector<NamedParameter<float>> separate(const std::vector<Index>& sizes) {
  std::vector<NamedParameter<float>> params;
  for (Index n : sizes)
    params.push_back({"p" + std::to_string(params.size()), Tensor<float>({n}), Tensor<float>({n})});
  return params;
}

TEST(GradientBuckets, CapacityIsBucketBytesButAtMostAShareOfAll) {
  EXPECT_EQ(bucket_capacity<float>(1000, 400, 1), 100);  // 400 bytes of float
  EXPECT_EQ(bucket_capacity<double>(1000, 400, 1), 50);
  EXPECT_EQ(bucket_capacity<float>(1000, 1 << 20, 4), 250);   // a quarter of the model
  EXPECT_EQ(bucket_capacity<float>(1001, 1 << 20, 4), 251);   // rounded up
  EXPECT_EQ(bucket_capacity<float>(0, 1 << 20, 4), 1);        // never 0
  EXPECT_EQ(bucket_capacity<float>(1000, 1 << 20, 0), 1000);  // 0 buckets taken as 1
  EXPECT_EQ(bucket_capacity<float>(1000, 1, 1), 1);           // less than a value: one
}

TEST(GradientBuckets, AGatheredModelsBucketsAreSummedWhereTheyLie) {
  testing::Trainer<float> t(testing::task_config(23, 0.0));
  auto params = t.model.parameters();
  const Index total = std::accumulate(params.begin(), params.end(), Index{0},
                                      [](Index s, const auto& p) { return s + p.grad.numel(); });
  for (Index capacity : {Index{1}, total / 7, total / 4, total}) {
    SCOPED_TRACE(capacity);
    const auto buckets = plan_gradient_buckets(params, capacity);
    expect_partition(buckets, params, capacity);
    for (const auto& b : buckets) {
      ASSERT_FALSE(b.packs());
      const Tensor<float>& first = params[b.members.back()].grad;
      const Tensor<float>& last = params[b.members.front()].grad;
      EXPECT_EQ(b.in_place, first.data());
      EXPECT_EQ(b.span, last.data() + last.numel() - first.data());  // padding included
      EXPECT_GE(b.span, b.elements);
    }
  }
}

TEST(GradientBuckets, SeparateGradientsArePackedUnlessABucketHoldsOne) {
  auto params = separate({3, 5, 100, 2, 4});
  const auto buckets = plan_gradient_buckets(params, 10);
  expect_partition(buckets, params, 10);
  ASSERT_EQ(buckets.size(), 3u);  // {p4, p3}, {p2} alone (larger than a bucket), {p1, p0}
  EXPECT_TRUE(buckets[0].packs());
  EXPECT_EQ(buckets[0].span, 6);
  EXPECT_FALSE(buckets[1].packs());
  EXPECT_EQ(buckets[1].in_place, params[2].grad.data());
  EXPECT_EQ(buckets[1].span, 100);
  EXPECT_TRUE(buckets[2].packs());
  EXPECT_EQ(buckets[2].span, 8);
}

TEST(GradientBuckets, ThePlanNamesEachParametersBucketAndThePackedOnes) {
  auto params = separate({3, 5, 100, 2, 4});
  const BucketPlan<float> plan = plan_buckets(params, 10);
  ASSERT_EQ(plan.buckets.size(), 3u);  // {p4, p3}, {p2}, {p1, p0}, as above
  EXPECT_EQ(plan.bucket_of, (std::vector<std::size_t>{2, 2, 1, 0, 0}));
  EXPECT_EQ(plan.packed, (std::vector<std::size_t>{0, 2}));
  EXPECT_EQ(plan.largest, 100);
  EXPECT_EQ(plan.largest_packed, 8);
  // A model whose gradients lie in one buffer packs none.
  testing::Trainer<float> t(testing::task_config(23, 0.0));
  auto gathered = t.model.parameters();
  const BucketPlan<float> in_place = plan_buckets(gathered, 1000);
  EXPECT_TRUE(in_place.packed.empty());
  EXPECT_EQ(in_place.largest_packed, 0);
  Index largest = 0;
  for (const auto& b : in_place.buckets) largest = std::max(largest, b.span);
  EXPECT_EQ(in_place.largest, largest);
  for (std::size_t i = 0; i < gathered.size(); ++i) {
    const auto& members = in_place.buckets[in_place.bucket_of[i]].members;
    EXPECT_NE(std::find(members.begin(), members.end(), i), members.end()) << gathered[i].name;
  }
}

TEST(GradientBuckets, ViewsOfOneBufferWithAGapBetweenThemArePacked) {
  constexpr Index kLine = detail::kAlignment / sizeof(float);  // floats per alignment boundary
  Tensor<float> buffer({4 * kLine});
  std::vector<NamedParameter<float>> params(2);
  params[0].grad = buffer.slice(0, 8);                      // the next boundary is at kLine ...
  params[1].grad = buffer.slice(2 * kLine, 2 * kLine + 8);  // ... but the second starts later
  EXPECT_TRUE(plan_gradient_buckets(params, 100)[0].packs());
  params[1].grad = buffer.slice(kLine, kLine + 8);  // where gather_gradients would put it
  const auto buckets = plan_gradient_buckets(params, 100);
  EXPECT_FALSE(buckets[0].packs());
  EXPECT_EQ(buckets[0].span, kLine + 8);
}

TEST(GradientBuckets, PackAndUnpackCopyTheMembersInBucketOrder) {
  auto params = separate({2, 3});
  params[0].grad.vector() << 1, 2;
  params[1].grad.vector() << 3, 4, 5;
  const auto buckets = plan_gradient_buckets(params, 5);
  ASSERT_EQ(buckets.size(), 1u);
  std::vector<float> packed(5);
  pack_bucket(buckets[0], params, packed.data());
  EXPECT_EQ(packed, (std::vector<float>{3, 4, 5, 1, 2}));  // p1 first: backward finishes it first
  for (float& v : packed) v *= 10;
  unpack_bucket(buckets[0], params, packed.data());
  EXPECT_EQ(params[0].grad(1), 20);
  EXPECT_EQ(params[1].grad(2), 50);
}

}  // namespace
}  // namespace attn
