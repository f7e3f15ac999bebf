#include "cli_common.hpp"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <set>
#include <string>

#include <attn/decode/options.hpp>
#include <attn/error.hpp>
#include <attn/parallel.hpp>  // kMaxThreads

namespace attn::translate {

namespace {

// A validator of numbers: "" when ok(value), else "expected <expected>, got <input>".
template <class Ok>
CLI::Validator number_check(const std::string& name, const std::string& expected, Ok ok) {
  return CLI::Validator(
      [=](std::string& input) {
        double value = 0;
        if (CLI::detail::lexical_cast(input, value) && ok(value)) return std::string();
        return "expected " + expected + ", got " + input;
      },
      name);
}

// Whether an option's type, as --help shows it ("INT", or "INT:[1,256]" with a named validator),
// is `type`.
bool has_type(const CLI::Option& option, const std::string& type) {
  const std::string name = option.get_type_name();
  return name.compare(0, type.size(), type) == 0 &&
         (name.size() == type.size() || name[type.size()] == ':');
}

}  // namespace

template <class T>
CLI::Validator integer_check() {
  return CLI::Validator(
      [](std::string& input) {
        T value{};
        const char* last = input.data() + input.size();
        const auto [end, ec] = std::from_chars(input.data(), last, value);
        if (ec != std::errc() || end != last || input.empty())
          return "expected a decimal integer in [" + std::to_string(std::numeric_limits<T>::min()) +
                 ", " + std::to_string(std::numeric_limits<T>::max()) + "], got " + input;
        // CLI11 converts with strtoll(s, 0, 0), which reads "010" as octal 8: it is given the
        // number's own digits instead.
        input = std::to_string(value);
        return std::string();
      },
      std::string());
}
template CLI::Validator integer_check<int>();
template CLI::Validator integer_check<std::int64_t>();
template CLI::Validator integer_check<std::uint64_t>();

namespace {

// The options given integer_check<int> (int_option), which check_integers leaves as they are: its
// 64-bit check would run first and name the 64-bit range.
std::set<const CLI::Option*>& int_options() {
  static std::set<const CLI::Option*> options;
  return options;
}

}  // namespace

CLI::Option* int_option(CLI::Option* option) {
  int_options().insert(option);
  return option->transform(integer_check<int>());
}

void check_integers(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    if (int_options().count(option) > 0) continue;
    if (has_type(*option, "INT"))
      option->transform(integer_check<std::int64_t>());
    else if (has_type(*option, "UINT"))
      option->transform(integer_check<std::uint64_t>());
  }
  for (CLI::App* sub : app.get_subcommands({})) check_integers(*sub);
}

const CLI::Validator& positive() {
  static const CLI::Validator v =
      number_check("POSITIVE", "a number > 0", [](double x) { return x > 0; });
  return v;
}

const CLI::Validator& finite_non_negative() {
  static const CLI::Validator v = number_check("NONNEGATIVE", "a finite number >= 0",
                                               [](double x) { return std::isfinite(x) && x >= 0; });
  return v;
}

CLI::Validator in_range(double lo, double hi) {
  const std::string range =
      "[" + CLI::detail::to_string(lo) + "," + CLI::detail::to_string(hi) + "]";
  return number_check(range, "a number in " + range, [=](double x) { return x >= lo && x <= hi; });
}

void check_stdout(const std::string& what) {
  int err = errno;  // a write that failed before: the caller zeroed errno and stopped at it
  if (std::cout.good()) {
    errno = 0;
    std::cout.flush();
    err = errno;
  }
  ATTN_CHECK(std::cout.good(), IOError, "cannot write ", what,
             " to standard output: ", err != 0 ? std::strerror(err) : "a write failed");
}

void add_threads(CLI::App* app, int& threads) {
  // Bounded: each thread takes a stack, and under a 1.5 GB address-space limit --threads 1000 made
  // libgomp fail to create its threads and exit on its own, past attn's error handling.
  int_option(app->add_option("--threads", threads, "worker threads"))
      ->capture_default_str()
      ->check(positive())
      ->check(in_range(1, kMaxThreads));
}

bool threads_given(const CLI::App& sub) {
  const CLI::App* parent = sub.get_parent();
  return sub.count("--threads") + (parent ? parent->count("--threads") : 0) > 0;
}

void add_decode_flags(CLI::App* app, TranslateOptions& o, bool with_alpha) {
  // Checked as the flags are parsed, before a model is loaded or a line read (an interactive
  // translate took them until its first line, then named DecodeOptions' fields).
  int_option(app->add_option("--beam", o.beam, "beam size"))
      ->capture_default_str()
      ->check(in_range(1, static_cast<double>(DecodeOptions::kMaxBeamSize)));
  if (with_alpha)
    app->add_option("--alpha", o.alpha,
                    "length penalty alpha of ((5+|Y|)/6)^alpha; without it, the one `select` "
                    "chose for the model file, if it did")
        ->capture_default_str()
        ->check(finite_non_negative())
        ->each([&o](const std::string&) { o.alpha_given = true; });
  app->add_flag("--greedy", o.greedy, "greedy decoding instead of beam search (default: off)");
  app->add_option("--batch-size", o.batch_size, "sentences per decoding batch")
      ->capture_default_str()
      ->check(positive());
  app->add_option("--max-extra-length", o.max_extra_length,
                  "output may be this many tokens longer than the input")
      ->capture_default_str()
      ->check(in_range(0, static_cast<double>(DecodeOptions::kMaxExtraLength)));
}

}  // namespace attn::translate
