// MultiHeadAttention: Concat(head_1..head_H) W^O with head_h = Attention(Q W^Q_h, K W^K_h, V
// W^V_h), parameters named and shaped as torch.nn.MultiheadAttention's state_dict:
//   in_proj_weight [3D, D]  rows [0, D) = W^Q, [D, 2D) = W^K, [2D, 3D) = W^V (all heads, head h
//                           in rows h*K .. h*K+K of each block)
//   in_proj_bias   [3D]
//   out_proj       Linear(D, D): "out_proj.weight" [D, D], "out_proj.bias" [D]
//
// Activations are [B*L, D] row-major matrices. Self-attention projects Q, K and V with ONE GEMM
// into a packed [B*L, 3D] buffer and runs the attention kernel on its column blocks (leading
// dimension 3D), so no head is ever copied out. Cross-attention projects the queries with the
// first D rows of in_proj_weight and the memory's keys and values with the last 2D rows, one GEMM
// each, into [B*T, D] and [B*S, 2D].
//
// Attention weights [B, H, T, S] (softmax before dropout) are an output on request
// (keep_attention_weights): the kernel gets nullptr otherwise and computes nothing extra.
//
// Incremental decoding (inference only: no dropout, no backward): forward_self_step appends one
// position's keys and values to a KVCache and attends over everything cached, which is the causal
// mask by construction; forward_cross_cached projects the memory once per batch into a KVCache.
#pragma once

#include <cmath>
#include <cstdint>

#include "attn/kernels/attention.hpp"
#include "attn/kernels/attention_naive.hpp"
#include "attn/kernels/linear.hpp"
#include "attn/mask.hpp"
#include "attn/nn/dropout.hpp"
#include "attn/nn/kv_cache.hpp"
#include "attn/nn/linear.hpp"
#include "attn/nn/module.hpp"

namespace attn {

template <class T>
class MultiHeadAttention : public Module<T> {
  // Declared before the parameters: the constructor validates the configuration first.
  Index d_, h_, k_;
  bool fast_;

 public:
  MultiHeadAttention(Index d_model, Index heads, double attention_dropout = 0.0,
                     bool use_fast_kernel = true)
      : d_(check_config(d_model, heads, attention_dropout)),
        h_(heads),
        k_(d_model / heads),
        fast_(use_fast_kernel),
        out_proj(d_model, d_model),
        attention_drop_(attention_dropout) {
    in_proj_weight.allocate({3 * d_, d_});
    in_proj_bias.allocate({3 * d_});
    this->register_parameter("in_proj_weight", &in_proj_weight);
    this->register_parameter("in_proj_bias", &in_proj_bias);
    this->register_module("out_proj", &out_proj);
    this->register_module("dropout", &attention_drop_);  // no parameters: draws the masks
  }

  /// Xavier uniform on the whole [3D, D] in_proj_weight and on out_proj.weight, zero biases:
  /// torch.nn.MultiheadAttention._reset_parameters.
  void reset_parameters(Rng& rng) {
    xavier_uniform(in_proj_weight.value, rng);
    in_proj_bias.value.set_zero();
    out_proj.reset_parameters(rng);
  }

  /// Self-attention: x [B, L, D] -> y [B, L, D], queries, keys and values all from x.
  const Tensor<T>& forward_self(const Tensor<T>& x, const AttentionMask<T>& mask) {
    detail::check_activation(x, d_, "MultiHeadAttention", "x");
    const Index B = x.size(0), L = x.size(1);
    mask.check(B, L, L);
    x_ = x;
    mask_ = mask;
    mode_ = Mode::Self;
    // qkv = x W_in^T + b_in: Q, K, V as column blocks [0, D), [D, 2D), [2D, 3D).
    qkv_.resize({B, L, 3 * d_});
    kernels::linear_forward<T>(qkv_.matrix(), x.matrix(), in_proj_weight.value.matrix(),
                               in_proj_bias.value.data());
    shape_ = {B, h_, L, L, k_};
    run_forward(packed_qkv(qkv_.data()), begin_dropout());
    return out_proj.forward(attn_);
  }

