// Makes the k-th call of operator new from now throw std::bad_alloc, to reach the error paths that
// only a failed allocation takes, and counts this process's open descriptors: together, whether a
// reader or writer of files that an allocation interrupts leaves a descriptor open.
//
// Replaces the global operator new and delete for the test executable that includes it, so it
// must be included by one source file of that executable only. Under ASan or TSan the sanitizer
// owns operator new, nothing is replaced, and kFailingNew is false: the tests that use it skip.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <new>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ATTN_FAILING_NEW 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ATTN_FAILING_NEW 0
#endif
#endif
#if !defined(ATTN_FAILING_NEW)
#define ATTN_FAILING_NEW 1
#endif

namespace attn::testing {

inline constexpr bool kFailingNew = ATTN_FAILING_NEW != 0;

namespace detail {
/// Calls of operator new left before one fails; negative: none fails.
inline std::atomic<long> news_before_failure{-1};
}  // namespace detail

/// How many descriptors this process holds open.
inline std::ptrdiff_t open_descriptors() {
  namespace fs = std::filesystem;
  return std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator());
}

/// Runs fn() with its k-th allocation failing, for k = 0, 1, ... until a run allocates fewer
/// than k + 1 times (so that nothing fails), and calls after_run(k) after each, with the allocator
/// whole again. Whatever fn throws is swallowed: a std::bad_alloc, or the error fn made of it.
/// Returns how many runs met the failure.
template <class Fn, class AfterRun>
long for_each_failing_allocation(Fn fn, AfterRun after_run) {
  for (long k = 0;; ++k) {
    detail::news_before_failure = k;
    try {
      fn();
    } catch (...) {
    }
    const bool failed = detail::news_before_failure < 0;  // the k-th allocation was reached
    detail::news_before_failure = -1;
    after_run(k);
    if (!failed) return k;
  }
}

}  // namespace attn::testing

#if ATTN_FAILING_NEW
void* operator new(std::size_t n) {
  auto& left = attn::testing::detail::news_before_failure;
  if (left.load() >= 0 && left.fetch_sub(1) == 0) throw std::bad_alloc();
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// Out of line: inlined into a caller that got its block from operator new, free() draws GCC's
// -Wmismatched-new-delete, which cannot see that this operator new is malloc.
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif
