// Scaled dot-product attention, fast: the kernel MultiHeadAttention runs. The paper's Eq. 1,
//   Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V       per (batch row, head), scale =
//   1/sqrt(d_k)
// with masks and dropout as in attention_naive.hpp.
//
// Work is split over (batch row, head) pairs with OpenMP; each pair is computed by one thread
// with serial Eigen GEMMs on strided maps of the packed Q, K, V, so the result is bitwise the
// same for any thread count. Inside a pair, queries go in blocks of kAttentionQueryBlock rows
// against the full key length: a thread holds at most [block, S] probabilities (two or three
// such buffers in backward), never the [B, H, T, S] tensor. With a causal mask a block only
// computes the keys its last row may see. Backward is FlashAttention's: the probabilities are
// recomputed from Q, K and the saved log-sum-exp, and the softmax derivative uses
// D_t = rowsum(dO_t * O_t) instead of a second pass over P.
//
// Layout, masks and dropout: attention_common.hpp and attn/mask.hpp. Same contract as
// attention_naive.hpp, against which tests/test_attention_kernels.cpp checks it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <type_traits>

#include "attn/kernels/attention_common.hpp"
#include "attn/kernels/detail/softmax_avx2.hpp"
#include "attn/kernels/detail/softmax_avx512.hpp"
#include "attn/kernels/dropout.hpp"
#include "attn/kernels/gemm.hpp"
#include "attn/kernels/softmax.hpp"
#include "attn/parallel.hpp"

namespace attn::kernels {

/// Query rows per block. Eigen repacks K and V for every block's GEMMs, so taller blocks amortise
/// that (128 rows measured ~8% faster than 64 at L = 512, 1024; 256 no better in backward), while
/// backward's [128, S] float buffers (three with dropout) still fit in L2 up to S of about 1024.
inline constexpr Index kAttentionQueryBlock = 128;

/// Below this many multiply-adds of Q K^T (B*H*T*S*K) the kernels run on the calling thread:
/// waking a thread team costs more than such a call (one decoding step, a gradient check), and
/// on a loaded machine a team's barrier can wait for a descheduled thread for milliseconds.
inline constexpr Index kAttentionParallelMinWork = Index(1) << 16;

namespace detail {

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

/// Everything one thread reuses across the (b, h) pairs it computes: [rows, S] buffers with rows S
/// apart, kept per thread from call to call and only ever grown, so that a training loop allocates
/// them in its first step and never again.
template <class T>
struct AttentionScratch {
  GrowingBuffer<T> p;    // [block, S] logits, then probabilities
  GrowingBuffer<T> dp;   // [block, S] dO V^T, then dlogits (backward)
  GrowingBuffer<T> pd;   // [block, S] dropped probabilities (backward with dropout)
  GrowingBuffer<T> pad;  // [S] key padding bias of the current batch row: 0 or -infinity
  Index S = 0;
  Index pad_batch = -1;

