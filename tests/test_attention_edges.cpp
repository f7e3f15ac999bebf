// Attention kernels at their edges: the fast kernel in double on 2 threads (its (batch, head)
// pairs then go to a thread team, whose results must be 1 thread's bits), and the empty shapes,
// no keys (S = 0), no batch rows (B = 0), no heads (H = 0), no queries (T = 0) and heads of no
// dimensions (K = 0), for which check_attention accepts every size >= 0 and refuses only a causal
// mask with fewer keys than queries. Each is run on the fast and the naive kernel, forward and
// backward, with every mask and with dropout, in float (on each GEMM path) and double.
#include <cmath>
#include <limits>
#include <vector>

#include "attention_problem.hpp"
#include "gemm_testing.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

using namespace testing;  // attention_problem.hpp

// The comparisons of fast against naive on the columns [0, H*K) each buffer's heads fill, and
// the checks that both kept to them and wrote no NaN.
template <class T>
void expect_fast_matches_naive(const Result<T>& naive, const Result<T>& fast, Index hk,
                               double tol) {
  EXPECT_LT(rel_diff(naive.out, fast.out, hk), tol);
  EXPECT_LT(rel_diff(naive.lse, fast.lse), tol);
  EXPECT_LT(rel_diff(naive.weights, fast.weights), tol);
  EXPECT_LT(rel_diff(naive.dq, fast.dq, hk), tol);
  EXPECT_LT(rel_diff(naive.dk, fast.dk, hk), tol);
  EXPECT_LT(rel_diff(naive.dv, fast.dv, hk), tol);
  for (const Result<T>* r : {&naive, &fast})
    for (const Tensor<T>* t : {&r->out, &r->dq, &r->dk, &r->dv}) {
      EXPECT_TRUE(padding_untouched(*t, hk)) << (r == &fast ? "fast" : "naive");
      EXPECT_FALSE(has_nan(*t, hk)) << (r == &fast ? "fast" : "naive");
    }
}

// Double products take Eigen's GEMM whatever the path, so the fast kernel's double path had only
// been compared with the naive one on a single thread (gradient checks and the float thread tests
// run elsewhere). These shapes are above kAttentionParallelMinWork with several (batch, head)
// pairs, so 2 threads open a team; the second case has two query blocks per head.
TEST(AttentionKernels, DoubleFastKernelOnTwoThreadsHasOneThreadsBitsAndMatchesNaive) {
  struct Case {
    Index B, H, Tq, S, K, extra;
  };
  const Case cases[] = {
      {2, 3, 70, 75, 8, 2},
      {1, 2, kernels::kAttentionQueryBlock + 5, kernels::kAttentionQueryBlock + 12, 4, 1},
      {4, 2, 20, 300, 8, 0}};
  const OneThread restore;  // the thread count, after the test
  for (const Case& c : cases) {
    const Index work = c.B * c.H * c.Tq * c.S * c.K;
    ASSERT_GE(work, kernels::kAttentionParallelMinWork) << "too little work to open a team";
    for (int kind : {kNone, kCausal, kPadding, kAdditive, kAll})
      for (double p : {0.0, 0.3}) {
        SCOPED_TRACE(::testing::Message() << "B=" << c.B << " H=" << c.H << " T=" << c.Tq << " S="
                                          << c.S << " K=" << c.K << " mask=" << kind << " p=" << p);
        Problem<double> pb = make_problem<double>(c.B, c.H, c.Tq, c.S, c.K, c.extra, 41);
        pb.mask = make_mask<double>(kind, pb.shape);
        pb.dropout = {p, 0xd0b1eULL};
        set_num_threads(1);
        const Result<double> one = run(pb, true, true, true);
        set_num_threads(2);
        ASSERT_EQ(num_threads(), 2);
        const Result<double> two = run(pb, true, true, true);
        const Result<double> naive = run(pb, false, true, true);
        const Index hk = c.H * c.K;
        expect_same_bits(one, two, hk);
        expect_fast_matches_naive(naive, two, hk, 1e-12);
      }
  }
}

// make_mask for shapes with no keys or queries: key padding of lengths S and S / 2 (S / 2 = 0
// for S = 1: a batch row all padding), where make_mask's lengths of at least 1 fit no S = 0.
template <class T>
AttentionMask<T> edge_mask(int kind, const AttentionShape& s) {
  AttentionMask<T> m = make_mask<T>(kind & ~kPadding, s);
  if (kind & kPadding) {
    std::vector<Index> lengths;
    for (Index b = 0; b < s.batch; ++b) lengths.push_back(b % 2 == 0 ? s.keys : s.keys / 2);
    m.key_padding = KeyPaddingMask::from_lengths(lengths, s.keys);
  }
  return m;
}

