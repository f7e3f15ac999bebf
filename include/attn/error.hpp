// attn::Error and its subclasses, ATTN_CHECK (always on) and ATTN_ASSERT (debug only).
//
// Anything a caller can get wrong (shapes, configuration, token ids, files) is checked with
// ATTN_CHECK in every build and throws a subclass of attn::Error whose message names what was
// expected and what came. ATTN_ASSERT guards internal invariants: it compiles out under NDEBUG,
// and throws attn::InternalError when ATTN_ASSERT_THROWS is defined (the tests do this).
#pragma once

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace attn {

/// Base of every exception attn throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A tensor, mask or buffer has the wrong shape or rank.
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// A configuration cannot work (d_model not divisible by heads, p_drop outside [0, 1), ...).
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// An index is out of range: token ids outside the vocabulary, axis or element indices.
class IndexError : public Error {
 public:
  using Error::Error;
};

/// A value is not finite where it must be (NaN or Inf in the loss or the gradients).
class NumericError : public Error {
 public:
  using Error::Error;
};

/// A file cannot be opened, read or written.
class IOError : public Error {
 public:
  using Error::Error;
};

/// A file was read but its content is wrong: truncated, corrupt, or from another configuration.
class FormatError : public IOError {
 public:
  using IOError::IOError;
};

/// Input data is unusable (mismatched parallel files, empty batches, invalid text).
class DataError : public Error {
 public:
  using Error::Error;
};

/// A call came out of order: backward before forward, a gradient before the backward that makes
/// it, weights a forward did not keep, a second sum while one is in flight.
class StateError : public Error {
 public:
  using Error::Error;
};

/// An internal invariant was broken: a bug in attn, never the caller's fault.
class InternalError : public Error {
 public:
  using Error::Error;
};

namespace detail {

/// Streams every argument into one string: concat("expected ", 3, ", got ", 4).
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}

/// Whether `v` is finite and within the range of T, so that converting it to T (undefined beyond
/// that range) gives a finite number: a float parameter's settings are checked in double.
template <class T>
bool fits_in(double v) {
  return std::isfinite(v) && std::fabs(v) <= static_cast<double>(std::numeric_limits<T>::max());
}

}  // namespace detail
}  // namespace attn

/// ATTN_CHECK(cond, ErrorType, message parts...): throws ErrorType(message) unless cond holds.
#define ATTN_CHECK(cond, ErrorType, ...)                               \
  do {                                                                 \
    if (!(cond)) throw ErrorType(::attn::detail::concat(__VA_ARGS__)); \
  } while (false)

#if defined(ATTN_ASSERT_THROWS)
#define ATTN_ASSERT(cond)                                                                      \
  do {                                                                                         \
    if (!(cond))                                                                               \
      throw ::attn::InternalError(::attn::detail::concat("internal assertion failed: ", #cond, \
                                                         " at ", __FILE__, ":", __LINE__));    \
  } while (false)
#elif defined(NDEBUG)
#define ATTN_ASSERT(cond) ((void)0)
#else
#include <cassert>
#define ATTN_ASSERT(cond) assert(cond)
#endif

namespace attn::detail {

/// ConfigError unless `p` is in [0, 1): a drop probability, a smoothing, a decay or one of Adam's
/// betas. The message is "who: name must be in [0, 1), got p" ("name must ..." for an empty
/// `who`). NaN fails too (p >= 0 is false for it): taken for 0, it meant no dropout in silence.
inline void check_probability(const char* who, const char* name, double p) {
  ATTN_CHECK(p >= 0 && p < 1, ConfigError, who, *who != '\0' ? ": " : "", name,
             " must be in [0, 1), got ", p);
}

}  // namespace attn::detail