  /// Cross-attention: queries from x [B, T, D], keys and values from memory [B, S, D].
  const Tensor<T>& forward_cross(const Tensor<T>& x, const Tensor<T>& memory,
                                 const AttentionMask<T>& mask) {
    detail::check_activation(x, d_, "MultiHeadAttention", "x");
    detail::check_activation(memory, d_, "MultiHeadAttention", "memory", x.size(0), "x");
    const Index B = x.size(0), Tq = x.size(1), S = memory.size(1);
    mask.check(B, Tq, S);
    x_ = x;
    memory_ = memory;
    mask_ = mask;
    mode_ = Mode::Cross;
    q_.resize({B, Tq, d_});
    kernels::linear_forward<T>(q_.matrix(), x.matrix(), w_q(), in_proj_bias.value.data());
    kv_.resize({B, S, 2 * d_});
    kernels::linear_forward<T>(kv_.matrix(), memory.matrix(), w_kv(),
                               in_proj_bias.value.data() + d_);
    shape_ = {B, h_, Tq, S, k_};
    run_forward({q_.data(), d_, kv_.data(), 2 * d_, kv_.data() + d_, 2 * d_}, begin_dropout());
    return out_proj.forward(attn_);
  }

  /// dy [B, T, D] -> dx [B, T, D]. Self-attention: the sum of the query, key and value paths.
  /// Cross-attention: the query path; the memory's gradient is dmemory(). Accumulates every
  /// parameter gradient.
  const Tensor<T>& backward(const Tensor<T>& dy) {
    ATTN_CHECK(mode_ == Mode::Self || mode_ == Mode::Cross, StateError,
               "MultiHeadAttention::backward: needs a forward_self or forward_cross first "
               "(incremental decoding steps have no backward)");
    ATTN_CHECK(dy.shape() == x_.shape(), ShapeError,
               "MultiHeadAttention::backward: expected dy of shape ", x_.shape(), ", got ",
               dy.shape());
    const Tensor<T>& dattn = out_proj.backward(dy);  // [B, T, D]
    dx_.resize(x_.shape());
    if (mode_ == Mode::Self) {
      // The kernel overwrites dQ, dK, dV into the column blocks of one [B*L, 3D] buffer; then
      // dx = dqkv W_in sums the three paths in one GEMM.
      dqkv_.resize(qkv_.shape());
      T* d = dqkv_.data();
      run_backward({d, 3 * d_, d + d_, 3 * d_, d + 2 * d_, 3 * d_}, dattn, packed_qkv(qkv_.data()));
      kernels::linear_backward<T>(dx_.matrix(), in_proj_weight.grad.matrix(),
                                  in_proj_bias.grad.data(), dqkv_.matrix(), x_.matrix(),
                                  in_proj_weight.value.matrix());
    } else {
      dq_.resize(q_.shape());
      dkv_.resize(kv_.shape());
      run_backward({dq_.data(), d_, dkv_.data(), 2 * d_, dkv_.data() + d_, 2 * d_}, dattn,
                   {q_.data(), d_, kv_.data(), 2 * d_, kv_.data() + d_, 2 * d_});
      kernels::linear_backward<T>(dx_.matrix(), in_proj_weight.grad.matrix().topRows(d_),
                                  in_proj_bias.grad.data(), dq_.matrix(), x_.matrix(), w_q());
      dmemory_.resize(memory_.shape());
      kernels::linear_backward<T>(
          dmemory_.matrix(), in_proj_weight.grad.matrix().bottomRows(2 * d_),
          in_proj_bias.grad.data() + d_, dkv_.matrix(), memory_.matrix(), w_kv());
    }
    return dx_;
  }

