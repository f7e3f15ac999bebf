// Thread control: OpenMP when attn is built with it, serial otherwise. attn splits its matrix
// products over threads itself (kernels/gemm.hpp) and runs every Eigen product serially: Eigen's
// own threaded GEMM busy-waits between its threads, which stalls badly on a shared machine.
// So attn sets Eigen's thread count to 1 (Eigen::setNbThreads, a process-wide setting) on first
// use of a product and in set_num_threads.
#pragma once

#include <Eigen/Core>

#if defined(_OPENMP)
#include <omp.h>
#endif

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

/// The index of the calling thread inside a parallel region (0 outside one).
inline int thread_index() {
#if defined(_OPENMP)
  return omp_get_thread_num();
#else
  return 0;
#endif
}

}  // namespace attn
