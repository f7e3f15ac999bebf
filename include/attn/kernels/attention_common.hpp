// What the naive and the fast attention kernels share: the problem's shape, the dropout on the
// attention weights, and the argument checks, so that both reject exactly the same calls.
//
// Layout (both kernels): Q is a row-major matrix of B*T rows; row b*T + t, columns [h*K, h*K + K)
// hold head h of query t of batch row b; consecutive rows are ldq elements apart (ldq >= H*K,
// e.g. 3*D when Q, K and V are column blocks of one packed [B*L, 3D] projection). K and V likewise
// with B*S rows (ldk, ldv); the output O with B*T rows (ldo). Heads are concatenated in the
// columns: exactly the layout the output projection multiplies as one GEMM.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "attn/error.hpp"
#include "attn/mask.hpp"
#include "attn/random.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

struct AttentionShape {
  Index batch, heads, queries /*T*/, keys /*S*/, head_dim /*K*/;
};

/// The forward's inputs in the layout above: Q [B*T rows, ldq], K [B*S rows, ldk], V [B*S, ldv].
template <class T>
struct AttentionInputs {
  const T* q;
  Index ldq;
  const T* k;
  Index ldk;
  const T* v;
  Index ldv;
};

/// Where backward writes the inputs' gradients: dQ [B*T rows, lddq], dK and dV [B*S rows]. They
/// are overwritten, and may be column blocks of one packed buffer.
template <class T>
struct AttentionGradients {
  T* dq;
  Index lddq;
  T* dk;
  Index lddk;
  T* dv;
  Index lddv;
};

// Dropout on the attention weights (after softmax, before multiplying V) is a DropoutMask
// (random.hpp) over the weights [B, H, T, S]: weight (b,h,t,s) is dropped iff
// uniform_at(key, ((b*H + h)*T + t)*S + s) < p.

namespace detail {

/// A row-major Eigen map whose rows lie `OuterStride` elements apart; const when T is.
template <class T>
using StridedMap = Eigen::Map<
    std::conditional_t<std::is_const_v<T>, const RowMatrix<std::remove_const_t<T>>, RowMatrix<T>>,
    0, Eigen::OuterStride<>>;

/// Head h of batch row b in the layout above: its [rows, K] blocks of the packed matrices, and
/// where its queries sit in [B, H, T] arrays. The one place the layout's index arithmetic lives.
struct AttentionHead {
  const AttentionShape& shape;
  Index b, h;

  /// Rows [t0, t0 + rows) of the head in a matrix of B*T query rows (Q, O, dQ, dO): [rows, K].
  template <class T>
  StridedMap<T> queries(T* x, Index ld, Index t0, Index rows) const {
    return block(x, ld, b * shape.queries + t0, rows);
  }
  /// All T query rows of the head: [T, K].
  template <class T>
  StridedMap<T> queries(T* x, Index ld) const {
    return queries(x, ld, 0, shape.queries);
  }
  /// The head in a matrix of B*S key rows (K, V, dK, dV): [S, K].
  template <class T>
  StridedMap<T> keys(T* x, Index ld) const {
    return block(x, ld, b * shape.keys, shape.keys);
  }
  /// Element (b, h, t) of a [B, H, T] array such as the log-sum-exp.
  Index query_index(Index t) const { return (b * shape.heads + h) * shape.queries + t; }

 private:
  template <class T>
  StridedMap<T> block(T* x, Index ld, Index row0, Index rows) const {
    return StridedMap<T>(x + row0 * ld + h * shape.head_dim, rows, shape.head_dim,
                         Eigen::OuterStride<>(ld));
  }
};

/// A leading dimension and its parameter name, for the messages of check_attention.
struct LeadingDim {
  const char* name;
  Index ld;
};

/// Throws unless the sizes, leading dimensions, mask and dropout fit together. `who` names the
/// calling kernel in the message.
template <class T>
void check_attention(const char* who, const AttentionShape& s, const AttentionMask<T>& mask,
                     const DropoutMask& dropout, std::initializer_list<LeadingDim> lds) {
  ATTN_CHECK(s.batch >= 0 && s.heads >= 0 && s.queries >= 0 && s.keys >= 0 && s.head_dim >= 0,
             ShapeError, who, ": sizes must be >= 0, got [B, H, T, S, K] = [", s.batch, ", ",
             s.heads, ", ", s.queries, ", ", s.keys, ", ", s.head_dim, "]");
  const Index width = s.heads * s.head_dim;
  for (const auto& l : lds)
    ATTN_CHECK(l.ld >= width, ShapeError, who, ": expected ", l.name, " >= H*K = ", s.heads, "*",
               s.head_dim, " = ", width, ", got ", l.ld);
  dropout.check(who);
  mask.check(s.batch, s.queries, s.keys);
}

/// check_attention with the eight leading dimensions every backward kernel takes.
template <class T>
void check_attention_backward(const char* who, const AttentionShape& s,
                              const AttentionMask<T>& mask, const DropoutMask& dropout,
                              const AttentionGradients<T>& g, Index lddo,
                              const AttentionInputs<T>& in, Index ldo) {
  check_attention(who, s, mask, dropout,
                  {{"lddq", g.lddq},
                   {"lddk", g.lddk},
                   {"lddv", g.lddv},
                   {"lddo", lddo},
                   {"ldq", in.ldq},
                   {"ldk", in.ldk},
                   {"ldv", in.ldv},
                   {"ldo", ldo}});
}

}  // namespace detail
}  // namespace attn::kernels