  /// The buffers for one call: [rows, S] each (dp in backward, pd in backward with dropout).
  void prepare(Index rows, Index keys, bool backward, bool dropout) {
    S = keys;
    pad_batch = -1;
    p.grow(rows * keys);
    if (backward) dp.grow(rows * keys);
    if (backward && dropout) pd.grow(rows * keys);
    pad.grow(keys);
  }
  /// The first nt rows and ns columns of buffer `buf`.
  StridedMap<T> block(GrowingBuffer<T>& buf, Index nt, Index ns) {
    return StridedMap<T>(buf.data(), nt, ns, Eigen::OuterStride<>(S));
  }
};

/// The calling thread's scratch.
template <class T>
AttentionScratch<T>& thread_scratch() {
  thread_local AttentionScratch<T> scratch;
  return scratch;
}

/// Fills scratch.pad for batch row b, once per b rather than once per row.
template <class T>
const T* key_padding_bias(AttentionScratch<T>& scratch, const KeyPaddingMask& mask, Index b) {
  if (mask.empty()) return nullptr;
  if (scratch.pad_batch != b) {
    const std::uint8_t* real = mask.row(b);
    for (Index s = 0; s < scratch.S; ++s)
      scratch.pad.data()[s] = real[s] ? T(0) : -std::numeric_limits<T>::infinity();
    scratch.pad_batch = b;
  }
  return scratch.pad.data();
}

/// row[0, n) <- scale * row + additive + pad (the last two optional).
template <class T>
void scale_and_mask(T* row, Index n, T scale, const T* additive, const T* pad) {
  ArrayMap<T> r(row, n);
  if (additive != nullptr && pad != nullptr)
    r = r * scale + ArrayMap<const T>(additive, n) + ArrayMap<const T>(pad, n);
  else if (additive != nullptr)
    r = r * scale + ArrayMap<const T>(additive, n);
  else if (pad != nullptr)
    r = r * scale + ArrayMap<const T>(pad, n);
  else
    r *= scale;
}

/// In place: row[0, n) <- softmax(scale row + additive + pad); returns the log-sum-exp. The
/// AVX-512 or AVX2 rows for float (detail/softmax_avx512.hpp, softmax_avx2.hpp: the same bits),
/// else two Eigen passes.
template <class T>
T softmax_masked_row(T* row, Index n, T scale, const T* additive, const T* pad) {
#if defined(ATTN_HAVE_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_has_avx512()) return softmax_row_avx512(row, n, scale, additive, pad);
    if (cpu_has_avx2_fma()) return avx2::softmax_row(row, n, scale, additive, pad);
  }
#endif
  scale_and_mask(row, n, scale, additive, pad);
  return softmax_row_forward(row, n);
}

/// In place: row[0, n) <- exp(scale row + additive + pad - lse), flushed (softmax.hpp): the
/// probabilities backward recomputes from the saved log-sum-exp.
template <class T>
void recompute_probabilities(T* row, Index n, T scale, const T* additive, const T* pad, T lse) {
#if defined(ATTN_HAVE_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    if (cpu_has_avx512()) return probabilities_avx512(row, n, scale, additive, pad, lse);
    if (cpu_has_avx2_fma()) return avx2::probabilities(row, n, scale, additive, pad, lse);
  }
#endif
  scale_and_mask(row, n, scale, additive, pad);
  ArrayMap<T>(row, n) -= lse;
  exp_flush_denormals(row, n);
}

/// Keys [0, n) that query t may see before masking by padding or bias: the causal prefix.
inline Index visible_keys(bool causal, Index t, Index Tq, Index S) {
  return causal ? t + 1 + (S - Tq) : S;
}

/// Runs body(scratch, head, pad) for every (batch row b, head h) pair, where pad is row b's key
/// padding bias (nullptr without padding): in parallel over the pairs, each thread with its own
/// scratch, when the work is worth waking a thread team.
template <class T, class Body>
void for_each_head(const AttentionShape& shape, const AttentionMask<T>& mask, bool backward,
                   bool drop, Body body) {
  const Index pairs = shape.batch * shape.heads;
  const Index work = pairs * shape.queries * shape.keys * shape.head_dim;
  RegionErrors errors;  // a scratch too large for memory is a std::bad_alloc for the caller
  const auto prepare = [&](AttentionScratch<T>& scratch) {
    errors.run([&] {
      scratch.prepare(std::min(kAttentionQueryBlock, shape.queries), shape.keys, backward, drop);
    });
  };
  const auto pair = [&](AttentionScratch<T>& scratch, Index bh) {
    errors.run([&] {
      const AttentionHead head{shape, bh / shape.heads, bh % shape.heads};
      body(scratch, head, key_padding_bias(scratch, mask.key_padding, head.b));
    });
  };
#if defined(_OPENMP)
  if (pairs > 1 && work >= kAttentionParallelMinWork && opens_team()) {
#pragma omp parallel
    {
      AttentionScratch<T>& scratch = thread_scratch<T>();
      prepare(scratch);
#pragma omp for schedule(static)
      for (Index bh = 0; bh < pairs; ++bh) pair(scratch, bh);
    }
    return errors.rethrow();
  }
#endif
  // On the calling thread, without a region (opens_team says why).
  AttentionScratch<T>& scratch = thread_scratch<T>();
  prepare(scratch);
  for (Index bh = 0; bh < pairs; ++bh) pair(scratch, bh);
  errors.rethrow();
}

