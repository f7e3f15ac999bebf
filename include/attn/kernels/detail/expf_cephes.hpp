// The constants of the vectorised expf that attention's softmax rows use (softmax_avx512.hpp,
// softmax_avx2.hpp), in one place so that both kernels compute the same polynomial: Cephes'
// expf, x = n ln2 + r with ln 2 split in two for an exact reduction, exp(r) by a degree-7
// polynomial (1 + r + r^2 p(r), p's coefficients highest first), valid for |r| <= ln2 / 2.
#pragma once

namespace attn::kernels::detail::expf_cephes {

inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kPoly[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                  4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
inline constexpr float kMinArgument = -104.0f;    // exp of anything lower is 0 once flushed
inline constexpr float kMaxArgument = 88.72283f;  // about log of the largest float

}  // namespace attn::kernels::detail::expf_cephes
