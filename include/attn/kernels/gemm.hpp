// Matrix products: c (=, or +=) a b, the one entry point every Linear, projection and gradient
// runs through. Three paths, chosen per product:
//   - attn's own GEMM (detail/gemm_slices.hpp), for float operands laid out in memory: its
//     AVX-512 kernel on a CPU that has AVX-512, else its AVX2 kernel on a CPU with AVX2 and FMA
//     (checked at run time, so no -march flag is needed). Both give the same bits;
//   - Eigen's GEMM, split over threads by rows (the portable fallback, and the path for double,
//     for evaluated expressions and where the CPU has neither).
// ATTN_GEMM=eigen (or avx2) in the environment, or set_gemm_path, forces a path.
//
// Why not Eigen's own threaded GEMM: its threads share packed blocks and wait for each other in
// busy loops, so on a shared machine a descheduled thread stalls the other for a whole time slice
// (measured: a 2-thread training step 10-50x slower than 1 thread under load). Both paths here
// hand out blocks of rows dynamically and wait only at the end of the product (and, in the
// AVX-512 path, once after the threads have packed B together).
//
// Letters: C [M, N] = A [M, K] B [K, N], as BLAS names them, so K here is the depth of the
// product, not tensor.hpp's d_k.
//
// Determinism: on either path every element of C is summed in an order that does not depend on
// the thread count, so results are bitwise equal on 1 and N threads (tests/test_gemm.cpp). The
// two paths differ from each other by rounding.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "attn/kernels/detail/gemm_operand.hpp"
#include "attn/kernels/detail/gemm_slices.hpp"
#include "attn/kernels/detail/gemm_small.hpp"
#include "attn/kernels/dropout.hpp"
#include "attn/kernels/epilogue.hpp"
#include "attn/parallel.hpp"
#include "attn/tensor.hpp"