  /// Gradient of the memory [B, S, D] from the last cross-attention backward (overwritten).
  const Tensor<T>& dmemory() const {
    ATTN_CHECK(mode_ == Mode::Cross && dmemory_.rank() == 3, StateError,
               "MultiHeadAttention::dmemory: needs forward_cross followed by backward");
    return dmemory_;
  }

  /// One decoding step of self-attention: x [B, 1, D], the new position of every batch row.
  /// Appends its keys and values to `cache` (allocate(B, max_len, D) first) and attends over all
  /// cached positions, which is exactly what the causal mask allows the newest position.
  const Tensor<T>& forward_self_step(const Tensor<T>& x, KVCache<T>& cache) {
    detail::check_activation(x, d_, "MultiHeadAttention", "x");
    const Index B = x.size(0);
    ATTN_CHECK(x.size(1) == 1, ShapeError,
               "MultiHeadAttention::forward_self_step: expected x [B, 1, ", d_, "], got ",
               x.shape());
    ATTN_CHECK(
        cache.allocated() && cache.batch() == B && cache.keys.size(2) == d_, ShapeError,
        "MultiHeadAttention::forward_self_step: expected a cache allocated for [B, *, D] = [", B,
        ", *, ", d_, "], got keys ", cache.keys.shape());
    cache.check_length("MultiHeadAttention::forward_self_step");
    ATTN_CHECK(cache.length < cache.capacity(), ShapeError,
               "MultiHeadAttention::forward_self_step: cache full, capacity ", cache.capacity(),
               " positions");
    mode_ = Mode::Step;
    qkv_.resize({B, 1, 3 * d_});
    kernels::linear_forward<T>(qkv_.matrix(), x.matrix(), in_proj_weight.value.matrix(),
                               in_proj_bias.value.data());
    const Index pos = cache.length, cap = cache.capacity();
    for (Index b = 0; b < B; ++b) {
      const T* row = qkv_.data() + b * 3 * d_;
      std::copy(row + d_, row + 2 * d_, cache.keys.data() + (b * cap + pos) * d_);
      std::copy(row + 2 * d_, row + 3 * d_, cache.values.data() + (b * cap + pos) * d_);
    }
    cache.length = pos + 1;
    // Batch rows of the cache are `capacity` rows apart, not `length`, so the kernel runs per row.
    const Index S = cache.length;
    T* weights = prepare_outputs(B, 1, S);
    const kernels::AttentionShape one{1, h_, 1, S, k_};
    const AttentionMask<T> all;
    // The sentences in parallel (each call then runs on its thread): one sentence's heads are too
    // little work to wake a thread team for.
    const Index per_sentence = B > 1 ? h_ * S * k_ : 0;
    parallel_for(B, per_sentence, kernels::kAttentionParallelMinWork - 1, [&](Index b) {
      const T* qkv = qkv_.data() + b * 3 * d_;
      dispatch_forward(attn_.data() + b * d_, d_, lse_.data() + b * h_,
                       weights ? weights + b * h_ * S : nullptr,
                       {qkv, 3 * d_, cache.keys.data() + b * cap * d_, d_,
                        cache.values.data() + b * cap * d_, d_},
                       one, all, {});
    });
    return out_proj.forward(attn_);
  }

