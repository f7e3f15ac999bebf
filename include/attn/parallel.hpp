// Thread control: OpenMP when attn is built with it, serial otherwise. attn splits its matrix
// products over threads itself (kernels/gemm.hpp) and runs every Eigen product serially: Eigen's
// own threaded GEMM busy-waits between its threads, which stalls badly on a shared machine.
// So attn sets Eigen's thread count to 1 (Eigen::setNbThreads, a process-wide setting) on first
// use of a product and in set_num_threads.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "attn/tensor.hpp"

namespace attn {

/// Number of threads attn's parallel loops and Eigen's products use.
inline int num_threads() {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

namespace detail {
/// Makes Eigen's products serial, once per process (see the top of this file).
inline void keep_eigen_serial() {
  static const bool done = (Eigen::setNbThreads(1), true);
  (void)done;
}
}  // namespace detail

/// The most threads set_num_threads takes wherever it runs: libgomp ran out of memory or stack
/// for a count far beyond a machine's cores (INT_MAX, 100,000) and ended the process.
inline constexpr int kMaxThreads = 256;

/// The most threads set_num_threads takes here: kMaxThreads, or more on a machine with more CPUs
/// or started with a larger OMP_NUM_THREADS (so that num_threads() can always be set back).
inline int thread_limit() {
#if defined(_OPENMP)
  static const int initial = omp_get_max_threads();  // before any set_num_threads of attn's
  return std::max({kMaxThreads, omp_get_num_procs(), initial});
#else
  return kMaxThreads;
#endif
}

namespace detail {

/// This machine's physical memory in bytes; 0 if the system does not say.
inline double physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_bytes = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page_bytes > 0 ? static_cast<double>(pages) * static_cast<double>(page_bytes)
                                     : 0.0;
}

/// This process's soft limit on `resource` (RLIMIT_AS, RLIMIT_DATA) in bytes; 0 if there is none.
template <class Resource>
double resource_limit_bytes(Resource resource) {
  rlimit r{};
  return ::getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY
             ? static_cast<double>(r.rlim_cur)
             : 0.0;
}

/// What this process may hold in memory: the machine's physical memory, or less under an
/// address-space or data-segment limit (RLIMIT_AS, RLIMIT_DATA; a container's cgroup limit is
/// not read); 0 if the system does not say.
inline double memory_limit_bytes() {
  double limit = physical_memory_bytes();
  for (const double cur : {resource_limit_bytes(RLIMIT_AS), resource_limit_bytes(RLIMIT_DATA)})
    if (cur > 0) limit = limit > 0 ? std::min(limit, cur) : cur;
  return limit;
}

/// The stack libgomp gives each thread it starts, in bytes, read as libgomp reads it: from
/// OMP_STACKSIZE, else GOMP_STACKSIZE, a decimal number and an optional unit B, K, M or G (K if
/// none), spaces allowed around both. 0 when neither holds such a size (libgomp then keeps its
/// default, after a warning for a value it cannot read). `name` is set to the variable read.
inline double openmp_stack_bytes(const char*& name) {
  for (const char* variable : {"OMP_STACKSIZE", "GOMP_STACKSIZE"}) {
    const char* p = std::getenv(variable);
    if (p == nullptr) continue;
    while (std::isspace(static_cast<unsigned char>(*p))) ++p;
    char* end = nullptr;
    errno = 0;
    const unsigned long long value = std::strtoull(p, &end, 10);
    if (errno != 0 || end == p || *p == '-') continue;
    while (std::isspace(static_cast<unsigned char>(*end))) ++end;
    int shift = 10;
    if (*end != '\0') {
      const int unit = std::tolower(static_cast<unsigned char>(*end++));
      shift = unit == 'b' ? 0 : unit == 'k' ? 10 : unit == 'm' ? 20 : unit == 'g' ? 30 : -1;
      while (std::isspace(static_cast<unsigned char>(*end))) ++end;
      if (shift < 0 || *end != '\0') continue;
    }
    if (((value << shift) >> shift) != value) continue;  // libgomp refuses what overflows
    name = variable;
    return static_cast<double>(value << shift);
  }
  return 0;
}

/// ConfigError if the stacks libgomp would map for the n - 1 threads it starts besides the
/// calling one cannot be had: each larger than this machine's memory, or all together larger
/// than the address-space limit. libgomp ends the process on its own then ("Thread creation
/// failed"), at the first parallel region, past every handler of the program's.
inline void check_thread_stacks(int n) {
  const char* variable = nullptr;
  const double stack = openmp_stack_bytes(variable);
  if (n <= 1 || stack <= 0) return;
  const double memory = physical_memory_bytes(), address_space = resource_limit_bytes(RLIMIT_AS);
  const bool fits =
      (memory <= 0 || stack <= memory) && (address_space <= 0 || stack * (n - 1) <= address_space);
  const double gib = 1024.0 * 1024.0 * 1024.0;
  ATTN_CHECK(fits, ConfigError, variable, "=", std::getenv(variable), " asks for a ", stack / gib,
             " GiB stack for each of the ", n - 1,
             " threads OpenMP starts besides this one: ", "more than this machine's ", memory / gib,
             " GiB of memory or its address-space limit (",
             address_space > 0 ? std::to_string(address_space / gib) + " GiB" : std::string("none"),
             "); lower it, or use 1 thread");
}

}  // namespace detail

/// Sets the thread count of attn's OpenMP loops and products (Eigen's own stays 1); ConfigError
/// unless n is in [1, thread_limit()], or if OMP_STACKSIZE asks for thread stacks this machine
/// cannot give (detail::check_thread_stacks).
inline void set_num_threads(int n) {
  ATTN_CHECK(n >= 1 && n <= thread_limit(), ConfigError, "set_num_threads: n must be in [1, ",
             thread_limit(), "], got ", n);
#if defined(_OPENMP)
  detail::check_thread_stacks(n);
  omp_set_num_threads(n);
#endif
  Eigen::setNbThreads(1);
}

// Below these amounts of work (elements touched) a loop runs on the calling thread: starting a
// parallel region and waking a second thread costs microseconds, more than the loop itself.
// Measured per kernel kind on the project's 2-core machine; kernels/gemm.hpp keeps its own.
/// Cheap elementwise work (a hash and a multiply per element: dropout).
inline constexpr Index kParallelMinElementwise = 32768;
/// Row-wise work with a reduction per row (layer norm, cross-entropy): work = rows * row length.
inline constexpr Index kParallelMinRowwise = 16384;
/// The optimiser's update of one parameter tensor: most tensors (biases, norms) stay serial.
inline constexpr Index kParallelMinOptimizer = 65536;

/// Whether a parallel region opened here would have more than one thread. Callers open none
/// otherwise: libgomp allocates and frees the team of a one-thread region on every entry (an
/// `if (false)` clause included), and nothing may be allocated after a training loop's first step
/// (tests/test_allocation.cpp).
inline bool opens_team() {
#if defined(_OPENMP)
  return omp_get_max_threads() > 1 && !omp_in_parallel();
#else
  return false;
#endif
}

/// Carries an exception out of an OpenMP parallel region, which it may not leave by itself (that
/// calls std::terminate: a std::bad_alloc in a thread's scratch would end the program). Each
/// thread runs its work through run(); the first exception is kept and work not yet started is
/// skipped; after the region, rethrow() throws the kept exception on the calling thread.
class RegionErrors {
 public:
  template <class Work>
  void run(Work&& work) noexcept {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      work();
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::exception_ptr error_;
};

namespace detail {

/// A contiguous run [front, back) of a loop's indices, taken from the front by the thread it was
/// given to and from the back by threads done with their own. Both ends live in one atomic word
/// (32 bits each), so a take is one compare-exchange and no index is taken twice.
class alignas(64) IndexRange {
 public:
  /// Fewer indices than this fit in a range.
  static constexpr Index kLimit = Index(1) << 31;

