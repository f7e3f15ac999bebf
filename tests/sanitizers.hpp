// Whether ASan or TSan instruments the test. They reserve terabytes of address space for their
// shadow memory at start-up, so a test that sets an address-space limit (RLIMIT_AS) skips there.
#pragma once

namespace attn::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace attn::testing
