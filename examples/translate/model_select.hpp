// Choosing what to translate with on a validation set, as the paper chose its beam size and length
// penalty "after experimentation on the development set" (section 6.1): `attn-translate select`
// scores the average of a run's last N checkpoints for several N and several length penalties,
// and makes the best pair the model directory's model file, its length penalty stored beside the
// weights (decode.alpha), which translate and evaluate then use.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bleu.hpp"
#include "corpus_io.hpp"
#include "translator.hpp"

namespace attn::translate {

struct SelectOptions {
  std::vector<int> lasts = {1, 5, 10, 16, 24};   ///< how many of the last checkpoints to average
  std::vector<double> alphas = {0.6, 1.0, 1.4};  ///< length penalties
  TranslateOptions decode;                       ///< everything but the length penalty
  BleuOptions bleu;
};

/// One average at one length penalty, scored on the validation set.
struct SelectScore {
  int last = 0;  ///< checkpoints averaged
  std::int64_t first_step = 0, last_step = 0;
  double alpha = 0;
  BleuScore bleu;
};

struct Selection {
  std::vector<SelectScore> scores;  ///< in the order scored: N ascending, then alpha ascending
  std::size_t best = 0;             ///< the highest BLEU (the first of equals)
  std::vector<int> skipped;         ///< the Ns larger than the number of checkpoints
  std::size_t checkpoints = 0;      ///< in the directory
};

/// Scores, on `valid` (named `valid_name` in messages), the average of the last N checkpoints of
/// `dir` for each N of `options.lasts` that it has, decoded at each of `options.alphas`; calls
/// `on_score` after each. Writes the best average to `output` (empty: dir/model.safetensors)
/// with its length penalty as decode.alpha, atomically. Holds the directory's lock throughout
/// (ConfigError while a trainer holds it), and needs no model.safetensors.
///
/// Refused before any decoding: a list that is empty, an N below 1, an alpha that is not finite
/// and >= 0 (ConfigError); a directory that is missing or has fewer checkpoints than every N
/// (ConfigError); a checkpoint of the widest window that is not of the newest one's model
/// (FormatError naming it) or an average of it that is not finite (NumericError); an `output`
/// whose directory is missing or not writable, or that is there and not a regular file (IOError).
Selection select_average(const std::string& dir, const ParallelCorpus& valid,
                         const SelectOptions& options, const std::string& output = "",
                         const std::string& valid_name = "validation source",
                         const std::function<void(const SelectScore&)>& on_score = {});

/// `alpha` as the shortest decimal that reads back as the same double ("1.4").
std::string alpha_text(double alpha);

}  // namespace attn::translate
