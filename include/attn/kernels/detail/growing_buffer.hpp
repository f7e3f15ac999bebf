// A 64-byte aligned buffer that only grows: the per-thread scratch of the row kernels (attention's
// blocks, layer_norm_backward's block sums), allocated in a training loop's first step and never
// again.
#pragma once

#include <memory>

#include "attn/tensor.hpp"

namespace attn::kernels::detail {

/// A 64-byte aligned buffer that only grows. A row of a [rows, S] block then starts at the same
/// alignment in every call of the same shape, so Eigen's vectorised row passes (which peel scalars
/// up to an aligned address) sum in the same order whatever memory the allocator returned: with a
/// std::vector's 16-byte alignment and Eigen's 32-byte AVX2 packets, two identical trainers in one
/// process differed in the last bit of their losses.
template <class T>
class GrowingBuffer {
 public:
  void grow(Index n) {
    if (storage_ == nullptr || storage_->capacity < n)
      storage_ = std::make_unique<attn::detail::Storage<T>>(n);
  }
  T* data() { return storage_ == nullptr ? nullptr : storage_->data; }

 private:
  std::unique_ptr<attn::detail::Storage<T>> storage_;
};

}  // namespace attn::kernels::detail
