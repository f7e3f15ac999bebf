// Loading a trained model directory and translating with it: the inference half of attn-translate.
//
// A model directory (model_dir.hpp) holds spm.model + vocab.txt (the shared subword vocabulary)
// and either model.safetensors (final or averaged weights) or training checkpoints
// checkpoint_<step>.safetensors; the model's configuration travels in each file's metadata
// (model_metadata.hpp), so a directory is self-describing. Averaging checkpoints into one model
// file is model_average.hpp's.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <attn/decode/options.hpp>
#include <attn/nn/transformer.hpp>

#include "bleu.hpp"
#include "bpe.hpp"

namespace attn::translate {

/// How attn-translate decodes: the library's DecodeOptions under the flags' names (their defaults
/// are the library's), with the token ids left to the vocabulary, plus greedy or beam and the
/// batch.
struct TranslateOptions {
  bool greedy = false;
  Index beam = DecodeOptions{}.beam_size;
  double alpha = DecodeOptions{}.length_penalty;
  /// Whether `alpha` was asked for (--alpha): if not, Translator decodes with the length penalty
  /// stored in the model file (decode.alpha, written by `attn-translate select`), if any.
  bool alpha_given = false;
  Index batch_size = 32;  ///< sentences per decoder batch
  Index max_extra_length = DecodeOptions{}.max_extra_length;

  /// These as the library's DecodeOptions, with SubwordVocab's BOS and EOS.
  DecodeOptions decode_options() const;
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
  /// The vocabulary of `dir` with the weights of the file `weights` (a checkpoint of `dir`).
  Translator(const std::string& dir, const std::string& weights);

  /// FormatError naming `path` unless it is a model file or checkpoint of this model: the same
  /// vocabulary, the same model metadata (kModelMetadataPrefixes) to the byte, as
  /// average_checkpoints asks, and tensors of the parameters' shapes (only its header is read).
  void check_same_model(const std::string& path) const;

  /// Replaces the weights with the mean of the checkpoints `paths` (average_checkpoints), the
  /// first checked by check_same_model and the others held to it: FormatError naming the first
  /// that differs, NumericError if the mean holds a non-finite value. The model file's
  /// decode.alpha no longer applies. Lets `select` score averages without writing them.
  void load_average(const std::vector<std::string>& paths);

  /// One output line per input line. An empty line gives an empty line. Before any decoding,
  /// throws DataError naming `input_name`, the (1-based) line and the problem if a line is not
  /// valid UTF-8 (with the byte offset) or is longer than the model's max_len (with its length
  /// in subword tokens and the limit). `first_line` numbers lines[0] in those messages (a
  /// stream translated line by line).
  std::vector<std::string> translate(const std::vector<std::string>& lines,
                                     const TranslateOptions& options,
                                     const std::string& input_name = "input",
                                     std::size_t first_line = 1);
  /// translate(), each output line handed to `sink` in order, the lines decoded kChunkLines at a
  /// time: a line's subword ids and output ids are held while its chunk is decoded only. Every
  /// line is checked before the first is decoded all the same.
  void translate_each(const std::vector<std::string>& lines, const TranslateOptions& options,
                      const std::string& input_name,
                      const std::function<void(std::string&&)>& sink);
  /// Lines per chunk of translate_each: sorted by length within it into batches, as many as make
  /// full batches of similar lengths, while 2^26 lines (the most an input file may have) took
  /// about 112 bytes each all at once besides their text, 7.5 GB.
  static constexpr std::size_t kChunkLines = 1 << 16;

  /// BLEU of the translations of `src` against `refs`; DataError naming both counts if they
  /// differ, and what translate() throws.
  BleuScore evaluate(const std::vector<std::string>& src, const std::vector<std::string>& refs,
                     const TranslateOptions& options, const BleuOptions& bleu,
                     std::vector<std::string>* hyps = nullptr,
                     const std::string& src_name = "source");

  Transformer<float>& model() { return *model_; }
  const SubwordVocab& vocab() const { return vocab_; }
  Index max_len() const { return max_len_; }
  /// The model file's decode.alpha, if it has one.
  std::optional<double> stored_alpha() const { return alpha_; }
  /// `options` as translate() decodes with them: the stored alpha unless options.alpha_given.
  TranslateOptions resolve(TranslateOptions options) const {
    if (!options.alpha_given && alpha_) options.alpha = *alpha_;
    return options;
  }

 private:
  /// The subword ids of lines first[0, n), each checked (translate()'s DataError).
  std::vector<std::vector<TokenId>> encode_lines(const std::string* first, std::size_t n,
                                                 const std::string& input_name,
                                                 std::size_t first_line) const;

  SubwordVocab vocab_;
  std::unique_ptr<Transformer<float>> model_;
  Index max_len_ = 0;
  std::optional<double> alpha_;
  std::string file_;                             ///< the weights loaded at construction
  std::map<std::string, std::string> identity_;  ///< their model metadata

  /// Builds the model that `file` describes and loads its weights, every field checked first.
  void load_weights(const std::string& file);
};

}  // namespace attn::translate
