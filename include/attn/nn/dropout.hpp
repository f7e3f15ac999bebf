// Dropout(p): inverted dropout in training mode, the identity in evaluation mode or when p = 0.
//
// Randomness: every training-mode forward takes key = state->next_key() from a RandomState and
// remembers it; element i is dropped iff uniform_at(key, i) < p, and backward regenerates that mask
// from the key. A model shares one RandomState among all its Dropouts (Module::set_random_state),
// whose counter advances once per dropout call, so every mask is a function of (seed, counter)
// alone: a checkpoint that stores the two resumes bit-identically. Until given one, a Dropout
// owns a RandomState of its own (seed 0).
#pragma once

#include <cstdint>
#include <memory>

#include "attn/kernels/dropout.hpp"
#include "attn/nn/module.hpp"

namespace attn {

template <class T>
class Dropout : public Module<T> {
 public:
  explicit Dropout(double p) : p_(p), state_(std::make_shared<RandomState>()) {
    detail::check_probability("Dropout", "p", p);
  }

  /// x [...] -> y [...]. In evaluation mode or with p = 0 the result is a handle to x itself.
  const Tensor<T>& forward(const Tensor<T>& x) {
    detail::check_has_storage(x, "Dropout::forward");
    fused_forward(x.shape());  // decides active_ and draws the key, as a fused caller would
    if (!active_) {
      passthrough_ = x;
      return passthrough_;
    }
    y_.resize(x.shape());
    kernels::dropout_forward<T>(y_.data(), x.data(), x.numel(), p_, key_);
    return y_;
  }

  /// For a caller that applies this dropout inside a fused kernel (kernels/residual.hpp) to an
  /// input of `shape`: takes the key forward would take and keeps it, so backward works as after
  /// forward. The result has p = 0 when forward would be the identity.
  DropoutMask fused_forward(const Shape& shape) {
    active_ = this->is_training() && p_ > 0.0;
    shape_ = shape;
    forwarded_ = true;
    if (active_) key_ = state_->next_key();
    return mask();
  }

  /// The last forward's mask: its p and key when it dropped elements, else p = 0 (none).
  DropoutMask mask() const { return active_ ? DropoutMask{p_, key_} : DropoutMask{}; }

  /// dy [...] -> dx [...], with the mask of the last forward (a handle to dy when it was the
  /// identity).
  const Tensor<T>& backward(const Tensor<T>& dy) {
    check_backward_shape(dy.shape());
    if (!active_) {
      passthrough_ = dy;
      return passthrough_;
    }
    dx_.resize(dy.shape());
    kernels::dropout_backward<T>(dx_.data(), dy.data(), dy.numel(), p_, key_);
    return dx_;
  }

  double p() const { return p_; }
  /// What backward multiplies kept elements by: 1 / (1 - p) after an active forward, else 1.
  T backward_scale() const { return active_ ? static_cast<T>(1.0 / (1.0 - p_)) : T(1); }
  /// For a caller that applies this dropout's backward inside a fused kernel (FeedForward): checks
  /// dy's shape as backward does.
  void check_backward_shape(const Shape& dy) const {
    ATTN_CHECK(forwarded_, StateError, "Dropout::backward: needs a forward first");
    ATTN_CHECK(dy == shape_, ShapeError, "Dropout::backward: expected dy of shape ", shape_,
               ", got ", dy);
  }
  const std::shared_ptr<RandomState>& random_state() const { return state_; }

 protected:
  void on_random_state(const std::shared_ptr<RandomState>& state) override {
    ATTN_CHECK(state != nullptr, ConfigError, "Dropout: set_random_state needs a state, got null");
    state_ = state;
  }

 private:
  double p_;
  std::shared_ptr<RandomState> state_;
  std::uint64_t key_ = 0;   // mask key of the last training-mode forward, kept for backward
  bool active_ = false;     // whether the last forward dropped anything
  bool forwarded_ = false;  // whether a forward (or fused_forward) has run
  Shape shape_;             // shape of the last forward's input
  // Handle to x (or dy) when the last call was the identity. Kept apart from y_ so that y_'s
  // storage, which resize() reuses, never aliases the caller's tensor.
  Tensor<T> passthrough_;
  Tensor<T> y_;   // [...] output buffer
  Tensor<T> dx_;  // [...] input-gradient buffer
};

}  // namespace attn