  /// Cross-attention for decoding: queries x [B, T, D] (usually T = 1), memory [B, S, D]. The
  /// first call after cache.clear() projects the memory's keys and values into `cache`; later
  /// calls reuse them (the memory must then be the same).
  const Tensor<T>& forward_cross_cached(const Tensor<T>& x, const Tensor<T>& memory,
                                        KVCache<T>& cache, const AttentionMask<T>& mask) {
    detail::check_activation(x, d_, "MultiHeadAttention", "x");
    detail::check_activation(memory, d_, "MultiHeadAttention", "memory", x.size(0), "x");
    const Index B = x.size(0), Tq = x.size(1), S = memory.size(1);
    mask.check(B, Tq, S);
    mode_ = Mode::Step;
    if (cache.length == 0) {
      cache.keys.resize({B, S, d_});
      cache.values.resize({B, S, d_});
      const auto& w = in_proj_weight.value.matrix();
      kernels::linear_forward<T>(cache.keys.matrix(), memory.matrix(), w.middleRows(d_, d_),
                                 in_proj_bias.value.data() + d_);
      kernels::linear_forward<T>(cache.values.matrix(), memory.matrix(), w.bottomRows(d_),
                                 in_proj_bias.value.data() + 2 * d_);
      cache.length = S;
    }
    ATTN_CHECK(cache.keys.shape() == Shape({B, S, d_}) && cache.length == S, ShapeError,
               "MultiHeadAttention::forward_cross_cached: the cache holds memory ",
               cache.keys.shape(), ", got memory ", memory.shape(),
               " (clear() it for a new batch)");
    q_.resize({B, Tq, d_});
    kernels::linear_forward<T>(q_.matrix(), x.matrix(), w_q(), in_proj_bias.value.data());
    shape_ = {B, h_, Tq, S, k_};
    T* weights = prepare_outputs(B, Tq, S);
    dispatch_forward(attn_.data(), d_, lse_.data(), weights,
                     {q_.data(), d_, cache.keys.data(), d_, cache.values.data(), d_}, shape_, mask,
                     {});
    return out_proj.forward(attn_);
  }

  /// Whether later forwards store the attention weights (off by default: they cost B*H*T*S).
  void keep_attention_weights(bool keep) {
    if (keep && !keep_weights_) weights_current_ = false;  // none kept until the next forward
    keep_weights_ = keep;
  }
  bool keeps_attention_weights() const { return keep_weights_; }

  /// [B, H, T, S] softmax probabilities (before dropout) of the last forward; rows of blocked
  /// keys are 0, and a query with every key blocked has an all-zero row.
  const Tensor<T>& attention_weights() const {
    ATTN_CHECK(keep_weights_, StateError,
               "MultiHeadAttention::attention_weights: not kept; call keep_attention_weights(true) "
               "before forward");
    ATTN_CHECK(
        weights_current_, StateError,
        "MultiHeadAttention::attention_weights: no forward since keep_attention_weights(true)");
    return weights_;
  }

  Index d_model() const { return d_; }
  Index heads() const { return h_; }
  double attention_dropout() const { return attention_drop_.p(); }
  bool uses_fast_kernel() const { return fast_; }

  Parameter<T> in_proj_weight;  // [3D, D] W^Q; W^K; W^V stacked on the leading axis
  Parameter<T> in_proj_bias;    // [3D]
  Linear<T> out_proj;           // W^O [D, D], bias [D]

 private:
  enum class Mode { None, Self, Cross, Step };

  static Index check_config(Index d_model, Index heads, double p) {
    ATTN_CHECK(d_model > 0 && heads > 0, ConfigError,
               "MultiHeadAttention: d_model and heads must be > 0, got ", d_model, " and ", heads);
    ATTN_CHECK(d_model % heads == 0, ConfigError, "d_model (", d_model,
               ") must be divisible by heads (", heads, ")");
    detail::check_probability("MultiHeadAttention", "attention_dropout", p);
    return d_model;
  }

  // Row blocks of in_proj_weight: W^Q [D, D] and W^K;W^V [2D, D].
  ConstMatrixRef<T> w_q() const { return in_proj_weight.value.matrix().topRows(d_); }
  ConstMatrixRef<T> w_kv() const { return in_proj_weight.value.matrix().bottomRows(2 * d_); }

  /// The dropout of this forward's probabilities [B, H, T, S] (shape_): in training a fresh
  /// key, which attention_drop_.mask() keeps for backward; p = 0 otherwise.
  DropoutMask begin_dropout() {
    return attention_drop_.fused_forward(
        Shape{shape_.batch, shape_.heads, shape_.queries, shape_.keys});
  }

  /// Q, K, V as the column blocks [0, D), [D, 2D), [2D, 3D) of one [B*L, 3D] projection.
  kernels::AttentionInputs<T> packed_qkv(const T* qkv) const {
    return {qkv, 3 * d_, qkv + d_, 3 * d_, qkv + 2 * d_, 3 * d_};
  }