namespace attn::kernels {

/// Row blocks of the Eigen path are multiples of this many rows: 3 panels of the widest SIMD
/// packet (16 floats), the row panel of Eigen's kernel.
inline constexpr Index kGemmRowGrain = 48;

/// Up to this many blocks of rows per thread on the Eigen path, so that work can be rebalanced; but
/// a block has at least kGemmMinBlockGrains grains, since each block packs the whole right-hand
/// side again and the packing is paid back over the block's rows.
inline constexpr Index kGemmBlocksPerThread = 4;
inline constexpr Index kGemmMinBlockGrains = 4;

/// Below this many multiply-adds a product runs on the calling thread.
inline constexpr double kGemmParallelMinWork = 1 << 20;

/// Products with fewer rows than this are not packed (packing all of B for a few rows, as in
/// decoding one token per sentence, costs more than it saves): they stream B directly
/// (detail/gemm_small.hpp, with AVX-512 or AVX2). Except attention's block products of 8 rows or
/// more (detail::gemm_packed_order), whose register tiles give the packed kernel's bits.
inline constexpr Index kGemmPackedMinRows = 16;

/// Such few-row products are memory-bound: they split over threads from this many multiply-adds
/// (batch-1 greedy decoding of `base` on AVX2 ran its d_model x d_model products, a third of its
/// weights, on one thread while the threshold was kGemmParallelMinWork).
inline constexpr double kGemmSmallParallelMinWork = 1 << 18;

/// Which implementation float products use.
enum class GemmPath { automatic, avx512, avx2, eigen };

namespace detail {
inline std::atomic<GemmPath>& gemm_path_setting() {
  static std::atomic<GemmPath> path{GemmPath::automatic};
  return path;
}
/// ATTN_GEMM in the environment, read once: unset or empty (automatic), eigen, avx2 or avx512;
/// ConfigError for any other value, or a kernel this CPU or build cannot run.
inline GemmPath gemm_path_from_env() {
  static const GemmPath path = [] {
    const char* v = std::getenv("ATTN_GEMM");
    if (v == nullptr || *v == '\0') return GemmPath::automatic;
    if (std::strcmp(v, "eigen") == 0) return GemmPath::eigen;
    const bool avx2 = std::strcmp(v, "avx2") == 0, avx512 = std::strcmp(v, "avx512") == 0;
    ATTN_CHECK(avx2 || avx512, ConfigError,
               "ATTN_GEMM: expected eigen, avx2, avx512 or nothing (automatic), got '", v, "'");
    bool runs = false;
#if defined(ATTN_HAVE_AVX512_GEMM)
    runs = avx2 ? cpu_has_avx2_fma() : cpu_has_avx512();
#endif
    ATTN_CHECK(runs, ConfigError, "ATTN_GEMM=", v, ": this CPU or build has no ", v, " kernel");
    return avx2 ? GemmPath::avx2 : GemmPath::avx512;
  }();
  return path;
}
}  // namespace detail

/// Whether this CPU and build can run `path`'s kernels (automatic and eigen: always).
inline bool gemm_path_available(GemmPath path) {
#if defined(ATTN_HAVE_AVX512_GEMM)
  if (path == GemmPath::avx512) return detail::cpu_has_avx512();
  if (path == GemmPath::avx2) return detail::cpu_has_avx2_fma();
#else
  if (path == GemmPath::avx512 || path == GemmPath::avx2) return false;
#endif
  return true;
}

/// The name of a path: "automatic", "avx512", "avx2" or "eigen".
inline const char* gemm_path_name(GemmPath path) {
  switch (path) {
    case GemmPath::avx512:
      return "avx512";
    case GemmPath::avx2:
      return "avx2";
    case GemmPath::eigen:
      return "eigen";
    default:
      return "automatic";
  }
}

/// Forces a path for float products (automatic: AVX-512 when the CPU has it, else AVX2 when it
/// has AVX2 and FMA, else Eigen; ATTN_GEMM=eigen, avx2 or avx512 changes the automatic choice).
/// Throws ConfigError for a kernel this CPU or build cannot run.
inline void set_gemm_path(GemmPath path) {
  ATTN_CHECK(gemm_path_available(path), ConfigError, "set_gemm_path: the ", gemm_path_name(path),
             " GEMM was asked for, but this CPU or build cannot run it");
  detail::gemm_path_setting() = path;
}

/// The path float products take now: avx512, avx2 or eigen.
inline GemmPath gemm_path() {
  GemmPath path = detail::gemm_path_setting().load();
  if (path == GemmPath::automatic) path = detail::gemm_path_from_env();
  if (path != GemmPath::automatic) return path;
  if (gemm_path_available(GemmPath::avx512)) return GemmPath::avx512;
  return gemm_path_available(GemmPath::avx2) ? GemmPath::avx2 : GemmPath::eigen;
}

namespace detail {

/// The Eigen path: blocks of kGemmRowGrain-multiple rows, each a serial Eigen GEMM.
template <class Dst, class Lhs, class Rhs>
void gemm_eigen(Dst& c, const Lhs& a, const Rhs& b, bool accumulate) {
  attn::detail::keep_eigen_serial();
  const Index M = c.rows();
  const double work =
      static_cast<double>(M) * static_cast<double>(c.cols()) * static_cast<double>(a.cols());
  int threads = 1;
#if defined(_OPENMP)
  if (!omp_in_parallel() && work >= kGemmParallelMinWork)
    threads = static_cast<int>(std::min<Index>(num_threads(), M / kGemmRowGrain));
#endif
  const auto block = [&](Index r0, Index rows) {
    if (rows <= 0) return;
    if (accumulate)
      c.middleRows(r0, rows).noalias() += a.middleRows(r0, rows) * b;
    else
      c.middleRows(r0, rows).noalias() = a.middleRows(r0, rows) * b;
  };
  if (threads <= 1) return block(0, M);
  // Block boundaries depend on M and the thread count only, never on timing; a row's result
  // does not depend on them (they are multiples of Eigen's row panel).
  const Index grains = (M + kGemmRowGrain - 1) / kGemmRowGrain;
  const Index blocks =
      std::min<Index>(grains, std::clamp<Index>(grains / kGemmMinBlockGrains, threads,
                                                Index(threads) * kGemmBlocksPerThread));
  const Index per = (grains + blocks - 1) / blocks * kGemmRowGrain;
  attn::RegionErrors errors;
#if defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
#endif
  for (Index i = 0; i < blocks; ++i) {
    const Index r0 = std::min<Index>(M, i * per);
    errors.run([&] { block(r0, std::min<Index>(M, r0 + per) - r0); });
  }
  errors.rethrow();
}

template <class Dst, class T>
void apply_epilogue(Dst& c, const Epilogue<T>& epi) {
  if (epi.bias != nullptr)
    c.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(epi.bias, c.cols());
  if (epi.relu) c = c.cwiseMax(T(0));
  if (epi.dropout.p > 0) {  // the scalar mask of kernels/dropout.hpp, element by element
    const T scale = static_cast<T>(1.0 / (1.0 - epi.dropout.p));
    for (Index i = 0; i < c.rows(); ++i)
      for (Index j = 0; j < c.cols(); ++j) {
        const auto flat = static_cast<std::uint64_t>(i * c.cols() + j);
        c(i, j) = epi.dropout.keeps(flat) ? c(i, j) * scale : T(0);
      }
  }
  if (epi.gate != nullptr)
    for (Index i = 0; i < c.rows(); ++i)
      for (Index j = 0; j < c.cols(); ++j)
        c(i, j) = gated<T>(c(i, j), epi.gate[i * epi.gate_stride + j], epi.gate_scale);
}

/// sums[M] += each row of a, one number at a time, k ascending (the order of the AVX-512 path's
/// add_row_sums), a column of a at a time: for a = dy^T, a row of dy.
template <class T, class Lhs>
void add_row_sums_eigen(T* sums, const Lhs& a) {
  Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> s(sums, a.rows());
  for (Index k = 0; k < a.cols(); ++k) s += a.col(k).array();
}

/// Runs the product on attn's own GEMM if it applies (float, operands in memory, c with
/// contiguous rows, a CPU with one of its kernels); false when the caller must take the Eigen path.
/// Products of fewer than kGemmPackedMinRows rows take the few-row kernels unless `few_row_kernels`
/// is false. `b_lifetime`: whether b's packed form may be kept (detail::BLifetime); with `scope`, b
/// may be larger than the product, which takes its leading [a.cols(), c.cols()] block.
template <class Dst, class Lhs, class Rhs, class T>
bool try_gemm_own(Dst& c, const Lhs& a, const Rhs& b, bool accumulate, const Epilogue<T>& epi,
                  BLifetime b_lifetime, bool few_row_kernels = true) {
#if defined(ATTN_HAVE_AVX512_GEMM)
  if constexpr (std::is_same_v<T, float>) {
    const GemmPath path = gemm_path();
    if (path != GemmPath::avx512 && path != GemmPath::avx2) return false;
    auto cv = strided_view(c);
    const auto av = strided_view(a);
    const auto bv = strided_view(b);
    if (!cv || !av || !bv || cv->col_stride != 1) return false;
    const StridedMatrix<const float> ac{av->data, av->rows, av->cols, av->row_stride,
                                        av->col_stride};
    const StridedMatrix<const float> bc{bv->data, bv->rows, bv->cols, bv->row_stride,
                                        bv->col_stride};
    const double work = static_cast<double>(c.rows()) * static_cast<double>(c.cols()) *
                        static_cast<double>(a.cols());
    // Few rows stream B from memory, and both threads' bandwidth pays from a smaller product on.
    const bool few_rows = few_row_kernels && c.rows() < kGemmPackedMinRows;
    const int threads =
        work >= (few_rows ? kGemmSmallParallelMinWork : kGemmParallelMinWork) ? num_threads() : 1;
    const bool avx512 = path == GemmPath::avx512;
    if (few_rows && gemm_small_rows(ac, bc, *cv, accumulate, epi, threads, avx512)) {
      if (epi.dropout.p > 0)
        dropout_rows(cv->data, cv->rows, cv->cols, cv->row_stride, 0, epi.dropout.p,
                     epi.dropout.key);
      apply_gate(*cv, epi);
      if (epi.row_sums_of_a != nullptr)
        (avx512 ? avx512::add_row_sums : avx2::add_row_sums)(ac, 0, ac.rows, 0, ac.cols,
                                                             epi.row_sums_of_a);
      return true;
    }
    // A few rows in a layout the few-row kernels do not take: Eigen's path on AVX-512, the packed
    // kernel on AVX2 (each as before the AVX2 few-row kernels).
    if (few_rows && avx512) return false;
    if (avx512)
      gemm_packed<Avx512Isa>(ac, bc, *cv, accumulate, epi, threads, b_lifetime);
    else
      gemm_packed<Avx2Isa>(ac, bc, *cv, accumulate, epi, threads, b_lifetime);
    return true;
  }
#endif
  (void)c, (void)a, (void)b, (void)accumulate, (void)epi, (void)b_lifetime, (void)few_row_kernels;
  return false;
}

/// c (=, or += when accumulate) a * b as gemm computes it, but on the packed kernel whatever the
/// rows of c, never the few-row kernels (which sum in another order): the products of attention's
/// blocks, whose AVX-512 register tiles (attention_tiles.hpp) give the packed kernel's bits.
/// `reuse_b`: b is unchanged while the calling thread's ReusedBScope is open
/// (gemm_pack_buffers.hpp), so its packed form is kept for the next product with the same b (the
/// same bits). b may then be larger than the product, which takes its leading [a.cols(), c.cols()]
/// block: the copy kept is of all of b, so that products with other leading blocks of it reuse it
/// (a causal head's query blocks, each of which sees more keys than the one before).
template <class Dst, class Lhs, class Rhs>
void gemm_packed_order(Dst&& c, const Lhs& a, const Rhs& b, bool accumulate, bool reuse_b = false) {
  ATTN_ASSERT(a.rows() == c.rows() && (reuse_b || (b.cols() == c.cols() && a.cols() == b.rows())));
  ATTN_ASSERT(b.cols() >= c.cols() && b.rows() >= a.cols());
  using T = typename std::decay_t<Dst>::Scalar;
  const BLifetime lifetime = reuse_b ? BLifetime::scope : BLifetime::product;
  if (try_gemm_own(c, a, b, accumulate, Epilogue<T>{}, lifetime, false)) return;
  gemm_eigen(c, a, b.topLeftCorner(a.cols(), c.cols()), accumulate);
}

/// ShapeError if the output c of kernels::gemm shares an element with its input x (`name`). An
/// expression without direct access (a sum, a scaled product) is evaluated before c is written.
/// The epilogue's bias, gate and row sums are not checked against c.
template <class Dst, class Src>
void check_output_apart(Dst& c, const Src& x, const char* name) {
  const auto cv = strided_view(c);
  const auto xv = strided_view(x);
  if (!cv || !xv) return;
  ATTN_CHECK(!share_an_element(*cv, *xv), ShapeError,
             "kernels::gemm: the output c shares memory with the input ", name,
             "; c is written while ", name, " is read");
}

}  // namespace detail

/// While one lives on the calling thread, products there whose b is a weight (gemm's `constant_b`,
/// which linear_forward sets) pack that weight once and reuse the packed copy; the copies are freed
/// when the outermost scope ends. For decoding (greedy_decode, beam_search), where every weight
/// meets a few rows per step. The weights must not change while a scope is open.
class ConstantWeightsScope {
 public:
  ConstantWeightsScope() {
#if defined(ATTN_HAVE_AVX512_GEMM)
    ++detail::weight_cache().depth;
#endif
  }
  ~ConstantWeightsScope() {
#if defined(ATTN_HAVE_AVX512_GEMM)
    if (--detail::weight_cache().depth == 0) detail::weight_cache().clear();
#endif
  }
  ConstantWeightsScope(const ConstantWeightsScope&) = delete;
  ConstantWeightsScope& operator=(const ConstantWeightsScope&) = delete;
};

/// c (=, or += when accumulate) a * b, then the epilogue (kernels/epilogue.hpp), for
/// Eigen expressions a [M, K] and b [K, N] and a writable block c [M, N] that shares no element
/// with a or b (ShapeError: c is written while they are read). `constant_b` says b is a weight,
/// unchanged while a ConstantWeightsScope is open.
template <class Dst, class Lhs, class Rhs, class T = typename std::decay_t<Dst>::Scalar>
void gemm(Dst&& c, const Lhs& a, const Rhs& b, bool accumulate, const Epilogue<T>& epi = {},
          bool constant_b = false) {
  ATTN_CHECK(a.rows() == c.rows() && b.cols() == c.cols() && a.cols() == b.rows(), ShapeError,
             "kernels::gemm: expected a [M, K], b [K, N] and c [M, N], got a [", a.rows(), ", ",
             a.cols(), "], b [", b.rows(), ", ", b.cols(), "] and c [", c.rows(), ", ", c.cols(),
             "]");
  ATTN_CHECK(epi.gate == nullptr || (epi.bias == nullptr && !epi.relu && epi.dropout.p == 0),
             ConfigError, "kernels::gemm: an epilogue with a gate takes no bias, ReLU or dropout");
  // p >= 1 zeroed c, and NaN or a negative p was taken for no dropout, in silence.
  epi.dropout.check("kernels::gemm");
  detail::check_output_apart(c, a, "a");
  detail::check_output_apart(c, b, "b");
  const auto lifetime = constant_b ? detail::BLifetime::weight : detail::BLifetime::product;
  if (detail::try_gemm_own(c, a, b, accumulate, epi, lifetime)) return;
  detail::gemm_eigen(c, a, b, accumulate);
  if (epi.bias != nullptr || epi.relu || epi.dropout.p > 0 || epi.gate != nullptr)
    detail::apply_epilogue(c, epi);
  if (epi.row_sums_of_a != nullptr) detail::add_row_sums_eigen(epi.row_sums_of_a, a);
}

}  // namespace attn::kernels
