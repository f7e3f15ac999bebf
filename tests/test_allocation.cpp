// "Nothing is allocated after the first step": a training step (zero_grad, forward, label-smoothed
// loss, backward, Adam) of a model in training mode (dropout on) calls no allocator once the
// buffers of the first steps exist, on 1 and on 2 threads, and neither does a batch of another
// shape (fewer rows, longer targets) once the shapes have been seen: buffers only grow. Nor does
// a step of incremental decoding after the first.
//
// And a product that an allocation failure interrupts leaves the GEMM's caches of packed operands
// sound.
//
// This test binary counts every call of the C allocator (malloc, calloc, realloc, aligned_alloc,
// posix_memalign, memalign), and can make calls fail: operator new, std::vector and attn's
// aligned Tensor storage all end there. The counting replaces the C library's functions for this
// executable only.
#include <malloc.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <new>

#include "gemm_testing.hpp"
#include "pch.hpp"

// Under ASan or TSan the sanitizer owns the allocator (replacing it here would hand it blocks it
// never made), and outside glibc there is no __libc_malloc to forward to: the tests skip there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ATTN_COUNTS_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ATTN_COUNTS_ALLOCATIONS 0
#endif
#endif
#if !defined(ATTN_COUNTS_ALLOCATIONS)
#if defined(__GLIBC__)
#define ATTN_COUNTS_ALLOCATIONS 1
#else
#define ATTN_COUNTS_ALLOCATIONS 0
#endif
#endif

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
// While failing, the allocator grants `grants_left` more calls and then fails every call.
std::atomic<bool> failing{false};
std::atomic<long> grants_left{0};
/// Counts the call; false when it is to fail.
[[maybe_unused]] inline bool count() {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  return !failing.load(std::memory_order_relaxed) ||
         grants_left.fetch_sub(1, std::memory_order_relaxed) > 0;
}
}  // namespace

#if ATTN_COUNTS_ALLOCATIONS
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);

void* malloc(size_t n) { return count() ? __libc_malloc(n) : nullptr; }
void* calloc(size_t n, size_t size) { return count() ? __libc_calloc(n, size) : nullptr; }
void* realloc(void* p, size_t n) { return count() ? __libc_realloc(p, n) : nullptr; }
void* memalign(size_t alignment, size_t n) {
  return count() ? __libc_memalign(alignment, n) : nullptr;
}
void* aligned_alloc(size_t alignment, size_t n) {
  return count() ? __libc_memalign(alignment, n) : nullptr;
}
int posix_memalign(void** out, size_t alignment, size_t n) {
  void* p = count() ? __libc_memalign(alignment, n) : nullptr;
  if (p == nullptr && n != 0) return ENOMEM;
  *out = p;
  return 0;
}
}
#endif

namespace attn {
namespace {

/// The allocator calls `fn` makes.
template <class Fn>
long allocations_in(Fn&& fn) {
  allocations = 0;
  counting = true;
  fn();
  counting = false;
  return allocations.load();
}

/// d_model 128, 2 + 2 layers, every dropout at 0.1: large enough that products, attention and
/// the row kernels split over threads, small enough to take milliseconds.
TransformerConfig config_with_dropout() {
  TransformerConfig c = TransformerConfig::small(100);  // d_model 256, d_ff 1024, 3 + 3 layers
  c.d_model = 128;
  c.d_ff = 256;
  c.encoder_layers = c.decoder_layers = 2;
  c.dropout = 0.1;
  c.attention_dropout = 0.1;
  c.relu_dropout = 0.1;
  return c;
}

struct TrainingStep {
  TransformerConfig config = config_with_dropout();
  Transformer<float> model{config};
  Adam<float> adam{model.parameters()};
  LabelSmoothedCrossEntropy<float> loss{0.1, config.pad_id};
  Index step = 0;

