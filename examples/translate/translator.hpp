// Loading a trained model directory and translating with it: the inference half of attn-translate.
//
// A model directory (model_dir.hpp) holds spm.model + vocab.txt (the shared subword vocabulary)
// and either model.safetensors (final or averaged weights) or training checkpoints
// checkpoint_<step>.safetensors; the model's configuration travels in each file's metadata, so a
// directory is self-describing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <attn/decode/beam_search.hpp>
#include <attn/decode/greedy.hpp>
#include <attn/nn/transformer.hpp>
#include <attn/train/safetensors.hpp>

#include "bleu.hpp"
#include "bpe.hpp"
#include "model_dir.hpp"  // list_checkpoints, model_file

namespace attn::translate {

/// Metadata keys besides the model's "config.*" that the trainer writes into every file.
inline constexpr const char* kMaxLenKey = "translate.max_len";
/// The largest translate.max_len a model file may declare (subword tokens per sentence).
inline constexpr Index kMaxTranslateLength = Index(1) << 16;
inline constexpr const char* kVocabSizeKey = "vocab.size";
inline constexpr const char* kVocabHashKey = "vocab.hash";

/// The model configuration of `file` (config_from_model_file), which must also fit `vocab`: made
/// with it (vocab.size and vocab.hash metadata, so a checkpoint copied in from another model
/// directory is refused), one vocabulary of vocab.size() pieces on both sides, padded with its pad
/// id. FormatError naming the file and the field otherwise (an edited config.pad_id would decode
/// with a wrong padding mask).
TransformerConfig model_config(const SafetensorsFile& file, const SubwordVocab& vocab);

struct TranslateOptions {
  bool greedy = false;
  Index beam = 4;
  double alpha = 0.6;
  Index batch_size = 32;  ///< sentences per decoder batch
  Index max_extra_length = 50;
};

/// Decodes id sequences in batches of similar length; returns outputs in input order (without
/// BOS/EOS). Empty sources give empty outputs without running the model.
std::vector<std::vector<TokenId>> translate_ids(Transformer<float>& model,
                                                const std::vector<std::vector<TokenId>>& sources,
                                                const TranslateOptions& options);

class Translator {
 public:
  /// Loads the vocabulary and weights of `dir`; refuses a directory whose vocab.txt does not
  /// describe its spm.model or whose weights were trained with another vocabulary.
  explicit Translator(const std::string& dir);

  /// One output line per input line. An empty line gives an empty line. Before any decoding,
  /// throws DataError naming `input_name`, the (1-based) line and the problem if a line is not
  /// valid UTF-8 (with the byte offset) or is longer than the model's max_len (with its length
  /// in subword tokens and the limit). `first_line` numbers lines[0] in those messages (a
  /// stream translated line by line).
  std::vector<std::string> translate(const std::vector<std::string>& lines,
                                     const TranslateOptions& options,
                                     const std::string& input_name = "input",
                                     std::size_t first_line = 1);

  /// BLEU of the translations of `src` against `refs`; DataError naming both counts if they
  /// differ, and what translate() throws.
  BleuScore evaluate(const std::vector<std::string>& src, const std::vector<std::string>& refs,
                     const TranslateOptions& options, const BleuOptions& bleu,
                     std::vector<std::string>* hyps = nullptr,
                     const std::string& src_name = "source");

  Transformer<float>& model() { return *model_; }
  const SubwordVocab& vocab() const { return vocab_; }
  Index max_len() const { return max_len_; }

 private:
  SubwordVocab vocab_;
  std::unique_ptr<Transformer<float>> model_;
  Index max_len_ = 0;
};

/// Averages `inputs` (model or training checkpoints of one configuration) into `output`, keeping
/// the first input's metadata minus its training state. Atomic: a failure leaves `output` alone.
void average_files(const std::vector<std::string>& inputs, const std::string& output);

/// Averages the last `n` checkpoints of `dir` into dir/model.safetensors; returns their paths.
std::vector<std::string> average_last(const std::string& dir, int n);

}  // namespace attn::translate
