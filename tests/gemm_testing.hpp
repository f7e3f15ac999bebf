// Shared by the tests of kernels::gemm (test_gemm.cpp) and of attn's packed kernels themselves
// (test_gemm_packed.cpp, test_gemm_depth.cpp, test_gemm_kept_b.cpp): random operands, the product
// by its definition, the Gemm fixture, which restores the thread count and the automatic path
// after each test, and the OwnGemm fixture of the typed tests over attn's two kernels.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/kernels/gemm.hpp"
#include "attn/kernels/gemm_naive.hpp"
#include "attn/random.hpp"

namespace attn::testing {

template <class T>
RowMatrix<T> random_matrix(Index rows, Index cols, std::uint64_t seed) {
  RowMatrix<T> m(rows, cols);
  Rng rng(seed);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(rng.uniform() * 2 - 1);
  return m;
}

// c = a b (+ start) by the definition, summed in long double.
template <class A, class B>
RowMatrix<double> reference_product(const A& a, const B& b, const float* bias = nullptr,
                                    bool relu = false) {
  RowMatrix<long double> c = RowMatrix<long double>::Zero(a.rows(), b.cols());
  kernels::gemm_naive<long double>(c, a.template cast<long double>(),
                                   b.template cast<long double>(), false);
  for (Index i = 0; i < c.rows(); ++i)
    for (Index j = 0; j < c.cols(); ++j) {
      if (bias != nullptr) c(i, j) += bias[j];
      if (relu) c(i, j) = std::max<long double>(c(i, j), 0);
    }
  return c.cast<double>();
}

// m's elements at every other column of a matrix twice as wide (the others NaN, which a read of
// them would spread): a view of it with column stride 2 is m with neither stride 1.
inline RowMatrix<float> spread_columns(const RowMatrix<float>& m) {
  RowMatrix<float> wide =
      RowMatrix<float>::Constant(m.rows(), 2 * m.cols(), std::numeric_limits<float>::quiet_NaN());
  for (Index i = 0; i < m.rows(); ++i)
    for (Index k = 0; k < m.cols(); ++k) wide(i, 2 * k) = m(i, k);
  return wide;
}

// The paths this machine can run: Eigen always, each of attn's kernels where the CPU has it.
inline std::vector<kernels::GemmPath> available_paths() {
  std::vector<kernels::GemmPath> paths;
  for (auto p : {kernels::GemmPath::eigen, kernels::GemmPath::avx512, kernels::GemmPath::avx2})
    if (kernels::gemm_path_available(p)) paths.push_back(p);
  return paths;
}

inline const char* name_of(kernels::GemmPath p) { return kernels::gemm_path_name(p); }

class Gemm : public ::testing::Test {
 protected:
  void TearDown() override {
    set_num_threads(1);
    kernels::set_gemm_path(kernels::GemmPath::automatic);
  }
};

#if defined(ATTN_HAVE_AVX512_GEMM)
// The typed tests of attn's own GEMM (test_gemm_packed.cpp, test_gemm_depth.cpp,
// test_gemm_kept_b.cpp) run once per kernel (OwnGemm/avx512, OwnGemm/avx2), each skipped where the
// CPU cannot run it.
template <class Isa>
bool cpu_runs() {
  return std::is_same_v<Isa, kernels::detail::Avx512Isa> ? kernels::detail::cpu_has_avx512()
                                                         : kernels::detail::cpu_has_avx2_fma();
}
// The path whose products run kernel Isa (for kernels::set_gemm_path; the Gemm fixture restores
// the automatic path after the test).
template <class Isa>
kernels::GemmPath path_of() {
  return std::is_same_v<Isa, kernels::detail::Avx512Isa> ? kernels::GemmPath::avx512
                                                         : kernels::GemmPath::avx2;
}
template <class Isa>
class OwnGemm : public Gemm {
 protected:
  void SetUp() override {
    if (!cpu_runs<Isa>()) GTEST_SKIP() << "this CPU cannot run the " << Isa::kName << " kernel";
  }
};
struct KernelName {
  template <class Isa>
  static std::string GetName(int) {
    return Isa::kName;
  }
};
using OwnKernels = ::testing::Types<kernels::detail::Avx512Isa, kernels::detail::Avx2Isa>;
#endif  // ATTN_HAVE_AVX512_GEMM

}  // namespace attn::testing
