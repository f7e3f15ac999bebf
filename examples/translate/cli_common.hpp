// What the subcommands of attn-translate share: the --threads option, which every subcommand
// repeats so that its --help lists it, and the decoding flags of translate and evaluate.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "translator.hpp"

namespace attn::translate {

/// Checks of a flag's value: a number above 0, and a finite number of at least 0. (CLI11's
/// PositiveNumber and NonNegativeNumber name a range up to DBL_MAX, printed in 310 digits.)
const CLI::Validator& positive();
const CLI::Validator& finite_non_negative();
/// A number in [lo, hi].
CLI::Validator in_range(double lo, double hi);

/// A check that a value is a decimal integer within T's range (int, std::int64_t or
/// std::uint64_t), which hands CLI11 the number's own digits ("010" as "10"): add it with
/// Option::transform, as Option::check passes validators a copy. Unnamed, so that --help shows
/// the option's type alone (INT, not INT:INT).
template <class T>
CLI::Validator integer_check();

/// `option`, bound to an int, with integer_check<int>(), so that a message names the int's range.
CLI::Option* int_option(CLI::Option* option);

/// Adds to every other option of `app` and of its subcommands bound to an integer (CLI11's type
/// names INT and UINT, alone or with a named check: "INT:[1,256]") integer_check for 64 bits,
/// signed or not, run before any other check. CLI11 reads them with strtoll(s, 0, 0) and strtoull,
/// which clamp a value out of range, read a leading 0 as octal and 0x as hexadecimal, and strtoull
/// wraps a negative one: --seed -1 trained with seed 2^64 - 1, --steps 2^63 ran without a limit,
/// --steps 010 ran 8 steps.
void check_integers(CLI::App& app);

/// IOError unless everything written to standard output so far got there (a full disk, a
/// closed pipe); `what` names what was written. For the reason in the message, the caller sets
/// errno to 0 before it writes and stops writing at the first failure (!std::cout).
void check_stdout(const std::string& what);

/// --threads on `app` (at most attn::kMaxThreads), bound to `threads` (one variable for the main
/// app and every subcommand).
void add_threads(CLI::App* app, int& threads);

/// Whether --threads was given, before or after the subcommand `sub`.
bool threads_given(const CLI::App& sub);

/// --beam, --alpha (unless `with_alpha` is false), --greedy, --batch-size and --max-extra-length.
void add_decode_flags(CLI::App* app, TranslateOptions& options, bool with_alpha = true);

}  // namespace attn::translate