/// Calls block(t0, nt, ns) for each block of query rows [t0, t0 + nt) of one head, where ns is the
/// number of keys the block's last row may see (S unless causal).
template <class Block>
void for_each_query_block(Index Tq, Index S, bool causal, Block block) {
  const Index rows = std::min(kAttentionQueryBlock, Tq);
  for (Index t0 = 0; t0 < Tq; t0 += rows) {
    const Index nt = std::min(rows, Tq - t0);
    block(t0, nt, visible_keys(causal, t0 + nt - 1, Tq, S));
  }
}

}  // namespace detail

/// out [B*T rows, ldo] <- attention; lse [B, H, T] the log-sum-exp of each row's scaled, masked
/// logits (+infinity for a fully blocked row); weights (nullptr = not wanted, no cost)
/// [B, H, T, S] the probabilities before dropout.
template <class T>
void attention_forward(T* out, Index ldo, T* lse, T* weights, const T* q, Index ldq, const T* k,
                       Index ldk, const T* v, Index ldv, const AttentionShape& shape,
                       const AttentionMask<T>& mask, T scale,
                       const AttentionDropout& dropout = {}) {
  detail::check_attention("attention_forward", shape, mask, dropout,
                          {{"ldq", ldq}, {"ldk", ldk}, {"ldv", ldv}, {"ldo", ldo}});
  const Index Tq = shape.queries, S = shape.keys;
  const bool drop = dropout.p > 0.0;
  detail::for_each_head(
      shape, mask, false, drop,
      [&](detail::AttentionScratch<T>& scratch, const detail::AttentionHead& head, const T* pad) {
        const auto kh = head.keys(k, ldk), vh = head.keys(v, ldv);
        detail::for_each_query_block(Tq, S, mask.causal, [&](Index t0, Index nt, Index ns) {
          auto pb = scratch.block(scratch.p, nt, ns);
          gemm(pb, head.queries(q, ldq, t0, nt), kh.topRows(ns).transpose(), false);
          for (Index i = 0; i < nt; ++i) {
            const Index t = t0 + i, bht = head.query_index(t);
            const Index n = detail::visible_keys(mask.causal, t, Tq, S);
            T* row = scratch.p.data() + i * S;
            lse[bht] = detail::softmax_masked_row(row, n, scale, mask.additive.row(t), pad);
            std::fill(row + n, row + ns, T(0));
            if (weights != nullptr) {
              T* w = weights + bht * S;
              std::copy(row, row + ns, w);
              std::fill(w + ns, w + S, T(0));
            }
            if (drop)  // element s of row t dropped iff uniform_at(key, bht S + s) < p
              detail::dropout_mask_span(row, row, n, static_cast<std::uint64_t>(bht * S),
                                        dropout.key, dropout.p);
          }
          gemm(head.queries(out, ldo, t0, nt), pb, vh.topRows(ns), false);
        });
      });
}

