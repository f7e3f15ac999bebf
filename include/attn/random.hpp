// Counter-based random numbers: every draw is a pure function of (seed, counter), so a stream is
// reproducible from two integers, checkpoints store exactly that, and parallel loops can draw
// element i without sharing state (dropout masks do not depend on the thread count).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "attn/tensor.hpp"

namespace attn {

/// SplitMix64's constants (Steele, Lea and Flood, 2014), shared with the vector dropout mask
/// kernels (kernels/detail/dropout_avx2.hpp and dropout_avx512.hpp), which must draw the same bits.
inline constexpr std::uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ULL;  // 2^64 / golden ratio
inline constexpr std::uint64_t kMix64Multiplier1 = 0xbf58476d1ce4e5b9ULL;
inline constexpr std::uint64_t kMix64Multiplier2 = 0x94d049bb133111ebULL;

/// 64-bit FNV-1a (Fowler, Noll and Vo): start from kFnv1aOffset and fold bytes in with fnv1a.
/// Fingerprints of files, batches and parameters use it; it is fixed across platforms.
inline constexpr std::uint64_t kFnv1aOffset = 0xcbf29ce484222325ULL;
inline constexpr std::uint64_t kFnv1aPrime = 0x100000001b3ULL;

/// h with the n bytes at `data` folded in, one at a time.
inline std::uint64_t fnv1a(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * kFnv1aPrime;
  return h;
}

/// SplitMix64's finaliser: a bijective 64-bit mix with good avalanche.
inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * kMix64Multiplier1;
  z = (z ^ (z >> 27)) * kMix64Multiplier2;
  return z ^ (z >> 31);
}

/// Draw i of the stream `key`: 32 random bits. The stream is SplitMix64's seeded with `key`, one
/// 64-bit output mix64(key + j gamma) per pair of draws j = i / 2, its low half for the even draw
/// and its high half for the odd one: one mix per two draws, which dropout masks need cheap (a mix
/// of a mix per draw made the mask 5x slower). Streams of two keys are the one SplitMix64 sequence
/// at offsets (key' - key) / gamma apart: for the well-mixed keys RandomState::next_key gives,
/// pseudo-random, so no two masks of a run overlap in practice.
inline std::uint32_t draw_bits(std::uint64_t key, std::uint64_t i) {
  return static_cast<std::uint32_t>(mix64(key + (i >> 1) * kSplitMixGamma) >> (32 * (i & 1)));
}

/// A uniform draw in [0, 1) from the pair (key, i), with 32 bits of resolution: draw_bits 2^-32.
inline double uniform_at(std::uint64_t key, std::uint64_t i) {
  return static_cast<double>(draw_bits(key, i)) * 0x1.0p-32;
}

/// An inverted dropout's mask over a tensor: element i (its row-major index) is dropped iff
/// uniform_at(key, i) < p, the kept ones scaled by 1 / (1 - p); p = 0 is no dropout. Backward
/// regenerates the mask from (p, key) instead of storing it, and it does not depend on how a loop
/// is split across threads. What a fused kernel needs to apply a Dropout's mask itself
/// (nn/dropout.hpp), and what attention applies to its weights [B, H, T, S].
struct DropoutMask {
  double p = 0;
  std::uint64_t key = 0;

  bool keeps(std::uint64_t i) const { return uniform_at(key, i) >= p; }

  /// ConfigError unless p is in [0, 1), naming `who` (p >= 1 zeroed every output, and NaN or a
  /// negative p was taken for no dropout, in silence).
  void check(const char* who) const { detail::check_probability(who, "dropout probability", p); }
};

/// A sequential generator; its whole state is (seed, counter).
class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0, std::uint64_t counter = 0)
      : seed_(seed), counter_(counter) {}

  std::uint64_t next_u64() { return mix64(mix64(seed_) + kSplitMixGamma * ++counter_); }
  /// Uniform in [0, 1).
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  /// Standard normal (Box-Muller, one value per call).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  /// Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next_u64() % n; }

  std::uint64_t seed() const { return seed_; }
  std::uint64_t counter() const { return counter_; }
  void set_state(std::uint64_t seed, std::uint64_t counter) {
    seed_ = seed;
    counter_ = counter;
  }

 private:
  std::uint64_t seed_;
  std::uint64_t counter_;
};

/// Fills `t` with U(lo, hi) draws from `rng`, in row-major order.
template <class T>
void fill_uniform(Tensor<T>& t, Rng& rng, double lo, double hi) {
  for (T& v : t) v = static_cast<T>(rng.uniform(lo, hi));
}

/// Fills `t` with N(mean, std^2) draws from `rng`.
template <class T>
void fill_normal(Tensor<T>& t, Rng& rng, double mean, double std) {
  for (T& v : t) v = static_cast<T>(mean + std * rng.normal());
}

/// Xavier/Glorot uniform for a [fan_out, fan_in] weight: U(-a, a), a = sqrt(6 / (fan_in +
/// fan_out)), as torch.nn.init.xavier_uniform_ (which nn.Transformer applies to every matrix).
template <class T>
void xavier_uniform(Tensor<T>& weight, Rng& rng) {
  ATTN_CHECK(weight.rank() == 2, ShapeError, "xavier_uniform: expected a rank-2 weight, got shape ",
             weight.shape());
  const double a = std::sqrt(6.0 / static_cast<double>(weight.size(0) + weight.size(1)));
  fill_uniform(weight, rng, -a, a);
}

}  // namespace attn

namespace attn {

/// The random stream that every Dropout of one model draws from. Each call to a Dropout forward in
/// training mode takes the next key; element i of its mask is uniform_at(key, i). The whole state
/// is (seed, counter): a checkpoint stores the two and a resumed run draws the same masks.
struct RandomState {
  std::uint64_t seed = 0;
  std::uint64_t counter = 0;

  std::uint64_t next_key() { return mix64(mix64(seed) ^ mix64(++counter + 0x632be59bd9b4e019ULL)); }
};

}  // namespace attn
