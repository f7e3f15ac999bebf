// The rows of an option table (train_options.hpp has the trainer's): each option's flag and help,
// the values it may take, and what else its readers need to know of it. One table, in the style
// of FieldList (attn/nn/layer_options.hpp), serves the CLI, the checks, the checkpoints and the
// ranks of an MPI job.
#pragma once

#include <limits>
#include <string>
#include <type_traits>

#include <attn/error.hpp>

#include "text.hpp"  // round_trip_text

namespace attn::translate {

/// The values an option may take: from lo to hi, each included unless open; every value when
/// `any`. A floating-point range with hi = max() takes no infinity, and no range takes NaN.
template <class T>
struct Range {
  T lo{}, hi{};
  bool lo_open = false, hi_open = false;
  bool any = false;

  bool contains(const T& v) const {
    if (any) return true;
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
  /// What contains() asks, for messages: "in [2, 65536]", "in [-1, 1)", ">= 0", "finite and > 0".
  std::string text() const {
    if (hi != std::numeric_limits<T>::max())
      return detail::concat("in ", lo_open ? "(" : "[", lo, ", ", hi, hi_open ? ")" : "]");
    return detail::concat(std::is_floating_point_v<T> ? "finite and " : "",
                          lo_open ? "> " : ">= ", lo);
  }
};

/// Whether an option's field holds a number (not a switch or a string): what has a range to
/// check, and what a checkpoint can store.
template <class V>
inline constexpr bool kIsNumber = std::is_arithmetic_v<V> && !std::is_same_v<V, bool>;

/// An option's value as text that reads back the same (checkpoints store it, MPI ranks compare
/// it): a double in round_trip_text's 17 digits, a bool as 1 or 0, an integer in decimal.
template <class T>
std::string exact_text(const T& v) {
  if constexpr (std::is_floating_point_v<T>)
    return round_trip_text(v);
  else if constexpr (std::is_same_v<T, bool>)
    return v ? "1" : "0";
  else if constexpr (std::is_arithmetic_v<T>)
    return std::to_string(v);
  else
    return v;
}

/// One row of the option table, less its field and range: what each reader needs to know.
struct OptionInfo {
  /// "--warmup", the name messages use. "!--no-eval": a switch that sets its field to false.
  /// Empty for the fields that have no flag (messages then use `key`).
  const char* flag = "";
  const char* help = "";
  /// What a special value means, for the range message: "0: no limit".
  const char* note = nullptr;
  /// The metadata key a checkpoint stores it under, for an option that changes what training
  /// computes (--resume restores it); null: not stored.
  const char* key = nullptr;
  /// false for an option added after checkpoints existed: absent, it was trained with the field's
  /// default (off).
  bool required = true;
  /// The ranks of an MPI job must be given the same value (each decides on its own with it).
  bool agreed = false;
  /// A bool that takes a value (--svg 0) instead of a switch.
  bool valued = false;
  /// cli_train.cpp adds the flag (false: --threads, added for every subcommand).
  bool cli = true;
  /// The TransformerConfig fields it overrides (null: none) when given: an integer > 0, a
  /// floating-point value >= 0 or a switch that is on (make_config).
  const char* model_fields[2] = {nullptr, nullptr};
  /// false: it only sizes the model fields, which make_config sets otherwise (--vocab-size: the
  /// vocabulary trained may have fewer pieces); they are named for it in messages.
  bool applied = true;

  OptionInfo means(const char* n) const {
    return with([&](OptionInfo& o) { o.note = n; });
  }
  OptionInfo stored(const char* k) const {
    return with([&](OptionInfo& o) { o.key = k; });
  }
  OptionInfo stored_if_present(const char* k) const {
    return with([&](OptionInfo& o) {
      o.key = k;
      o.required = false;
    });
  }
  OptionInfo agreed_by_ranks() const {
    return with([](OptionInfo& o) { o.agreed = true; });
  }
  OptionInfo takes_value() const {
    return with([](OptionInfo& o) { o.valued = true; });
  }
  OptionInfo not_a_train_flag() const {
    return with([](OptionInfo& o) { o.cli = false; });
  }
  OptionInfo overrides(const char* a, const char* b = nullptr) const {
    return with([&](OptionInfo& o) {
      o.model_fields[0] = a;
      o.model_fields[1] = b;
    });
  }
  OptionInfo sizes(const char* a, const char* b) const {
    return with([&](OptionInfo& o) {
      o.model_fields[0] = a;
      o.model_fields[1] = b;
      o.applied = false;
    });
  }
  /// The flag without a switch's '!', or the key for a field without one.
  std::string name() const {
    if (*flag == '\0') return key ? key : "";
    return flag[0] == '!' ? flag + 1 : flag;
  }
  bool overrides_field(const std::string& field) const {
    for (const char* f : model_fields)
      if (f && field == f) return true;
    return false;
  }

 private:
  template <class Edit>
  OptionInfo with(Edit edit) const {
    OptionInfo o = *this;
    edit(o);
    return o;
  }
};

/// The rows' building blocks, for the tables' visit functions (`using namespace option_rows`).
namespace option_rows {

template <class T>
Range<T> at_least(T lo) {
  return {lo, std::numeric_limits<T>::max()};
}
template <class T>
Range<T> above(T lo) {
  return {lo, std::numeric_limits<T>::max(), true};
}
template <class T>
Range<T> within(T lo, T hi) {
  return {lo, hi};
}
/// [lo, hi)
template <class T>
Range<T> below(T lo, T hi) {
  return {lo, hi, false, true};
}
template <class T>
Range<T> anything() {
  Range<T> r;
  r.any = true;
  return r;
}

inline OptionInfo flag(const char* name, const char* help) {
  OptionInfo o;
  o.flag = name;
  o.help = help;
  return o;
}

}  // namespace option_rows

}  // namespace attn::translate
