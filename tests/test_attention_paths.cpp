// Attention kernels on their fast paths: the same bits on 1, 2 and 3 threads, AVX-512 register
// tiles against the packed GEMMs they replace, and a head's keys and values packed once for all
// its blocks of queries against each block alone.
#include <cstdint>
#include <utility>
#include <vector>

#include "attention_problem.hpp"
#include "pch.hpp"

namespace attn {
namespace {

using namespace testing;  // attention_problem.hpp

// The (batch, head) pairs go to the threads through a StealingLoop, so which thread computes a
// pair changes from run to run; 3 threads on 2 cores make it likely that pairs are taken from
// another thread's share.
TEST(AttentionKernels, FastKernelIsBitwiseIdenticalOnOneTwoAndThreeThreads) {
  Problem<float> pb = make_problem<float>(2, 3, 70, 75, 8, 2, 31);
  pb.mask = make_mask<float>(kAll, pb.shape);
  pb.dropout = {0.2, 5};
  const int saved = num_threads();
  set_num_threads(1);
  const Result<float> one = run(pb, true, true, true);
  for (const int threads : {2, 3, 3}) {
    set_num_threads(threads);
    const Result<float> many = run(pb, true, true, true);
    const Index hk = 24;
    EXPECT_EQ(rel_diff(one.out, many.out, hk), 0.0) << threads << " threads";
    EXPECT_EQ(rel_diff(one.lse, many.lse), 0.0) << threads << " threads";
    EXPECT_EQ(rel_diff(one.weights, many.weights), 0.0) << threads << " threads";
    EXPECT_EQ(rel_diff(one.dq, many.dq, hk), 0.0) << threads << " threads";
    EXPECT_EQ(rel_diff(one.dk, many.dk, hk), 0.0) << threads << " threads";
    EXPECT_EQ(rel_diff(one.dv, many.dv, hk), 0.0) << threads << " threads";
  }
  set_num_threads(saved);
}

// Blocks of heads of 16-64 dimensions against at most 64 keys run in AVX-512 register tiles
// (detail/attention_tile_avx512.hpp): forward with at least kTileMinRows (8) queries, backward
// with at least 8 queries and 8 keys. They must give the bits of the packed GEMMs they replace.
// That path is what the AVX2 GEMM runs (the same bits as the AVX-512 GEMM, tests/test_gemm.cpp),
// so the two are compared bit for bit, and both against the naive kernel; the tiles' block
// counters show that they ran. Shapes: 1 to 64 keys across one to four 16-key registers (22: a
// Multi30k batch), query blocks of 8 and 9 rows (the fewest the tiles take; 9 against 5 keys:
// forward in tiles, backward not), 3 and 7 (none in tiles) to 130 (a block of 128 rows, then one
// of 2 on the few-row path), 136 (then one of 8 in tiles) and 160 (a second block of 32 rows,
// whose dK and dV add to the first's), every mask, dropout and the weights. Blocks that never
// take the tiles, 12 queries against 80 keys and heads of 24, must still give the same bits on
// both paths: their products of 8 or more rows take the packed order on both.
TEST(AttentionKernels, RegisterTilesGiveTheBitsOfThePackedPath) {
  if (!kernels::gemm_path_available(kernels::GemmPath::avx512) ||
      !kernels::gemm_path_available(kernels::GemmPath::avx2))
    GTEST_SKIP() << "this CPU or build has no AVX-512 GEMM: the register tiles never run";
  struct Case {
    Index B, H, Tq, S, K, extra;
  };
  // Blocks of as few as kTileMinRows (8) queries and keys run in tiles; the rest take the GEMMs:
  // the packed kernel's order from 8 rows, the few-row kernels below.
  const Case cases[] = {{2, 2, 16, 1, 16, 0},  {1, 3, 17, 15, 32, 1},  {2, 1, 23, 16, 48, 0},
                        {2, 2, 22, 22, 32, 1}, {1, 2, 40, 40, 64, 3},  {2, 2, 64, 64, 64, 0},
                        {1, 1, 20, 64, 16, 2}, {1, 2, 130, 49, 32, 0}, {1, 2, 160, 48, 32, 1},
                        {3, 2, 8, 8, 32, 0},   {2, 2, 12, 9, 32, 1},   {2, 1, 9, 5, 16, 0},
                        {2, 2, 7, 12, 32, 0},  {1, 2, 136, 30, 32, 0}, {2, 1, 3, 3, 64, 0},
                        {2, 2, 12, 80, 32, 0}, {2, 2, 12, 10, 24, 1}};
  int tiled = 0;
  for (const Case& c : cases)
    for (int kind : {kNone, kCausal, kPadding, kAdditive, kAll}) {
      if ((kind & kCausal) && c.S < c.Tq) continue;
      for (double p : {0.0, 0.3}) {
        SCOPED_TRACE(::testing::Message() << "B=" << c.B << " H=" << c.H << " T=" << c.Tq << " S="
                                          << c.S << " K=" << c.K << " mask=" << kind << " p=" << p);
        Problem<float> pb = make_problem<float>(c.B, c.H, c.Tq, c.S, c.K, c.extra, 11);
        pb.mask = make_mask<float>(kind, pb.shape);
        pb.dropout = {p, 0xab5eULL};
        // Blocks of 128 queries; a last block of fewer than kTileMinRows takes the GEMMs.
        const Index min_rows = kernels::detail::kTileMinRows;
        const Index full = c.Tq / kernels::kAttentionQueryBlock,
                    rest = c.Tq % kernels::kAttentionQueryBlock;
        const bool fits = c.S <= 64 && c.K % 16 == 0 && c.K <= 64;  // heads and keys of a tile
        const Index blocks = fits ? c.B * c.H * (full + (rest >= min_rows ? 1 : 0)) : 0;
        // The fast kernel on `path`, which must run `forward` and `backward` blocks in tiles.
        const auto run_on = [&](kernels::GemmPath path, Index forward, Index backward) {
          GemmPathScope scope(path);
          const auto fwd = kernels::detail::tile_blocks(false).load();
          const auto bwd = kernels::detail::tile_blocks(true).load();
          Result<float> r = run(pb, true, true, true);
          EXPECT_EQ(kernels::detail::tile_blocks(false).load() - fwd, forward);
          EXPECT_EQ(kernels::detail::tile_blocks(true).load() - bwd, backward);
          return r;
        };
        const Result<float> tiles =
            run_on(kernels::GemmPath::avx512, blocks, c.S >= min_rows ? blocks : 0);
        const Result<float> packed = run_on(kernels::GemmPath::avx2, 0, 0);
        const Result<float> naive = run(pb, false, true, true);
        const Index hk = c.H * c.K;
        expect_same_bits(packed, tiles, hk);
        for (const auto& [want, got] : {std::pair{&naive.out, &tiles.out},
                                        {&naive.dq, &tiles.dq},
                                        {&naive.dk, &tiles.dk},
                                        {&naive.dv, &tiles.dv}}) {
          EXPECT_LT(rel_diff(*want, *got, hk), 1e-5);
          EXPECT_TRUE(padding_untouched(*got, hk));
        }
        EXPECT_LT(rel_diff(naive.weights, tiles.weights), 1e-5);
        ++tiled;
      }
    }
  EXPECT_EQ(tiled, 134);  // 8 cases x 5 masks + 9 cases (S < T) x 3 masks, x 2 dropout
}

/// Queries [t0, t0 + nt) of `pb` as a problem of their own, with the same keys, values and key
/// padding (no additive mask or dropout, which depend on a query's position). Under a causal mask,
/// with the keys those queries see, [0, t0 + nt + S - T), so that each sees the keys it saw.
Problem<float> query_rows(const Problem<float>& pb, Index t0, Index nt) {
  Problem<float> part = pb;
  const AttentionShape& s = pb.shape;
  part.shape.queries = nt;
  part.q = Tensor<float>({s.batch * nt, pb.ldq});
  part.dout = Tensor<float>({s.batch * nt, pb.ldo});
  for (Index b = 0; b < s.batch; ++b)
    for (Index i = 0; i < nt; ++i) {
      const Index from = b * s.queries + t0 + i, to = b * nt + i;
      for (Index j = 0; j < pb.ldq; ++j) part.q(to, j) = pb.q(from, j);
      for (Index j = 0; j < pb.ldo; ++j) part.dout(to, j) = pb.dout(from, j);
    }
  if (!pb.mask.causal) return part;
  const Index n = t0 + nt + s.keys - s.queries;
  part.shape.keys = n;
  part.k = Tensor<float>({s.batch * n, pb.ldk});
  part.v = Tensor<float>({s.batch * n, pb.ldv});
  std::vector<Index> lengths;
  for (Index b = 0; b < s.batch; ++b) {
    for (Index j = 0; j < n; ++j) {
      for (Index c = 0; c < pb.ldk; ++c) part.k(b * n + j, c) = pb.k(b * s.keys + j, c);
      for (Index c = 0; c < pb.ldv; ++c) part.v(b * n + j, c) = pb.v(b * s.keys + j, c);
    }
    Index real = 0;  // make_mask's padding is a prefix of real keys
    while (real < n && pb.mask.key_padding.is_real(b, real)) ++real;
    lengths.push_back(real);
  }
  if (!pb.mask.key_padding.empty())
    part.mask.key_padding = KeyPaddingMask::from_lengths(lengths, n);
  return part;
}

// A head's blocks of queries pack its K^T and V (forward), K^T, V^T and K (backward) once and reuse
// them (detail/gemm_pack_buffers.hpp); the copies' counter shows that they did. Each block must
// still give the bits it gives in a call of its own, which packs them anew: the output, log-sum-exp
// and dQ of the queries of a block of 128, another of 128 and a last of 40 (keys past 64, so no
// register tiles), without and with key padding and a causal mask, on each kernel. Under a causal
// mask each block sees more keys than the one before: the head's first block packs all of them,
// and each block reads those it sees (its call of its own has only those keys). dK and dV sum over
// the blocks, so they are checked against the naive kernel, and the whole call on two threads for
// its bits; the output, log-sum-exp and dQ against it too.
TEST(AttentionKernels, HeadOperandsPackedOnceGiveTheBitsOfEachBlockAlone) {
  const Index B = 2, H = 2, K = 32, block = kernels::kAttentionQueryBlock;
  const Index Tq = 2 * block + 40, blocks = 3, hk = H * K;
  if (!kernels::gemm_path_available(kernels::GemmPath::avx2) &&
      !kernels::gemm_path_available(kernels::GemmPath::avx512))
    GTEST_SKIP() << "no AVX2 or AVX-512 GEMM on this CPU: nothing reuses a packed operand";
  const int saved = num_threads();
  for (const auto path : {kernels::GemmPath::avx512, kernels::GemmPath::avx2}) {
    if (!kernels::gemm_path_available(path)) continue;
    GemmPathScope scope(path);
    for (int kind : {int(kNone), int(kPadding), int(kCausal), kCausal | kPadding}) {
      SCOPED_TRACE(::testing::Message() << kernels::gemm_path_name(path) << " mask=" << kind);
      // 300 keys; under a causal mask 310, so that the blocks see 142, 270 and 310 of them.
      const Index S = kind & kCausal ? Tq + 14 : 300;
      Problem<float> pb = make_problem<float>(B, H, Tq, S, K, 1, 41);
      pb.mask = make_mask<float>(kind, pb.shape);
      set_num_threads(1);  // the counter is the calling thread's
      const std::uint64_t before = kernels::detail::reused_b_cache().reuses;
      const Result<float> whole = run(pb, true, false, true);
      // Every block after a head's first reuses 2 copies in forward and 3 in backward.
      EXPECT_EQ(kernels::detail::reused_b_cache().reuses - before,
                static_cast<std::uint64_t>(B * H * (blocks - 1) * (2 + 3)));
      for (Index t0 = 0; t0 < Tq; t0 += block) {
        const Index nt = std::min(block, Tq - t0);
        const Result<float> alone = run(query_rows(pb, t0, nt), true, false, true);
        for (Index b = 0; b < B; ++b)
          for (Index i = 0; i < nt; ++i) {
            const Index row = b * Tq + t0 + i, own = b * nt + i;
            for (Index j = 0; j < hk; ++j) {
              ASSERT_EQ(whole.out(row, j), alone.out(own, j)) << "out " << row << ", " << j;
              ASSERT_EQ(whole.dq(row, j), alone.dq(own, j)) << "dq " << row << ", " << j;
            }
            for (Index h = 0; h < H; ++h)
              ASSERT_EQ(whole.lse.data()[(b * H + h) * Tq + t0 + i],
                        alone.lse.data()[(b * H + h) * nt + i]);
          }
      }
      const Result<float> naive = run(pb, false, false, true);
      EXPECT_LT(rel_diff(naive.out, whole.out, hk), 1e-5);
      EXPECT_LT(rel_diff(naive.lse, whole.lse), 1e-5);
      EXPECT_LT(rel_diff(naive.dq, whole.dq, hk), 1e-5);
      EXPECT_LT(rel_diff(naive.dk, whole.dk, hk), 1e-5);
      EXPECT_LT(rel_diff(naive.dv, whole.dv, hk), 1e-5);
      set_num_threads(2);
      const Result<float> two = run(pb, true, false, true);
      EXPECT_TRUE(same_bits(whole.out, two.out, hk) && same_bits(whole.dq, two.dq, hk) &&
                  same_bits(whole.dk, two.dk, hk) && same_bits(whole.dv, two.dv, hk));
      set_num_threads(1);
    }
  }
  set_num_threads(saved);
}

}  // namespace
}  // namespace attn
