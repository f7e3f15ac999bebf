// The trainer's reports in its model directory: curves.svg, the learning curves (training loss,
// validation loss and BLEU by update), and attention.svg, the encoder-decoder attention of every
// decoder layer and head on one held-out sentence.
#pragma once

#include <string>
#include <vector>

#include <attn/nn/transformer.hpp>

#include "bpe.hpp"

namespace attn::translate {

/// One point of the learning curves (NaN where not measured).
struct CurvePoint {
  Index step = 0;
  double train_loss = 0, valid_loss = 0, valid_bleu = 0;
};

/// Writes the curves to `path` (atomically, as every SVG).
void write_curves_svg(const std::string& path, const std::vector<CurvePoint>& curves);

/// Translates one of `sources` greedily and writes the attention of every decoder layer's
/// encoder-decoder sublayer on it to `path`, titled with its text from `source_text`. The one
/// chosen is the first of 8-20 subword tokens (long enough to show an alignment, short enough for
/// readable labels), else the first. Writes nothing if there is no source or the first is empty.
void write_attention_svg(const std::string& path, Transformer<float>& model,
                         const SubwordVocab& vocab,
                         const std::vector<std::vector<TokenId>>& sources,
                         const std::vector<std::string>& source_text);

}  // namespace attn::translate
