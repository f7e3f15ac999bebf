// attn's OpenMP parallel regions. Exceptions: one may not leave a region by itself
// (std::terminate), so RegionErrors carries it to the caller; each test makes it happen on a worker
// thread, where the old code ended the program. Schedules: StealingLoop runs every index once,
// a thread's own share first, and a thread held up does not hold up the loop.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "address_space_limit.hpp"
#include "error_helpers.hpp"
#include "pch.hpp"
#include "sanitizers.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace {

using attn::testing::AddressSpaceLimit;
using attn::testing::kSanitized;

/// The thread number inside a parallel region (0 without OpenMP).
int thread_number() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

TEST(RegionErrors, ExceptionOfAWorkerThreadReachesTheCaller) {
  attn::set_num_threads(2);
  constexpr attn::Index n = 64;
  std::atomic<int> thrower{-1};
  const auto run = [&] {
    attn::parallel_for(n, 1 << 20, 0, [&](attn::Index i) {
      if (i == n - 1) {  // the last index: the second thread's under a static schedule
        thrower = thread_number();
        throw attn::ShapeError("index " + std::to_string(i) + " is refused");
      }
    });
  };
  EXPECT_EQ(attn::testing::error_of<attn::ShapeError>(run), "index 63 is refused");
#if defined(_OPENMP)
  EXPECT_EQ(thrower.load(), 1) << "the body was meant to throw on the worker thread";
#endif
  // The team is still usable afterwards.
  std::vector<int> seen(n, 0);
  attn::parallel_for(n, 1 << 20, 0, [&](attn::Index i) { seen[static_cast<std::size_t>(i)] = 1; });
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n);
}

TEST(RegionErrors, OnlyTheFirstExceptionIsKept) {
  attn::set_num_threads(2);
  EXPECT_THROW(attn::parallel_for(
                   8, 1 << 20, 0,
                   [](attn::Index i) { throw attn::ConfigError("index " + std::to_string(i)); }),
               attn::ConfigError);
}

// Attention keeps a [128, S] scratch per thread, grown inside the parallel region. With S = 2^18
// each thread's is 128 MiB; under a 32 MiB headroom that is a std::bad_alloc for the caller.
TEST(RegionErrors, AttentionScratchBeyondMemoryIsBadAlloc) {
  if (kSanitized) GTEST_SKIP() << "address-space limits do not work under ASan or TSan";
  attn::set_num_threads(2);
  const attn::Index H = 2, T = 128, S = attn::Index(1) << 18, K = 1;
  const attn::kernels::AttentionShape shape{1, H, T, S, K};
  std::vector<float> q(static_cast<std::size_t>(T * H * K), 0.5f);
  std::vector<float> kv(static_cast<std::size_t>(S * H * K), 0.25f);
  std::vector<float> out(q.size()), lse(static_cast<std::size_t>(H * T));
  const attn::AttentionMask<float> none;
  const auto run = [&] {
    attn::kernels::attention_forward<float>(out.data(), H * K, lse.data(), nullptr,
                                            {q.data(), H * K, kv.data(), H * K, kv.data(), H * K},
                                            shape, none, 1.0f);
  };
  attn::parallel_for(2, 1 << 20, 0, [](attn::Index) {});  // the team exists before the limit
  {
    const AddressSpaceLimit limit(32u << 20);
    ASSERT_TRUE(limit.ok());
    EXPECT_THROW(run(), std::bad_alloc);
  }
  run();  // with memory again, the same call succeeds
  EXPECT_NEAR(out[0], 0.25f, 1e-6f);
}

/// The indices one thread takes from a StealingLoop, in order, when it runs alone.
std::vector<attn::Index> taken_alone(attn::StealingLoop& loop, int thread) {
  std::vector<attn::Index> order;
  loop.run(thread, [&](attn::Index i) { order.push_back(i); });
  return order;
}

TEST(StealingLoop, AThreadTakesItsOwnShareUpThenTheOthersFromTheBack) {
  attn::StealingLoop one_at_a_time(10, 2, attn::Index(1) << 30);  // grain 1
  EXPECT_EQ(taken_alone(one_at_a_time, 0),
            (std::vector<attn::Index>{0, 1, 2, 3, 4, 9, 8, 7, 6, 5}));
  EXPECT_TRUE(taken_alone(one_at_a_time, 1).empty()) << "nothing is left for thread 1";

  // Cost 1: grain = 100 / (2 shares x 8 takes) = 6 indices a take, ascending inside a block.
  attn::StealingLoop blocks(100, 2, 1);
  std::vector<attn::Index> expected;
  for (attn::Index i = 50; i < 100; ++i) expected.push_back(i);  // thread 1's own share
  for (attn::Index back = 50; back > 0; back -= 6)               // thread 0's, from the back
    for (attn::Index i = std::max<attn::Index>(back - 6, 0); i < back; ++i) expected.push_back(i);
  EXPECT_EQ(taken_alone(blocks, 1), expected);
}

TEST(StealingLoop, EveryIndexRunsExactlyOnceOnAnyTeam) {
  for (const int threads : {1, 2, 3, 4, 65})
    for (const attn::Index n : {0, 1, 2, 3, 7, 64, 1000, 4097})
      for (const attn::Index cost : {attn::Index(1), attn::Index(1) << 30}) {
        std::vector<std::atomic<int>> runs(static_cast<std::size_t>(n));
        attn::StealingLoop loop(n, threads, cost);
#if defined(_OPENMP)
#pragma omp parallel num_threads(std::min(threads, 4))
        loop.run(omp_get_thread_num(), [&](attn::Index i) { ++runs[static_cast<std::size_t>(i)]; });
#else
        for (int t = 0; t < threads; ++t)
          loop.run(t, [&](attn::Index i) { ++runs[static_cast<std::size_t>(i)]; });
#endif
        for (attn::Index i = 0; i < n; ++i) {
          ASSERT_EQ(runs[static_cast<std::size_t>(i)].load(), 1)
              << "index " << i << " of " << n << ", " << threads << " shares, cost " << cost;
        }
      }
}

// Thread 1 stops on its first index until thread 0 has run every other one: thread 0 must take
// them from thread 1's share (under a static split it would stop after its own half, and thread 1
// would wait for it forever; the wait gives up after 60 s so that the failure is a failure).
TEST(StealingLoop, AThreadHeldUpDoesNotHoldUpTheLoop) {
#if defined(_OPENMP)
  constexpr attn::Index n = 64;
  std::atomic<attn::Index> by_first{0};
  attn::StealingLoop loop(n, 2, attn::Index(1) << 30);
#pragma omp parallel num_threads(2)
  {
    const int thread = omp_get_thread_num();
    bool waited = false;
    loop.run(thread, [&](attn::Index) {
      if (thread == 0) return void(++by_first);
      if (waited) return;
      waited = true;
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (by_first.load() < n - 1 && std::chrono::steady_clock::now() < give_up)
        std::this_thread::yield();
    });
    // n when thread 0 took thread 1's whole share before thread 1 started (or alone in the team).
    if (thread == 0) {
      EXPECT_GE(by_first.load(), n - 1);
    }
  }
#else
  GTEST_SKIP() << "built without OpenMP";
#endif
}

TEST(StealingLoop, TooManyIndicesAreAShapeError) {
  EXPECT_THROW(attn::StealingLoop(attn::Index(1) << 31, 2, 1), attn::ShapeError);
  EXPECT_THROW(attn::StealingLoop(-1, 2, 1), attn::ShapeError);
}

}  // namespace
