// Scaled dot-product attention, fast: the kernel MultiHeadAttention runs. The paper's Eq. 1,
//   Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V       per (batch row, head), scale =
//   1/sqrt(d_k)
// with masks and dropout as in attention_naive.hpp.
//
// Work is split over (batch row, head) pairs with OpenMP; each pair is computed by one thread
// with serial GEMMs (kernels/gemm.hpp) on strided maps of the packed Q, K, V, so the result is
// bitwise the same for any thread count. Forward blocks of heads of 16-64 dimensions against at
// most 64 keys run in AVX-512 register tiles instead (detail/attention_tile_avx512.hpp), which
// give the same bits. Inside a pair, queries go in blocks of kAttentionQueryBlock rows
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
#include "attn/kernels/detail/attention_tile_avx512.hpp"
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
  GrowingBuffer<T> kt;   // [head_dim, 64] a block's K^T (forward_in_tiles)
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
#if defined(ATTN_HAVE_AVX512)
    if constexpr (std::is_same_v<T, float>) kt.grow(kTileHeadDim * kTileKeys);
#endif
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

/// A block of query rows [t0, t0 + nt) of one head and the keys [0, ns) its last row may see (S
/// unless causal): what one step of the kernels below computes. pad is the batch row's key padding
/// bias (nullptr without padding).
template <class T>
struct QueryBlock {
  const AttentionHead& head;
  const T* pad;
  Index t0, nt, ns;

  /// The block's rows of a matrix of B*T query rows (Q, O, dQ, dO): [nt, K].
  template <class U>
  StridedMap<U> queries(U* x, Index ld) const {
    return head.queries(x, ld, t0, nt);
  }
  /// The keys the block sees in a matrix of B*S key rows (K, V, dK, dV): [ns, K].
  template <class U>
  auto keys(U* x, Index ld) const {
    return head.keys(x, ld).topRows(ns);
  }
};

/// One query row of a block: i its row in the block's [nt, S] buffers, t its position, bht its
/// index in [B, H, T] arrays, n the keys [0, n) it may see before padding and bias.
struct QueryRow {
  Index i, t, bht, n;
};

/// Calls row(QueryRow) for each row of `block`, in order.
template <class T, class Row>
void for_each_query_row(const QueryBlock<T>& block, bool causal, Row row) {
  const AttentionShape& shape = block.head.shape;
  for (Index i = 0; i < block.nt; ++i) {
    const Index t = block.t0 + i;
    row(QueryRow{i, t, block.head.query_index(t),
                 visible_keys(causal, t, shape.queries, shape.keys)});
  }
}

