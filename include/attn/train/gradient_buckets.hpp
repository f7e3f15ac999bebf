// The buckets of data-parallel training (data_parallel.hpp): which parameters' gradients are
// summed over the ranks together, and whether a bucket is summed where its gradients lie or
// packed into a buffer first. Needs no MPI.
//
// A bucket holds about `capacity` values, its members taken in the reverse of registration order
// (the order backward finishes them). A bucket whose gradients lie in one range of memory is summed
// there, without packing: a tensor larger than a bucket, and every bucket of a model that keeps its
// gradients in one buffer (Module::gather_gradients; a Transformer does), where the zero padding
// between tensors is summed along with them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn/nn/module.hpp"
#include "attn/random.hpp"

namespace attn {

template <class T>
struct GradientBucket {
  std::vector<std::size_t> members;  // indices into the parameter list, descending
  Index elements = 0;                // the members' values
  T* in_place = nullptr;             // their one range of memory, if they lie in one
  Index span = 0;                    // values summed: elements, and any padding in the range

  bool packs() const { return in_place == nullptr; }
};

/// Values per bucket: bucket_bytes' worth of T, but at most 1/min_buckets of all `total` values
/// (at least 1).
template <class T>
Index bucket_capacity(Index total, std::size_t bucket_bytes, std::size_t min_buckets) {
  const Index parts = static_cast<Index>(std::min<std::size_t>(
      std::max<std::size_t>(min_buckets, 1), std::numeric_limits<Index>::max()));
  const Index share = std::max<Index>(1, (total + parts - 1) / parts);
  const std::size_t values = std::max<std::size_t>(bucket_bytes / sizeof(T), 1);
  return static_cast<Index>(std::min<std::size_t>(values, static_cast<std::size_t>(share)));
}

namespace detail {

// Sets b.in_place and b.span: the members' gradients lie in one range when they are views of one
// allocation in index order, each starting at the first detail::kAlignment boundary at or after
// the end of the one before (Module::gather_gradients' layout). Else they are packed.
template <class T>
void locate_bucket(GradientBucket<T>& b, std::vector<NamedParameter<T>>& params) {
  const Tensor<T>* prev = nullptr;
  bool one_range = true;
  for (auto m = b.members.rbegin(); m != b.members.rend() && one_range; ++m) {
    const Tensor<T>& g = params[*m].grad;
    if (prev != nullptr && g.shares_storage(*prev)) {
      const auto end = reinterpret_cast<std::uintptr_t>(prev->data() + prev->numel());
      const std::uintptr_t next = (end + kAlignment - 1) / kAlignment * kAlignment;
      one_range = reinterpret_cast<std::uintptr_t>(g.data()) == next;
    } else if (prev != nullptr) {
      one_range = false;
    }
    prev = &g;
  }
  Tensor<T>& first = params[b.members.back()].grad;
  const Tensor<T>& last = params[b.members.front()].grad;
  one_range = one_range && first.data() != nullptr;
  b.in_place = one_range ? first.data() : nullptr;
  b.span = one_range ? static_cast<Index>(last.data() + last.numel() - first.data()) : b.elements;
}

}  // namespace detail

/// The buckets of `params`' gradients, `capacity` values each at most (a larger tensor is a
/// bucket of its own), in the order backward finishes them: the last parameters first. The
/// buckets that sum in place point into the gradients of `params`.
template <class T>
std::vector<GradientBucket<T>> plan_gradient_buckets(std::vector<NamedParameter<T>>& params,
                                                     Index capacity) {
  std::vector<GradientBucket<T>> buckets;
  GradientBucket<T> open;
  auto close = [&] {
    if (open.members.empty()) return;
    detail::locate_bucket(open, params);
    buckets.push_back(std::move(open));
    open = GradientBucket<T>{};
  };
  for (std::size_t i = params.size(); i-- > 0;) {  // backward finishes the last layers first
    const Index n = params[i].grad.numel();
    if (open.elements > 0 && open.elements + n > capacity) close();
    open.members.push_back(i);
    open.elements += n;
  }
  close();
  return buckets;
}

/// Every bucket of a parameter list, and what the sums look up in them: each parameter's bucket,
/// the buckets that pack, and the sizes of the buffers they need.
template <class T>
struct BucketPlan {
  std::vector<GradientBucket<T>> buckets;  // plan_gradient_buckets
  std::vector<std::size_t> packed;         // the buckets that pack, ascending
  std::vector<std::size_t> bucket_of;      // [params] the bucket of each parameter
  Index largest = 0;                       // values summed by the largest bucket
  Index largest_packed = 0;                // by the largest that packs (0 if none does)
};

/// plan_gradient_buckets(params, capacity), and what BucketPlan looks up in its buckets.
template <class T>
BucketPlan<T> plan_buckets(std::vector<NamedParameter<T>>& params, Index capacity) {
  BucketPlan<T> plan;
  plan.buckets = plan_gradient_buckets(params, capacity);
  plan.bucket_of.assign(params.size(), 0);
  for (std::size_t b = 0; b < plan.buckets.size(); ++b) {
    const GradientBucket<T>& bucket = plan.buckets[b];
    for (std::size_t i : bucket.members) plan.bucket_of[i] = b;
    plan.largest = std::max(plan.largest, bucket.span);
    if (!bucket.packs()) continue;
    plan.packed.push_back(b);
    plan.largest_packed = std::max(plan.largest_packed, bucket.span);
  }
  return plan;
}

/// What the ranks of a data-parallel job must agree on before summing (`piece`: values per ring
/// message): the value type, the pieces, every gradient's size and every bucket.
template <class T>
std::uint64_t bucket_layout_fingerprint(const std::vector<NamedParameter<T>>& params,
                                        const std::vector<GradientBucket<T>>& buckets,
                                        Index piece) {
  std::uint64_t h = kFnv1aOffset;
  const auto add = [&h](std::uint64_t v) { h = fnv1a(h, &v, sizeof v); };
  add(sizeof(T));
  add(static_cast<std::uint64_t>(piece));
  add(params.size());
  for (const auto& p : params) add(static_cast<std::uint64_t>(p.grad.numel()));
  add(buckets.size());
  for (const GradientBucket<T>& b : buckets) {
    add(static_cast<std::uint64_t>(b.span));
    add(b.packs() ? 1 : 0);
    add(b.members.size());
  }
  return h;
}

/// Copies the gradients of b's members into out[0, b.elements).
template <class T>
void pack_bucket(const GradientBucket<T>& b, const std::vector<NamedParameter<T>>& params, T* out) {
  for (std::size_t i : b.members) {
    const Tensor<T>& g = params[i].grad;
    out = std::copy(g.data(), g.data() + g.numel(), out);
  }
}

/// Copies in[0, b.elements) back into the gradients of b's members.
template <class T>
void unpack_bucket(const GradientBucket<T>& b, std::vector<NamedParameter<T>>& params,
                   const T* in) {
  for (std::size_t i : b.members) {
    Tensor<T>& g = params[i].grad;
    std::copy(in, in + g.numel(), g.data());
    in += g.numel();
  }
}

}  // namespace attn
