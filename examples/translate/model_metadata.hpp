// What an attn-translate model file says about itself: besides the model's "config.*" keys
// (TransformerConfig::to_metadata), the vocabulary it was trained with and the longest input it
// translates. Every model file and training checkpoint carries these keys, so a model directory
// is self-describing; the training state a checkpoint adds is train_state.hpp's.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <attn/nn/transformer.hpp>
#include <attn/train/checkpoint.hpp>
#include <attn/train/safetensors.hpp>

#include "bpe.hpp"

namespace attn::translate {

using Metadata = std::map<std::string, std::string>;

/// Metadata keys besides the model's "config.*" that the trainer writes into every file.
inline constexpr const char* kMaxLenKey = "translate.max_len";
/// The largest translate.max_len a model file may declare (subword tokens per sentence).
inline constexpr Index kMaxTranslateLength = Index(1) << 16;
inline constexpr const char* kVocabSizeKey = "vocab.size";
inline constexpr const char* kVocabHashKey = "vocab.hash";

/// The prefixes of the keys above and the config's: the model's identity, the same in every
/// checkpoint of one run, and all an averaged model keeps (not one checkpoint's training state).
inline const std::vector<std::string> kModelMetadataPrefixes = {"config.", "vocab.", "translate."};

/// The length penalty `attn-translate select` chose for a model file's weights on a validation set:
/// translate and evaluate decode with it unless --alpha says otherwise. Not a model identity key
/// (kModelMetadataPrefixes): it belongs to one file's weights, so an average drops it.
inline constexpr const char* kAlphaKey = "decode.alpha";

/// How attn-translate reads a model file or a training checkpoint as a model of `params`: the
/// training state is skipped, and may hold at most the bytes of Adam's two moments (twice the
/// parameters'; the trainer writes no "extra." tensors), so that a file declaring more is refused
/// before it is read.
LoadOptions model_file_options(const std::vector<NamedParameter<float>>& params);

/// Writes vocab.size and vocab.hash: the fingerprint of the vocabulary the model is trained with.
void store_vocab_metadata(const SubwordVocab& vocab, Metadata& m);

/// The model configuration of `file` (config_from_model_file), which must also fit `vocab`: made
/// with it (vocab.size and vocab.hash metadata, so a checkpoint copied in from another model
/// directory is refused), one vocabulary of vocab.size() pieces on both sides, padded with its pad
/// id. FormatError naming the file and the field otherwise (an edited config.pad_id would decode
/// with a wrong padding mask).
TransformerConfig model_config(const SafetensorsFile& file, const SubwordVocab& vocab);

/// translate.max_len of `file`: the longest source it translates, in subword tokens. FormatError
/// naming the file if it is missing, malformed or outside [1, kMaxTranslateLength].
Index model_max_len(const SafetensorsFile& file);

/// decode.alpha of `file`, or nothing if it has none. FormatError naming the file unless it is a
/// finite number >= 0 (DecodeOptions' length_penalty).
std::optional<double> model_alpha(const SafetensorsFile& file);

}  // namespace attn::translate