  TrainingStep() { model.train(); }
  /// One update on a batch of [B, S] sources and [B, T] targets with some padding, through
  /// forward() or (`scored`) forward_scored().
  void run(const Tensor<TokenId>& src, const Tensor<TokenId>& tgt_in,
           const Tensor<TokenId>& tgt_out, bool scored = false) {
    ++step;
    adam.zero_grad();
    if (scored)
      loss.forward_backward(model.forward_scored(src, tgt_in, tgt_out), model.scored_targets(),
                            1.0 / 16, step);
    else
      loss.forward_backward(model.forward(src, tgt_in), tgt_out, 1.0 / 16, step);
    model.backward(loss.dlogits());
    adam.step(noam_lr(step, config.d_model, 10, 0.5));
  }
};

/// A batch of `rows` sentences of `len` tokens (the last row shorter: padding).
Tensor<TokenId> batch(Index rows, Index len, TokenId first) {
  Tensor<TokenId> t({rows, len});
  for (Index b = 0; b < rows; ++b)
    for (Index i = 0; i < len; ++i)
      t(b, i) =
          b == rows - 1 && i >= len - 2 ? 0 : static_cast<TokenId>(4 + (first + 7 * b + i) % 90);
  return t;
}

#define SKIP_UNLESS_COUNTING() \
  if (!ATTN_COUNTS_ALLOCATIONS) GTEST_SKIP() << "allocations are not counted in this build"

// The portable fallback's products are Eigen's, and Eigen's GEMM takes its packing blocks from the
// heap in every product whose blocks pass EIGEN_STACK_ALLOCATION_LIMIT (128 KiB): a training step
// there allocates (68 and 157 calls per step in this test on 1 and 2 threads, 2 per decoding step).
// The claim holds on attn's own GEMM, the path every CPU with AVX-512 takes; zero_grad needs no
// product and is checked on both.
#define SKIP_ON_THE_EIGEN_GEMM()                        \
  if (kernels::gemm_path() == kernels::GemmPath::eigen) \
  GTEST_SKIP() << "Eigen's GEMM allocates its packing blocks in every large product"

TEST(Allocation, ATrainingStepAllocatesNothingAfterTheFirstSteps) {
  SKIP_UNLESS_COUNTING();
  SKIP_ON_THE_EIGEN_GEMM();
  for (int threads : {1, 2})
    for (bool scored : {false, true}) {
      set_num_threads(threads);
      TrainingStep s;
      const auto src = batch(32, 24, 1), tgt_in = batch(32, 20, 2), tgt_out = batch(32, 20, 3);
      for (int i = 0; i < 2; ++i) s.run(src, tgt_in, tgt_out, scored);
      for (int i = 0; i < 2; ++i)
        EXPECT_EQ(allocations_in([&] { s.run(src, tgt_in, tgt_out, scored); }), 0)
            << threads << " threads, scored " << scored;
    }
}

TEST(Allocation, BatchesOfShapesSeenBeforeAllocateNothing) {
  SKIP_UNLESS_COUNTING();
  SKIP_ON_THE_EIGEN_GEMM();
  set_num_threads(2);
  TrainingStep s;
  const auto src = batch(32, 24, 1), tgt_in = batch(32, 20, 2), tgt_out = batch(32, 20, 3);
  const auto src2 = batch(12, 17, 4), tgt_in2 = batch(12, 29, 5), tgt_out2 = batch(12, 29, 6);
  // Short sentences: attention blocks of 8 to 15 rows (register tiles, or the packed order).
  const auto src3 = batch(40, 12, 7), tgt_in3 = batch(40, 10, 8), tgt_out3 = batch(40, 10, 9);
  for (bool scored : {false, true}) {
    for (int i = 0; i < 2; ++i) {
      s.run(src, tgt_in, tgt_out, scored);
      s.run(src2, tgt_in2, tgt_out2, scored);
      s.run(src3, tgt_in3, tgt_out3, scored);
    }
    EXPECT_EQ(allocations_in([&] { s.run(src2, tgt_in2, tgt_out2, scored); }), 0) << scored;
    EXPECT_EQ(allocations_in([&] { s.run(src3, tgt_in3, tgt_out3, scored); }), 0) << scored;
    EXPECT_EQ(allocations_in([&] { s.run(src, tgt_in, tgt_out, scored); }), 0) << scored;
  }
}

TEST(Allocation, ModuleZeroGradAllocatesNothingAndZeroesEveryGradient) {
  SKIP_UNLESS_COUNTING();
  set_num_threads(2);
  TrainingStep s;
  const auto src = batch(32, 24, 1), tgt_in = batch(32, 20, 2), tgt_out = batch(32, 20, 3);
  s.run(src, tgt_in, tgt_out);
  const Tensor<float>& logits = s.model.forward(src, tgt_in);
  s.loss.forward_backward(logits, tgt_out, 1.0, s.step);
  s.model.backward(s.loss.dlogits());
  EXPECT_EQ(allocations_in([&] { s.model.zero_grad(); }), 0);
  for (const auto& p : s.model.parameters())
    for (float g : p.grad) ASSERT_EQ(g, 0.0f) << p.name;
}

// Incremental decoding (greedy and beam search run it): every step after a decoding's first
// writes into the cache and buffers the first one sized.
TEST(Allocation, DecodeStepsAfterTheFirstAllocateNothing) {
  SKIP_UNLESS_COUNTING();
  SKIP_ON_THE_EIGEN_GEMM();
  set_num_threads(2);
  TrainingStep s;
  s.model.eval();
  const auto src = batch(8, 24, 1);
  const Tensor<float>& memory = s.model.encode(src);
  DecoderCache<float> cache = s.model.make_decoder_cache(8, 30);
  Tensor<TokenId> tokens = Tensor<TokenId>::full({8, 1}, 2);
  s.model.decode_step(tokens, 0, memory, cache);
  for (Index t = 1; t < 10; ++t) {
    tokens(t % 8, 0) = static_cast<TokenId>(4 + t);
    EXPECT_EQ(allocations_in([&] { s.model.decode_step(tokens, t, memory, cache); }), 0)
        << "step " << t;
  }
}

/// Runs `fn` with `grants` allocator calls granted and every later one failing; whether it threw
/// std::bad_alloc.
template <class Fn>
bool fails_after(long grants, Fn&& fn) {
  struct Failing {  // until the end of this call, whatever fn throws
    explicit Failing(long grants) {
      grants_left = grants;
      failing = true;
    }
    ~Failing() { failing = false; }
  } scope(grants);
  try {
    fn();
  } catch (const std::bad_alloc&) {
    return true;
  }
  return false;
}

// A product that fails between finding its kept copy of B and the end of its packing leaves the
// copy to be packed again, never an unwritten copy marked as packed: after an allocation failure
// at each point of a product that writes the copy (a weight's second use in a ConstantWeightsScope,
// its A packed once into a buffer that must grow; or an operand new to a ReusedBScope), the next
// products give the bits of the product without a cache. A [M, 512] with contiguous columns
// (dy^T) against B [512, 3200] is packed once with B (packs_a_once: four column blocks); the
// scope's copies hold narrower operands first, so that the new one's copy has to grow.
TEST(Allocation, AProductThatFailsLeavesNoKeptCopyMarkedPacked) {
  SKIP_UNLESS_COUNTING();
  SKIP_ON_THE_EIGEN_GEMM();
  set_num_threads(1);
  const Index K = 512, N = 3200;
  const auto xt = testing::random_matrix<float>(K, 1000, 31);  // A = xt^T: columns contiguous
  const auto w = testing::random_matrix<float>(N, K, 32);
  const auto a = [&](Index rows) { return xt.leftCols(rows).transpose(); };
  RowMatrix<float> plain(32, N);
  kernels::gemm(plain, a(32), w.transpose(), false);
  auto& weights = kernels::detail::weight_cache();
  int failures_with_a_copy = 0;
  for (long grants = 0; grants < 10; ++grants) {
    const Index rows = 64 + 96 * (grants + 1);  // larger each time: A's buffer grows
    RowMatrix<float> c(rows, N), after(32, N);
    kernels::ConstantWeightsScope scope;
    kernels::gemm(after, a(32), w.transpose(), false, {}, /*constant_b=*/true);  // first use
    const bool threw = fails_after(grants, [&] {
      kernels::gemm(c, a(rows), w.transpose(), false, {}, true);  // packs the copy
    });
    failures_with_a_copy += threw && weights.entries.at(0).packed != nullptr;
    for (int use = 0; use < 2; ++use) {
      kernels::gemm(after, a(32), w.transpose(), false, {}, true);
      EXPECT_TRUE((after.array() == plain.array()).all()) << grants << " grants, use " << use;
    }
    if (!threw) break;
  }
  EXPECT_GE(failures_with_a_copy, 1) << "no failure came after the copy's allocation";
  kernels::detail::ReusedBScope scope;
  const auto v = testing::random_matrix<float>(K, 200, 33);
  RowMatrix<float> alone(32, 200), kept(32, 200);
  kernels::detail::gemm_packed_order(alone, a(32), v, false);
  for (Index cols : {16, 32, 48}) {  // every copy holds a narrower operand: v's must grow one
    RowMatrix<float> narrow(32, cols);
    kernels::detail::gemm_packed_order(narrow, a(32), v.leftCols(cols), false, true);
  }
  for (long grants = 0; grants < 10; ++grants) {
    RowMatrix<float> c(64 + 96 * (grants + 1), 200);
    const bool threw = fails_after(grants, [&] {
      kernels::detail::gemm_packed_order(c, a(c.rows()), v, false, /*reuse_b=*/true);
    });
    kernels::detail::gemm_packed_order(kept, a(32), v, false, true);
    EXPECT_TRUE((kept.array() == alone.array()).all()) << grants << " grants";
    if (!threw) break;
  }
}

/// The counter itself counts: without this the zeros above could mean nothing.
TEST(Allocation, TheCounterSeesOperatorNewAndTensors) {
  SKIP_UNLESS_COUNTING();
  EXPECT_GE(allocations_in([] { ::operator delete(::operator new(16)); }), 1);
  EXPECT_GE(allocations_in([] { Tensor<float> t({64, 64}); }), 1);
}

}  // namespace
}  // namespace attn