  void assign(Index front, Index back) {
    word_.store(pack(front, back), std::memory_order_relaxed);
  }
  Index size() const {
    const std::uint64_t w = word_.load(std::memory_order_relaxed);
    return back_of(w) - front_of(w);
  }
  /// Takes up to `count` indices from the front or the back into [begin, end); false when empty.
  /// The indices carry no data, so relaxed order suffices: the region's end publishes the work.
  bool take(Index count, bool from_back, Index& begin, Index& end) {
    std::uint64_t w = word_.load(std::memory_order_relaxed);
    for (;;) {
      const Index f = front_of(w), b = back_of(w);
      if (f >= b) return false;
      const Index c = std::min(count, b - f);
      begin = from_back ? b - c : f;
      end = begin + c;
      const std::uint64_t next = from_back ? pack(f, b - c) : pack(f + c, b);
      if (word_.compare_exchange_weak(w, next, std::memory_order_relaxed)) return true;
    }
  }

 private:
  static std::uint64_t pack(Index front, Index back) {
    return static_cast<std::uint64_t>(front) | (static_cast<std::uint64_t>(back) << 32);
  }
  static Index front_of(std::uint64_t w) { return static_cast<Index>(w & 0xffffffffu); }
  static Index back_of(std::uint64_t w) { return static_cast<Index>(w >> 32); }
  std::atomic<std::uint64_t> word_{0};
};

}  // namespace detail

/// A loop over [0, n) shared by the threads of a region, for compute-bound work that a static
/// split leaves unbalanced: the attention's (batch, head) pairs, whose halves measured up to 25%
/// apart in time (docs/performance.md, "Where the speed comes from"). Thread t starts on the t-th
/// of equal contiguous shares, walking up in blocks of `grain` indices (what a static schedule
/// gives it); done with its share, it takes blocks from the back of the share with the most left.
/// So no thread waits while another has work, and a core taken by another process does not hold up
/// the loop. Each index runs once, on some thread: results cannot depend on which.
class StealingLoop {
 public:
  static constexpr int kMaxThreads = 64;
  /// Indices per take: about kGrainWork elements of work (cost each), at least 8 takes a share.
  static constexpr Index kGrainWork = 16384;

