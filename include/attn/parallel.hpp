// Thread control: OpenMP when attn is built with it, serial otherwise. Eigen's GEMM runs on
// OpenMP too (and goes serial by itself inside an OpenMP parallel region).
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

/// Sets the thread count for attn's OpenMP loops and Eigen's products (n >= 1).
inline void set_num_threads(int n) {
  if (n < 1) n = 1;
#if defined(_OPENMP)
  omp_set_num_threads(n);
#endif
  Eigen::setNbThreads(n);
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
