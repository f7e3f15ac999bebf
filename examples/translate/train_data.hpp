// Which data `attn-translate train` trains on: the files of --src/--tgt (and of the validation and
// test flags), or else the built-in English -> German corpus of --mix (builtin_corpus.hpp).
#pragma once

#include <string>

#include "builtin_corpus.hpp"

namespace attn::translate {

/// The train subcommand's data flags; empty paths are "not given".
struct TrainDataFlags {
  std::string src, tgt;                        ///< training files, line-aligned
  std::string valid_src, valid_tgt;            ///< validation files
  std::string test_src, test_tgt;              ///< test files
  std::string mix = "descriptions,sentences";  ///< the main job passes "descriptions" (README)
  BuiltinCorpusOptions builtin;
};

/// Sets the built-in corpus's sources from `mix`, a comma-separated subset of descriptions,
/// sentences, phrases, words, gettext; ConfigError naming an unknown item.
void apply_mix(const std::string& mix, BuiltinCorpusOptions& builtin);

/// The corpus the flags name: the built-in corpus of flags.builtin (apply_mix first) without
/// --src, with its summary printed to stderr when `report` (rank 0 of a job: every rank reads
/// the same corpus); the given files replace its validation and test sets (and the showcase,
/// with a test set). ConfigError if a file of a pair is given without the other.
BuiltinCorpus load_train_data(const TrainDataFlags& flags, bool report);

}  // namespace attn::translate