  /// Threads beyond kMaxThreads only steal. ShapeError unless 0 <= n < IndexRange::kLimit.
  StealingLoop(Index n, int threads, Index cost)
      : shares_(std::clamp(threads, 1, kMaxThreads)),
        grain_(std::clamp(kGrainWork / std::max<Index>(cost, 1), Index(1),
                          std::max<Index>(n / (8 * shares_), 1))) {
    ATTN_CHECK(n >= 0 && n < detail::IndexRange::kLimit, ShapeError, "StealingLoop: ", n,
               " indices; at most ", detail::IndexRange::kLimit - 1, " fit");
    for (int t = 0; t < shares_; ++t) share_[t].assign(n * t / shares_, n * (t + 1) / shares_);
  }

  /// Runs body(i) for the indices `thread` takes: its own share, then others' leftovers.
  template <class Body>
  void run(int thread, Body&& body) {
    Index begin = 0, end = 0;
    if (thread < shares_)
      while (share_[thread].take(grain_, false, begin, end))
        for (Index i = begin; i < end; ++i) body(i);
    for (int victim = fullest(); victim >= 0; victim = fullest())
      if (share_[victim].take(grain_, true, begin, end))
        for (Index i = begin; i < end; ++i) body(i);
  }

 private:
  /// The share with the most indices left, -1 when all are empty.
  int fullest() const {
    int best = -1;
    Index most = 0;
    for (int t = 0; t < shares_; ++t)
      if (const Index left = share_[t].size(); left > most) most = left, best = t;
    return best;
  }

  int shares_;
  Index grain_;
  std::array<detail::IndexRange, kMaxThreads> share_;
};

/// body(i) for i in [0, n), split statically over the threads when n * cost (the loop's work in
/// elements) exceeds min_work, on the calling thread otherwise. Each i must be independent of the
/// others and computed by one thread, so results do not depend on the thread count. An exception
/// from body reaches the caller (the other indices may or may not have run).
///
/// The split stays static for these row kernels (elementwise, LayerNorm, loss, Adam): a
/// StealingLoop halved the calling thread's waits at their ends but gave the training step nothing,
/// most likely because they are bound by the memory path both cores share, so while one thread
/// waits the other runs faster (docs/benchmark-history.md: "A schedule that keeps the static
/// halves").
template <class Body>
void parallel_for(Index n, Index cost, Index min_work, Body&& body) {
#if defined(_OPENMP)
  if (n > 1 && n * cost > min_work && opens_team()) {
    RegionErrors errors;
#pragma omp parallel for schedule(static)
    for (Index i = 0; i < n; ++i) errors.run([&] { body(i); });
    errors.rethrow();
    return;
  }
#endif
  for (Index i = 0; i < n; ++i) body(i);
}

/// body(begin, len) over [0, n) cut into chunks of `chunk` elements (the last one shorter), in
/// parallel as parallel_for decides with cost `chunk` per chunk. The cut depends on n and chunk
/// only, so elementwise work gives the same bits on any number of threads.
template <class Body>
void parallel_for_chunks(Index n, Index chunk, Index min_work, Body&& body) {
  const Index chunks = (n + chunk - 1) / chunk;
  parallel_for(chunks, chunk, min_work, [&](Index c) {
    const Index begin = c * chunk;
    body(begin, std::min(chunk, n - begin));
  });
}

/// p[0, n) = 0, in parallel chunks when n exceeds kParallelMinOptimizer.
template <class T>
void parallel_zero(T* p, Index n) {
  parallel_for_chunks(n, 16384, kParallelMinOptimizer,
                      [&](Index begin, Index len) { std::fill(p + begin, p + begin + len, T(0)); });
}

}  // namespace attn
