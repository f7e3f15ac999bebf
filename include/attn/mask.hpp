// Attention masks that cannot be misread.
//
// PyTorch takes boolean masks in which `true` means "ignore" in one API and "keep" in another, and
// users get the meaning backwards (pytorch/pytorch#41508, #120488). attn has no raw boolean flag
// to flip: each kind of mask is its own type, built from a description of what is real.
//
//   causal          query t (of T) may attend key s (of S) iff s <= t + (S - T); with T == S this
//                   is s <= t, and with one query over a cache of S keys it allows all of them.
//   KeyPaddingMask  per batch row, which keys are real tokens; padding keys are never attended.
//                   Built from lengths or from token ids and the padding id, never from bools.
//   AdditiveMask    a [T, S] bias added to the scaled logits before the softmax, shared over
//                   batch and heads; -infinity blocks a position (PyTorch's float attn_mask).
//
// A query row whose keys are all blocked has no distribution to take: its attention weights,
// its output and every gradient through it are defined as exactly zero, on every kernel.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "attn/tensor.hpp"

namespace attn {

/// Which keys of each batch row are real tokens (attended) and which are padding (ignored).
class KeyPaddingMask {
 public:
  /// The empty mask: every key is real.
  KeyPaddingMask() = default;

  /// Row b has lengths[b] real keys at positions [0, lengths[b]) of `max_len`; the rest is padding.
  static KeyPaddingMask from_lengths(const std::vector<Index>& lengths, Index max_len) {
    ATTN_CHECK(max_len >= 0, ShapeError, "KeyPaddingMask: max_len must be >= 0, got ", max_len);
    KeyPaddingMask m(Shape{static_cast<Index>(lengths.size()), max_len});
    for (std::size_t b = 0; b < lengths.size(); ++b) {
      ATTN_CHECK(lengths[b] >= 0 && lengths[b] <= max_len, ShapeError, "KeyPaddingMask: length ",
                 lengths[b], " of batch row ", b, " outside [0, ", max_len, "]");
      for (Index s = 0; s < lengths[b]; ++s) m.real_[b * static_cast<std::size_t>(max_len) + s] = 1;
    }
    return m;
  }

  /// Keys whose token id equals `pad_id` are padding. `ids` is [B, S].
  static KeyPaddingMask from_tokens(const Tensor<TokenId>& ids, TokenId pad_id) {
    KeyPaddingMask m;
    m.assign_tokens(ids, pad_id);
    return m;
  }
  /// Makes this the mask of `ids` as from_tokens does, in the storage it has when that is large
  /// enough (a training loop's masks are allocated once, not once per batch).
  void assign_tokens(const Tensor<TokenId>& ids, TokenId pad_id) {
    ATTN_CHECK(ids.rank() == 2, ShapeError, "KeyPaddingMask: expected token ids [B, S], got ",
               ids.shape());
    real_.resize(static_cast<std::size_t>(ids.numel()));
    for (Index i = 0; i < ids.numel(); ++i)
      real_[static_cast<std::size_t>(i)] = ids.data()[i] != pad_id;
    batch_ = ids.size(0);
    length_ = ids.size(1);
    given_ = true;
  }

  /// True for the default mask (every key real); a mask made for B = 0 rows is not empty, and
  /// fits only attention of 0 rows.
  bool empty() const { return !given_; }
  Index batch() const { return batch_; }
  Index length() const { return length_; }
  /// True when key s of batch row b is a real token.
  bool is_real(Index b, Index s) const {
    return empty() || real_[static_cast<std::size_t>(b * length_ + s)] != 0;
  }
  /// The S flags of batch row b (1 = real), or nullptr for the empty mask.
  const std::uint8_t* row(Index b) const {
    return empty() ? nullptr : real_.data() + static_cast<std::size_t>(b * length_);
  }

 private:
  explicit KeyPaddingMask(const Shape& shape)  // [B, S]: its numel cannot overflow
      : real_(static_cast<std::size_t>(shape.numel()), 0),
        batch_(shape[0]),
        length_(shape[1]),
        given_(true) {}

  std::vector<std::uint8_t> real_;  // [B, S], 1 = real token
  Index batch_ = 0;
  Index length_ = 0;
  bool given_ = false;  // false: the default mask
};

/// A [T, S] bias added to the scaled attention logits; -infinity blocks a position.
template <class T>
class AdditiveMask {
 public:
  AdditiveMask() = default;
  explicit AdditiveMask(Tensor<T> bias) : bias_(std::move(bias)) {
    ATTN_CHECK(bias_.rank() == 2, ShapeError, "AdditiveMask: expected a [T, S] bias, got shape ",
               bias_.shape());
    for (Index i = 0; i < bias_.numel(); ++i) {  // +inf or NaN made every output of its row NaN
      const T b = bias_.data()[i];
      ATTN_CHECK(!std::isnan(b) && b != std::numeric_limits<T>::infinity(), ConfigError,
                 "AdditiveMask: a bias must be finite or -inf (a blocked key), got ", b,
                 " at query ", i / bias_.size(1), ", key ", i % bias_.size(1));
    }
  }
  bool empty() const { return bias_.rank() == 0; }
  const Tensor<T>& bias() const { return bias_; }
  /// The bias for query t and key s (0 for the empty mask).
  T at(Index t, Index s) const { return empty() ? T(0) : bias_(t, s); }
  /// The S biases of query row t, or nullptr for the empty mask.
  const T* row(Index t) const { return empty() ? nullptr : bias_.data() + t * bias_.size(1); }

 private:
  Tensor<T> bias_;  // [T, S]
};

/// Everything that restricts which keys a query attends; the default attends all.
template <class T>
struct AttentionMask {
  bool causal = false;
  KeyPaddingMask key_padding;
  AdditiveMask<T> additive;

  static AttentionMask none() { return {}; }
  static AttentionMask causal_only() {
    AttentionMask m;
    m.causal = true;
    return m;
  }

  /// Throws ShapeError unless the mask fits attention of B batch rows, T queries and S keys.
  void check(Index B, Index T_, Index S) const {
    if (!key_padding.empty())
      ATTN_CHECK(key_padding.batch() == B && key_padding.length() == S, ShapeError,
                 "KeyPaddingMask: expected [B, S] = [", B, ", ", S, "], got [", key_padding.batch(),
                 ", ", key_padding.length(), "]");
    if (!additive.empty())
      ATTN_CHECK(additive.bias().size(0) == T_ && additive.bias().size(1) == S, ShapeError,
                 "AdditiveMask: expected [T, S] = [", T_, ", ", S, "], got ",
                 additive.bias().shape());
    if (causal)
      ATTN_CHECK(S >= T_, ShapeError,
                 "causal mask: needs at least as many keys as queries, got T = ", T_,
                 " queries and S = ", S, " keys");
  }

  /// True when query t of batch row b may attend key s (before the additive bias).
  bool allows(Index b, Index t, Index s, Index T_, Index S) const {
    if (causal && s > t + (S - T_)) return false;
    return key_padding.is_real(b, s);
  }
};

}  // namespace attn