  /// Sizes the heads' output [B, T, D] and log-sum-exp [B, H, T] for T queries over S keys, and
  /// the weights [B, H, T, S] when kept; returns where the weights go, or nullptr.
  T* prepare_outputs(Index B, Index Tq, Index S) {
    attn_.resize({B, Tq, d_});
    lse_.resize({B, h_, Tq});
    if (!keep_weights_) return nullptr;
    weights_.resize({B, h_, Tq, S});
    weights_current_ = true;
    return weights_.data();
  }

  void run_forward(const kernels::AttentionInputs<T>& in, const DropoutMask& dropout) {
    T* weights = prepare_outputs(shape_.batch, shape_.queries, shape_.keys);
    dispatch_forward(attn_.data(), d_, lse_.data(), weights, in, shape_, mask_, dropout);
  }

  void dispatch_forward(T* out, Index ldo, T* lse, T* weights,
                        const kernels::AttentionInputs<T>& in, const kernels::AttentionShape& shape,
                        const AttentionMask<T>& mask, const DropoutMask& dropout) {
    // Eq. 1 for every head at once: head_i = softmax(Q_i K_i^T / sqrt(d_k)) V_i, d_k = D / H.
    const T scale = T(1) / std::sqrt(T(k_));
    if (fast_)
      kernels::attention_forward<T>(out, ldo, lse, weights, in, shape, mask, scale, dropout);
    else
      kernels::attention_forward_naive<T>(out, ldo, lse, weights, in, shape, mask, scale, dropout);
  }

  void run_backward(const kernels::AttentionGradients<T>& grads, const Tensor<T>& dout,
                    const kernels::AttentionInputs<T>& in) {
    const T scale = T(1) / std::sqrt(T(k_));
    if (fast_)
      kernels::attention_backward<T>(grads, dout.data(), d_, in, attn_.data(), d_, lse_.data(),
                                     shape_, mask_, scale, attention_drop_.mask());
    else
      kernels::attention_backward_naive<T>(grads, dout.data(), d_, in, attn_.data(), d_,
                                           lse_.data(), shape_, mask_, scale,
                                           attention_drop_.mask());
  }

  bool keep_weights_ = false;
  bool weights_current_ = false;  // weights_ holds a forward's since keep_attention_weights(true)
  Mode mode_ = Mode::None;
  Dropout<T> attention_drop_;        // the probabilities' dropout (applied inside the kernel)
  kernels::AttentionShape shape_{};  // [B, H, T, S, K] of the last forward
  AttentionMask<T> mask_;            // copy of the last forward's mask, kept for backward
  Tensor<T> x_;                      // [B, T, D] query input handle, kept for dW_in
  Tensor<T> memory_;                 // [B, S, D] memory handle (cross), kept for dW_in
  Tensor<T> qkv_;                    // [B, L, 3D] packed Q | K | V (self), kept for backward
  Tensor<T> q_;                      // [B, T, D] projected queries (cross), kept for backward
  Tensor<T> kv_;       // [B, S, 2D] projected K | V of the memory (cross), kept for backward
  Tensor<T> attn_;     // [B, T, D] concatenated heads before out_proj, kept for backward
  Tensor<T> lse_;      // [B, H, T] softmax log-sum-exp, kept for backward
  Tensor<T> weights_;  // [B, H, T, S] softmax probabilities, only when kept
  Tensor<T> dqkv_;     // [B, L, 3D] gradient buffer (self)
  Tensor<T> dq_;       // [B, T, D] gradient buffer (cross)
  Tensor<T> dkv_;      // [B, S, 2D] gradient buffer (cross)
  Tensor<T> dx_;       // [B, T, D] input-gradient buffer
  Tensor<T> dmemory_;  // [B, S, D] memory-gradient buffer (cross)
};

}  // namespace attn
