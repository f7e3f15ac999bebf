// Thread control: OpenMP when attn is built with it, serial otherwise. attn splits its matrix
// products over threads itself (kernels/gemm.hpp) and runs every Eigen product serially: Eigen's
// own threaded GEMM busy-waits between its threads, which stalls badly on a shared machine.
// So attn sets Eigen's thread count to 1 (Eigen::setNbThreads, a process-wide setting) on first
// use of a product and in set_num_threads.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
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

/// Sets the thread count of attn's OpenMP loops and products (n >= 1; Eigen's own stays 1).
inline void set_num_threads(int n) {
  if (n < 1) n = 1;
#if defined(_OPENMP)
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

/// body(i) for i in [0, n), split statically over the threads when n * cost (the loop's work in
/// elements) exceeds min_work, on the calling thread otherwise. Each i must be independent of the
/// others and computed by one thread, so results do not depend on the thread count. An exception
/// from body reaches the caller (the other indices may or may not have run).
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