// Backward of one kernel on its own, on outputs of zeros: what the check of its arguments says.
template <class T>
void backward_only(const Problem<T>& pb, bool fast) {
  const auto& s = pb.shape;
  Tensor<T> out(pb.dout.shape()), lse({s.batch, s.heads, s.queries});
  Tensor<T> dq(pb.q.shape()), dk(pb.k.shape()), dv(pb.v.shape());
  auto bwd = fast ? kernels::attention_backward<T> : kernels::attention_backward_naive<T>;
  bwd({dq.data(), pb.ldq, dk.data(), pb.ldk, dv.data(), pb.ldv}, pb.dout.data(), pb.ldo,
      pb.inputs(), out.data(), pb.ldo, lse.data(), s, pb.mask, pb.scale, pb.dropout);
}

// What an empty shape must give, beyond fast and naive agreeing: with no keys every query's
// output and gradient is exactly zero and its log-sum-exp +infinity (a fully blocked row); with no
// queries the keys' gradients are exactly zero (both kernels overwrite dK and dV).
template <class T>
void expect_empty_shape_contract(const Problem<T>& pb, const Result<T>& r) {
  const auto& s = pb.shape;
  const Index hk = s.heads * s.head_dim;
  if (s.keys == 0) {
    for (Index i = 0; i < s.batch * s.queries; ++i)
      for (Index c = 0; c < hk; ++c) {
        EXPECT_EQ(r.out(i, c), T(0));
        EXPECT_EQ(r.dq(i, c), T(0));
      }
    for (Index i = 0; i < r.lse.numel(); ++i)
      EXPECT_EQ(r.lse.data()[i], std::numeric_limits<T>::infinity());
  }
  if (s.queries == 0)
    for (Index i = 0; i < s.batch * s.keys; ++i)
      for (Index c = 0; c < hk; ++c) {
        EXPECT_EQ(r.dk(i, c), T(0));
        EXPECT_EQ(r.dv(i, c), T(0));
      }
}

// The GEMM paths a float problem runs on (each of attn's kernels and Eigen's), or only the
// automatic one for double, whose products always take Eigen's.
template <class T>
std::vector<kernels::GemmPath> paths_for() {
  if (std::is_same_v<T, double>) return {kernels::GemmPath::automatic};
  return available_paths();
}

template <class T>
class AttentionEdges : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(AttentionEdges, Scalars);

// Every size may be 0. A causal mask needs S >= T, so with no keys and some queries both kernels
// refuse it (forward and backward, ShapeError); every other mask runs. Outputs start as NaN, and
// their columns past H*K (extra > 0) must stay NaN: with H = 0 or B = 0 nothing is written at all.
TYPED_TEST(AttentionEdges, EmptyShapesRunOrAreRefusedAlikeOnBothKernels) {
  using T = TypeParam;
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  struct Case {
    Index B, H, Tq, S, K, extra;
  };
  const Case cases[] = {{2, 2, 3, 0, 4, 1}, {0, 2, 3, 5, 4, 1}, {2, 0, 3, 5, 4, 2},
                        {2, 2, 0, 5, 4, 1}, {2, 2, 3, 5, 0, 1}, {2, 2, 0, 0, 4, 0},
                        {3, 1, 4, 1, 3, 1}, {0, 0, 0, 0, 0, 0}, {2, 2, 130, 0, 8, 1}};
  int ran = 0, refused = 0;
  for (kernels::GemmPath path : paths_for<T>()) {
    const GemmPathScope scope(path);
    for (const Case& c : cases)
      for (int kind : {kNone, kCausal, kPadding, kAdditive, kAll})
        for (double p : {0.0, 0.3}) {
          SCOPED_TRACE(::testing::Message() << kernels::gemm_path_name(path) << " B=" << c.B
                                            << " H=" << c.H << " T=" << c.Tq << " S=" << c.S
                                            << " K=" << c.K << " mask=" << kind << " p=" << p);
          Problem<T> pb = make_problem<T>(c.B, c.H, c.Tq, c.S, c.K, c.extra, 17);
          pb.mask = edge_mask<T>(kind, pb.shape);
          pb.dropout = {p, 0xed9eULL};
          if ((kind & kCausal) && c.S < c.Tq) {
            for (bool fast : {false, true}) {
              EXPECT_THROW(run(pb, fast, true, false), ShapeError) << "fast=" << fast;
              EXPECT_THROW(backward_only(pb, fast), ShapeError) << "fast=" << fast;
            }
            ++refused;
            continue;
          }
          const Result<T> naive = run(pb, false, true, true);
          const Result<T> fast = run(pb, true, true, true);
          expect_fast_matches_naive(naive, fast, c.H * c.K, tol);
          expect_empty_shape_contract(pb, naive);
          expect_empty_shape_contract(pb, fast);
          ++ran;
        }
  }
  const int paths = static_cast<int>(paths_for<T>().size());
  // S < T in 3 cases, each refused with the 2 causal masks; x 2 dropout rates.
  EXPECT_EQ(refused, paths * 3 * 2 * 2);
  EXPECT_EQ(ran, paths * (9 * 5 * 2 - 3 * 2 * 2));
}

}  // namespace
}  // namespace attn