/// Runs body(scratch, QueryBlock) for every block of kAttentionQueryBlock query rows of every
/// (batch row, head) pair, the blocks of a pair in order on one thread: in parallel over the
/// pairs (a StealingLoop), each thread with its own scratch, when the work is worth waking a
/// thread team.
template <class T, class Body>
void for_each_query_block(const AttentionShape& shape, const AttentionMask<T>& mask, bool backward,
                          bool drop, Body body) {
  const Index pairs = shape.batch * shape.heads;
  const Index work = pairs * shape.queries * shape.keys * shape.head_dim;
  const Index rows = std::min(kAttentionQueryBlock, shape.queries);
  RegionErrors errors;  // a scratch too large for memory is a std::bad_alloc for the caller
  const auto prepare = [&](AttentionScratch<T>& scratch) {
    errors.run([&] { scratch.prepare(rows, shape.keys, backward, drop); });
  };
  const auto pair = [&](AttentionScratch<T>& scratch, Index bh) {
    errors.run([&] {
      const AttentionHead head{shape, bh / shape.heads, bh % shape.heads};
      const T* pad = key_padding_bias(scratch, mask.key_padding, head.b);
      for (Index t0 = 0; t0 < shape.queries; t0 += rows) {
        const Index nt = std::min(rows, shape.queries - t0);
        const Index ns = visible_keys(mask.causal, t0 + nt - 1, shape.queries, shape.keys);
        body(scratch, QueryBlock<T>{head, pad, t0, nt, ns});
      }
    });
  };
#if defined(_OPENMP)
  if (pairs > 1 && work >= kAttentionParallelMinWork && opens_team()) {
    StealingLoop loop(pairs, omp_get_max_threads(), work / pairs);
#pragma omp parallel
    {
      AttentionScratch<T>& scratch = thread_scratch<T>();
      prepare(scratch);
      loop.run(omp_get_thread_num(), [&](Index bh) { pair(scratch, bh); });
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

/// Whether a forward block of nt queries against ns keys runs in register tiles
/// (attention_tile_avx512.hpp): float on a CPU with AVX-512 whose products take the AVX-512 GEMM
/// (whose bits the tiles give), heads of 16 to 64 dimensions (a multiple of 16) and 1 to 64 keys,
/// and at least kGemmPackedMinRows queries (fewer take the few-row GEMM, which sums in another
/// order).
template <class T>
bool forward_tiles_apply(const AttentionShape& shape, Index nt, Index ns) {
#if defined(ATTN_HAVE_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    const Index dk = shape.head_dim;
    return gemm_path() == GemmPath::avx512 && dk >= 16 && dk % 16 == 0 && dk <= kTileHeadDim &&
           ns >= 1 && ns <= kTileKeys && nt >= kGemmPackedMinRows;
  }
#endif
  (void)shape, (void)nt, (void)ns;
  return false;
}

/// Runs one forward query block in register tiles if forward_tiles_apply, and says whether it
/// did; after_softmax(QueryRow) then runs on each row's probabilities before they meet V.
template <class T, class AfterSoftmax>
bool forward_in_tiles(AttentionScratch<T>& scratch, const QueryBlock<T>& blk, const T* q, Index ldq,
                      const T* k, Index ldk, const T* v, Index ldv, T* out, Index ldo, T* lse,
                      T scale, const AttentionMask<T>& mask, AfterSoftmax after_softmax) {
#if defined(ATTN_HAVE_AVX512)
  if constexpr (std::is_same_v<T, float>) {
    const AttentionShape& shape = blk.head.shape;
    const Index dk = shape.head_dim, ns = blk.ns, S = scratch.S;
    if (!forward_tiles_apply<T>(shape, blk.nt, ns)) return false;
    float* kt = scratch.kt.data();
    transpose_keys(blk.head.keys(k, ldk).data(), ldk, ns, dk, kt);
    const float* qb = blk.queries(q, ldq).data();
    float* ob = blk.queries(out, ldo).data();
    const float* vb = blk.head.keys(v, ldv).data();
    const Index nt = blk.nt;
    for (Index i0 = 0; i0 < nt; i0 += kTileRows) {
      TileRows rows;
      rows.count = static_cast<int>(std::min<Index>(kTileRows, nt - i0));
      for (int r = 0; r < rows.count; ++r) {
        const Index t = blk.t0 + i0 + r;
        rows.n[r] = visible_keys(mask.causal, t, shape.queries, shape.keys);
        rows.additive[r] = mask.additive.row(t);
      }
      // The next tile's queries, and a share of V, come from L3 while this tile computes.
      const Index next = std::min<Index>(kTileRows, nt - i0 - kTileRows);
      if (next > 0) prefetch_rows(qb + (i0 + kTileRows) * ldq, next, ldq, dk);
      const Index v0 = i0 * ns / nt, v1 = std::min<Index>(nt, i0 + kTileRows) * ns / nt;
      prefetch_rows(vb + v0 * ldv, v1 - v0, ldv, dk);
      probabilities_tile(qb + i0 * ldq, ldq, dk, kt, ns, scale, blk.pad, rows,
                         scratch.p.data() + i0 * S, S);
      for (int r = 0; r < rows.count; ++r) {
        const Index t = blk.t0 + i0 + r;
        const QueryRow row{i0 + r, t, blk.head.query_index(t), rows.n[r]};
        lse[row.bht] = rows.lse[r];
        after_softmax(row);
      }
    }
    for (Index i0 = 0; i0 < nt; i0 += kTileRows)
      weighted_values_tile(scratch.p.data() + i0 * S, S,
                           static_cast<int>(std::min<Index>(kTileRows, nt - i0)), ns, vb, ldv, dk,
                           ob + i0 * ldo, ldo);
    return true;
  }
#endif
  (void)scratch, (void)blk, (void)q, (void)ldq, (void)k, (void)ldk, (void)v, (void)ldv;
  (void)out, (void)ldo, (void)lse, (void)scale, (void)mask, (void)after_softmax;
  return false;
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
  const Index S = shape.keys;
  const bool drop = dropout.p > 0.0;
  detail::for_each_query_block(
      shape, mask, false, drop,
      [&](detail::AttentionScratch<T>& scratch, const detail::QueryBlock<T>& blk) {
        // A row's probabilities, before they meet V: kept as the weights, then dropped out.
        const auto after_softmax = [&](const detail::QueryRow& r) {
          T* row = scratch.p.data() + r.i * S;
          if (weights != nullptr) {
            T* w = weights + r.bht * S;
            std::copy(row, row + blk.ns, w);
            std::fill(w + blk.ns, w + S, T(0));
          }
          if (drop)  // element s of row t dropped iff uniform_at(key, bht S + s) < p
            detail::dropout_mask_span(row, row, r.n, static_cast<std::uint64_t>(r.bht * S),
                                      dropout.key, dropout.p);
        };
        if (detail::forward_in_tiles(scratch, blk, q, ldq, k, ldk, v, ldv, out, ldo, lse, scale,
                                     mask, after_softmax))
          return;
        auto pb = scratch.block(scratch.p, blk.nt, blk.ns);
        gemm(pb, blk.queries(q, ldq), blk.keys(k, ldk).transpose(), false);  // Q K^T
        detail::for_each_query_row(blk, mask.causal, [&](const detail::QueryRow& r) {
          T* row = scratch.p.data() + r.i * S;
          lse[r.bht] = detail::softmax_masked_row(row, r.n, scale, mask.additive.row(r.t), blk.pad);
          std::fill(row + r.n, row + blk.ns, T(0));
          after_softmax(r);
        });
        gemm(blk.queries(out, ldo), pb, blk.keys(v, ldv), false);  // softmax(...) V
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
  const Index S = shape.keys;
  const bool drop = dropout.p > 0.0;
  if (shape.queries == 0) {  // no query blocks below: dK and dV are zero
    for (Index r = 0; r < shape.batch * S; ++r) {
      std::fill(dk + r * lddk, dk + r * lddk + shape.heads * shape.head_dim, T(0));
      std::fill(dv + r * lddv, dv + r * lddv + shape.heads * shape.head_dim, T(0));
    }
  }
  detail::for_each_query_block(
      shape, mask, true, drop,
      [&](detail::AttentionScratch<T>& scratch, const detail::QueryBlock<T>& blk) {
        // A head's first query block stores dK and dV's rows [0, ns) (the later ones add to them)
        // and zeroes the others, which only later blocks (causal) see: no pass that zeroes all of
        // dK and dV first (0.9% of MHA 32 x 64 fwd+bwd in perf).
        const bool first = blk.t0 == 0;
        if (first && blk.ns < S) {
          blk.head.keys(dk, lddk).bottomRows(S - blk.ns).setZero();
          blk.head.keys(dv, lddv).bottomRows(S - blk.ns).setZero();
        }
        const auto qb = blk.queries(q, ldq), ob = blk.queries(out, ldo),
                   dob = blk.queries(dout, lddo);
        auto pb = scratch.block(scratch.p, blk.nt, blk.ns);
        auto dpb = scratch.block(scratch.dp, blk.nt, blk.ns);
        gemm(pb, qb, blk.keys(k, ldk).transpose(), false);
        gemm(dpb, dob, blk.keys(v, ldv).transpose(), false);
        detail::for_each_query_row(blk, mask.causal, [&](const detail::QueryRow& r) {
          T* row = scratch.p.data() + r.i * S;
          // P recomputed from the saved log-sum-exp: exp(-inf - lse) = 0 for blocked keys, and
          // lse = +inf makes a fully blocked row exactly zero.
          detail::recompute_probabilities(row, r.n, scale, mask.additive.row(r.t), blk.pad,
                                          lse[r.bht]);
          std::fill(row + r.n, row + blk.ns, T(0));
          if (drop) {  // the forward's mask, on P (into Pd) and on dP
            T* dprow = scratch.dp.data() + r.i * S;
            T* pdrow = scratch.pd.data() + r.i * S;
            const auto base = static_cast<std::uint64_t>(r.bht * S);
            detail::dropout_mask_span(pdrow, row, r.n, base, dropout.key, dropout.p);
            detail::dropout_mask_span(dprow, dprow, r.n, base, dropout.key, dropout.p);
            std::fill(pdrow + r.n, pdrow + blk.ns, T(0));
          }
        });
        auto dvb = blk.keys(dv, lddv);
        if (drop)
          gemm(dvb, scratch.block(scratch.pd, blk.nt, blk.ns).transpose(), dob, !first);
        else
          gemm(dvb, pb.transpose(), dob, !first);
        // dS = P (dP - D) scale, a plain loop: on the short rows of a Multi30k batch (22 keys)
        // an Eigen array expression per row cost more to set up than to run (the same bits).
        for (Index i = 0; i < blk.nt; ++i) {
          const T d = dob.row(i).dot(ob.row(i));
          T* ds = scratch.dp.data() + i * S;
          const T* pr = scratch.p.data() + i * S;
          for (Index j = 0; j < blk.ns; ++j) ds[j] = pr[j] * (ds[j] - d) * scale;
        }
        gemm(blk.queries(dq, lddq), dpb, blk.keys(k, ldk), false);  // dpb: scale dlogits
        gemm(blk.keys(dk, lddk), dpb.transpose(), qb, !first);
      });
}

}  // namespace attn::kernels