/// Backward of attention_forward; dq [B*T rows, lddq], dk, dv [B*S rows] are OVERWRITTEN (they may
/// be column blocks of one packed buffer). `out` and `lse` are the forward's.
///   forward:  P = softmax(scale Q K^T + bias),  Pd = P * M / (1 - p),  O = Pd V
///   dV = Pd^T dO;  dP = (dO V^T) * M / (1 - p);
///   rowsum(P * dP) = rowsum(Pd * dO V^T) = rowsum(dO * Pd V) = rowsum(dO * O) =: D, so
///   dlogits = P * (dP - D);  dQ = scale dlogits K;  dK = scale dlogits^T Q.
template <class T>
void attention_backward(T* dq, Index lddq, T* dk, Index lddk, T* dv, Index lddv, const T* dout,
                        Index lddo, const T* q, Index ldq, const T* k, Index ldk, const T* v,
                        Index ldv, const T* out, Index ldo, const T* lse,
                        const AttentionShape& shape, const AttentionMask<T>& mask, T scale,
                        const AttentionDropout& dropout = {}) {
  detail::check_attention_backward("attention_backward", shape, mask, dropout, lddq, lddk, lddv,
                                   lddo, ldq, ldk, ldv, ldo);
  const Index Tq = shape.queries, S = shape.keys;
  const bool drop = dropout.p > 0.0;
  detail::for_each_head(
      shape, mask, true, drop,
      [&](detail::AttentionScratch<T>& scratch, const detail::AttentionHead& head, const T* pad) {
        const auto kh = head.keys(k, ldk), vh = head.keys(v, ldv);
        auto dkh = head.keys(dk, lddk), dvh = head.keys(dv, lddv);
        // The first query block stores dK and dV's rows [0, ns) (the later ones add to them) and
        // zeroes the others, which only later blocks (causal) or none (no queries) see: no pass
        // that zeroes all of dK and dV first (0.9% of MHA 32 x 64 fwd+bwd in perf).
        if (Tq == 0) {
          dkh.setZero();
          dvh.setZero();
        }
        bool first = true;
        detail::for_each_query_block(Tq, S, mask.causal, [&](Index t0, Index nt, Index ns) {
          if (first && ns < S) {
            dkh.bottomRows(S - ns).setZero();
            dvh.bottomRows(S - ns).setZero();
          }
          const auto qb = head.queries(q, ldq, t0, nt), ob = head.queries(out, ldo, t0, nt),
                     dob = head.queries(dout, lddo, t0, nt);
          auto pb = scratch.block(scratch.p, nt, ns);
          auto dpb = scratch.block(scratch.dp, nt, ns);
          gemm(pb, qb, kh.topRows(ns).transpose(), false);
          gemm(dpb, dob, vh.topRows(ns).transpose(), false);
          for (Index i = 0; i < nt; ++i) {
            const Index t = t0 + i, bht = head.query_index(t);
            const Index n = detail::visible_keys(mask.causal, t, Tq, S);
            T* row = scratch.p.data() + i * S;
            // P recomputed from the saved log-sum-exp: exp(-inf - lse) = 0 for blocked keys, and
            // lse = +inf makes a fully blocked row exactly zero.
            detail::recompute_probabilities(row, n, scale, mask.additive.row(t), pad, lse[bht]);
            std::fill(row + n, row + ns, T(0));
            if (drop) {  // the forward's mask, on P (into Pd) and on dP
              T* dprow = scratch.dp.data() + i * S;
              T* pdrow = scratch.pd.data() + i * S;
              const auto base = static_cast<std::uint64_t>(bht * S);
              detail::dropout_mask_span(pdrow, row, n, base, dropout.key, dropout.p);
              detail::dropout_mask_span(dprow, dprow, n, base, dropout.key, dropout.p);
              std::fill(pdrow + n, pdrow + ns, T(0));
            }
          }
          if (drop)
            gemm(dvh.topRows(ns), scratch.block(scratch.pd, nt, ns).transpose(), dob, !first);
          else
            gemm(dvh.topRows(ns), pb.transpose(), dob, !first);
          for (Index i = 0; i < nt; ++i) {
            const T d = dob.row(i).dot(ob.row(i));
            ArrayMap<T> ds(scratch.dp.data() + i * S, ns);
            ds = ArrayMap<const T>(scratch.p.data() + i * S, ns) * (ds - d) * scale;
          }
          gemm(head.queries(dq, lddq, t0, nt), dpb, kh.topRows(ns), false);  // dpb: scale dlogits
          gemm(dkh.topRows(ns), dpb.transpose(), qb, !first);
          first = false;
        });
      });
}

}  // namespace attn::kernels
