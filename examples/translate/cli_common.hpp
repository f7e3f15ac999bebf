// What the subcommands of attn-translate share: the --threads option, which every subcommand
// repeats so that its --help lists it, and the decoding flags of translate and evaluate.
#pragma once

#include <CLI/CLI.hpp>

#include "translator.hpp"

namespace attn::translate {

/// --threads on `app`, bound to `threads` (one variable for the main app and every subcommand).
void add_threads(CLI::App* app, int& threads);

/// Whether --threads was given, before or after the subcommand `sub`.
bool threads_given(const CLI::App& sub);

/// --beam, --alpha, --greedy, --batch-size and --max-extra-length.
void add_decode_flags(CLI::App* app, TranslateOptions& options);

}  // namespace attn::translate
