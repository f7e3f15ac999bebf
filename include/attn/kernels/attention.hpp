// Scaled dot-product attention, fast: the kernel MultiHeadAttention runs. The paper's Eq. 1,
//   Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V       per (batch row, head), scale =
//   1/sqrt(d_k)
// with masks and dropout as in attention_naive.hpp.
//
// Work is split over (batch row, head) pairs with OpenMP; each pair is computed by one thread with
// serial GEMMs (kernels/gemm.hpp) on strided maps of the packed Q, K, V, so the result is bitwise
// the same for any thread count; the GEMMs pack the head's K and V once for all its query blocks
// (all S keys, of which each block reads those it sees; detail/gemm_pack_buffers.hpp). Blocks of
// at least 8 queries
// (detail::kTileMinRows) of heads of 16-64 dimensions against at most 64 keys run in AVX-512
// register tiles instead (detail/attention_tile_avx512.hpp), which give the same bits. Inside a
// pair, queries go in blocks of kAttentionQueryBlock rows against the full key length: a thread
// holds at most [block, S] probabilities (two or three such buffers in backward), never the
// [B, H, T, S] tensor. With a causal mask a block only computes the keys its last row may see.
// Backward is FlashAttention's: the probabilities are recomputed from Q, K and the saved
// log-sum-exp, and the softmax derivative uses D_t = rowsum(dO_t * O_t) instead of a second pass
// over P.
//
// Layout, masks and dropout: attention_common.hpp and attn/mask.hpp. Same contract as
// attention_naive.hpp, against which tests/test_attention_kernels.cpp checks it. The scratch
// buffers, the softmax rows and the walk over blocks are in detail/attention_blocks.hpp, the
// register tiles' drivers in detail/attention_tiles.hpp.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attn/kernels/attention_common.hpp"
#include "attn/kernels/detail/attention_blocks.hpp"
#include "attn/kernels/detail/attention_tiles.hpp"
#include "attn/kernels/dropout.hpp"
#include "attn/kernels/gemm.hpp"

namespace attn::kernels {

/// out [B*T rows, ldo] <- attention; lse [B, H, T] the log-sum-exp of each row's scaled, masked
/// logits (+infinity for a fully blocked row); weights (nullptr = not wanted, no cost)
/// [B, H, T, S] the probabilities before dropout.
template <class T>
void attention_forward(T* out, Index ldo, T* lse, T* weights, const AttentionInputs<T>& in,
                       const AttentionShape& shape, const AttentionMask<T>& mask, T scale,
                       const DropoutMask& dropout = {}) {
  detail::check_attention("attention_forward", shape, mask, dropout,
                          {{"ldq", in.ldq}, {"ldk", in.ldk}, {"ldv", in.ldv}, {"ldo", ldo}});
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
        if (detail::forward_in_tiles(scratch, blk, in, out, ldo, lse, scale, mask, after_softmax))
          return;
        auto pb = scratch.block(scratch.p, blk.nt, blk.ns);
        detail::block_product(pb, blk.queries(in.q, in.ldq),
                              blk.head.keys(in.k, in.ldk).transpose(), false,
                              /*head_operand=*/true);
        detail::for_each_query_row(blk, mask.causal, [&](const detail::QueryRow& r) {
          T* row = scratch.p.data() + r.i * S;
          lse[r.bht] = detail::softmax_masked_row(row, r.n, scale, mask.additive.row(r.t), blk.pad);
          std::fill(row + r.n, row + blk.ns, T(0));
          after_softmax(r);
        });
        detail::block_product(blk.queries(out, ldo), pb, blk.head.keys(in.v, in.ldv), false,
                              /*head_operand=*/true);  // P V
      });
}

/// Backward of attention_forward: the gradients of the inputs `in` into `grads`, OVERWRITTEN, from
/// dout [B*T rows, lddo]. `out` and `lse` are the forward's.
///   forward:  P = softmax(scale Q K^T + bias),  Pd = P * M / (1 - p),  O = Pd V
///   dV = Pd^T dO;  dP = (dO V^T) * M / (1 - p);
///   rowsum(P * dP) = rowsum(Pd * dO V^T) = rowsum(dO * Pd V) = rowsum(dO * O) =: D, so
///   dlogits = P * (dP - D);  dQ = scale dlogits K;  dK = scale dlogits^T Q.
template <class T>
void attention_backward(const AttentionGradients<T>& grads, const T* dout, Index lddo,
                        const AttentionInputs<T>& in, const T* out, Index ldo, const T* lse,
                        const AttentionShape& shape, const AttentionMask<T>& mask, T scale,
                        const DropoutMask& dropout = {}) {
  detail::check_attention_backward("attention_backward", shape, mask, dropout, grads, lddo, in,
                                   ldo);
  const Index S = shape.keys;
  const bool drop = dropout.p > 0.0;
  if (shape.queries == 0) {  // no query blocks below: dK and dV are zero
    for (Index r = 0; r < shape.batch * S; ++r) {
      std::fill(grads.dk + r * grads.lddk, grads.dk + r * grads.lddk + shape.heads * shape.head_dim,
                T(0));
      std::fill(grads.dv + r * grads.lddv, grads.dv + r * grads.lddv + shape.heads * shape.head_dim,
                T(0));
    }
  }
  const detail::BackwardOperands<T> x{in, dout, lddo, out, ldo};
  detail::for_each_query_block(
      shape, mask, true, drop,
      [&](detail::AttentionScratch<T>& scratch, const detail::QueryBlock<T>& blk) {
        // A head's first query block stores dK and dV's rows [0, ns) (the later ones add to them)
        // and zeroes the others, which only later blocks (causal) see: no pass that zeroes all of
        // dK and dV first (0.9% of MHA 32 x 64 fwd+bwd in perf).
        const bool first = blk.t0 == 0;
        if (first && blk.ns < S) {
          blk.head.keys(grads.dk, grads.lddk).bottomRows(S - blk.ns).setZero();
          blk.head.keys(grads.dv, grads.lddv).bottomRows(S - blk.ns).setZero();
        }
        const auto qb = blk.queries(in.q, in.ldq), ob = blk.queries(out, ldo),
                   dob = blk.queries(dout, lddo);
        const bool tiles = detail::backward_tiles_apply<T>(shape, blk.nt, blk.ns);
        detail::backward_scores(scratch, blk, x, tiles);
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
        auto pb = scratch.block(drop ? scratch.pd : scratch.p, blk.nt, blk.ns);  // Pd, or P
        detail::gradient_product<T>(blk.keys(grads.dv, grads.lddv), pb.transpose(), dob, !first,
                                    tiles);
        // dS = P (dP - D) scale, a plain loop: on the short rows of a Multi30k batch (22 keys)
        // an Eigen array expression per row cost more to set up than to run (the same bits).
        for (Index i = 0; i < blk.nt; ++i) {
          const T d = dob.row(i).dot(ob.row(i));
          T* ds = scratch.dp.data() + i * S;
          const T* pr = scratch.p.data() + i * S;
          for (Index j = 0; j < blk.ns; ++j) ds[j] = pr[j] * (ds[j] - d) * scale;
        }
        auto dsb = scratch.block(scratch.dp, blk.nt, blk.ns);  // scale dlogits
        detail::gradient_product<T>(blk.queries(grads.dq, grads.lddq), dsb,
                                    blk.head.keys(in.k, in.ldk), false, tiles,
                                    /*head_operand=*/true);
        detail::gradient_product<T>(blk.keys(grads.dk, grads.lddk), dsb.transpose(), qb, !first,
                                    tiles);
      });
}

}  // namespace attn::kernels
