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

/// Adds to every option of `app` and of its subcommands bound to an integer (CLI11's type names
/// INT and UINT) a check that the value is a decimal integer within 64 bits, signed or not. CLI11
/// reads them with strtoll and strtoull, which clamp a value out of range, and strtoull wraps a
/// negative one: --seed -1 trained with seed 2^64 - 1, --steps 2^63 ran without a limit.
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
