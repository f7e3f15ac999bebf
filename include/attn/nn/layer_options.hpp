// LayerOptions: the sizes and regularisation of one Transformer layer, shared by the encoder and
// decoder layers and their stacks. Defaults are the paper's base model (Vaswani et al. 2017, table
// 3).
#pragma once

#include "attn/error.hpp"
#include "attn/tensor.hpp"

namespace attn {

struct LayerOptions {
  Index d_model = 512;  // D
  Index heads = 8;      // H; d_k = d_v = D / H
  Index d_ff = 2048;    // F
  /// P_drop of the paper: on each sublayer's output, before the residual add.
  double dropout = 0.1;
  /// On the softmax attention weights, and inside the feed-forward after the ReLU: tensor2tensor
  /// extras, both 0 in the paper.
  double attention_dropout = 0.0;
  double relu_dropout = 0.0;
  /// false: the paper's post-norm, x = LayerNorm(x + Dropout(f(x))).
  /// true:  pre-norm, x = x + Dropout(f(LayerNorm(x))); stacks then need a final LayerNorm.
  bool norm_first = false;
  double layer_norm_eps = 1e-5;
  /// The fused attention kernel, or the naive reference one (same results, for tests).
  bool use_fast_kernel = true;

  /// Throws ConfigError naming the offending value.
  void validate() const {
    ATTN_CHECK(d_model > 0, ConfigError, "d_model must be > 0, got ", d_model);
    ATTN_CHECK(heads > 0, ConfigError, "heads must be > 0, got ", heads);
    ATTN_CHECK(d_ff > 0, ConfigError, "d_ff must be > 0, got ", d_ff);
    ATTN_CHECK(d_model % heads == 0, ConfigError, "d_model (", d_model,
               ") must be divisible by heads (", heads, ")");
    check_probability(dropout, "dropout");
    check_probability(attention_dropout, "attention_dropout");
    check_probability(relu_dropout, "relu_dropout");
    ATTN_CHECK(layer_norm_eps > 0, ConfigError, "layer_norm_eps must be > 0, got ", layer_norm_eps);
  }

 private:
  static void check_probability(double p, const char* what) {
    ATTN_CHECK(p >= 0.0 && p < 1.0, ConfigError, what, " must be in [0, 1), got ", p);
  }
};

namespace detail {

/// Validates before any member is built, so the error names the LayerOptions field.
inline const LayerOptions& validated(const LayerOptions& o) {
  o.validate();
  return o;
}

/// Throws ShapeError unless x is a layer activation [B, L, D] (and B == batch when batch >= 0).
template <class T>
void check_activation(const Tensor<T>& x, Index d_model, const char* who, const char* what,
                      Index batch = -1) {
  const bool ok = x.rank() == 3 && x.size(2) == d_model && (batch < 0 || x.size(0) == batch);
  if (batch < 0)
    ATTN_CHECK(ok, ShapeError, who, ": expected ", what, " [B, L, ", d_model, "], got ", x.shape());
  else
    ATTN_CHECK(ok, ShapeError, who, ": expected ", what, " [", batch, ", S, ", d_model,
               "] (B of the target), got ", x.shape());
}

}  // namespace detail

}  // namespace attn
