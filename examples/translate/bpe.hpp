// The shared English+German subword vocabulary: a sentencepiece BPE model trained on both sides
// of the training corpus, stored as <dir>/spm.model beside the model it belongs to.
//
// Ids: pad 0, unk 1, bos 2, eos 3, as the batching and the decoder assume. A model directory
// also gets <dir>/vocab.txt with the vocabulary size and a hash of spm.model, so a checkpoint is
// never paired with a vocabulary it was not trained with.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <attn/tensor.hpp>

namespace attn::translate {

/// What identifies a vocabulary: its size and the FNV-1a hash of the serialized spm model.
struct VocabFingerprint {
  int size = 0;
  std::uint64_t hash = 0;
  friend bool operator==(const VocabFingerprint& a, const VocabFingerprint& b) {
    return a.size == b.size && a.hash == b.hash;
  }
  friend bool operator!=(const VocabFingerprint& a, const VocabFingerprint& b) { return !(a == b); }
};

/// The largest vocabulary SubwordVocab trains: its spm.model (a piece is at most 16 characters,
/// under 80 bytes with its score and type) then stays within what SubwordVocab::load reads
/// (256 MiB).
inline constexpr int kMaxVocabSize = 1 << 21;

struct BpeTrainOptions {
  int vocab_size = 8000;
  int num_threads = 2;
};

class SubwordVocab {
 public:
  static constexpr TokenId kPad = 0;
  static constexpr TokenId kUnk = 1;
  static constexpr TokenId kBos = 2;
  static constexpr TokenId kEos = 3;

  /// Trains on `sentences` (pass source and target sentences together), writes <dir>/spm.model
  /// and <dir>/vocab.txt (creating dir) and returns the loaded vocabulary. Deterministic for the
  /// same sentences and options. Throws DataError if sentencepiece rejects the data (e.g. a
  /// vocabulary larger than the text supports), IOError if the files cannot be written.
  static SubwordVocab train(const std::vector<std::string>& sentences, const std::string& dir,
                            const BpeTrainOptions& options = {});

  /// Loads <dir>/spm.model and checks it against <dir>/vocab.txt. Throws IOError if either is
  /// missing, FormatError if spm.model is not a sentencepiece model, has other special ids, or
  /// does not match vocab.txt.
  static SubwordVocab load(const std::string& dir);

  SubwordVocab(SubwordVocab&&) noexcept;
  SubwordVocab& operator=(SubwordVocab&&) noexcept;
  ~SubwordVocab();

  std::vector<TokenId> encode(std::string_view text) const;
  /// Pad, bos and eos decode to nothing; ids outside the vocabulary throw IndexError.
  std::string decode(const std::vector<TokenId>& ids) const;
  /// The subword strings of `ids` (for attention plots).
  std::vector<std::string> pieces(const std::vector<TokenId>& ids) const;
  int size() const;
  VocabFingerprint fingerprint() const;

  /// Throws FormatError "model directory was trained with a different vocabulary" naming both
  /// fingerprints if <dir>/vocab.txt describes another vocabulary; IOError if it is missing.
  void check_directory(const std::string& dir) const;

 private:
  struct Impl;
  explicit SubwordVocab(std::unique_ptr<Impl> impl);
  static std::unique_ptr<Impl> from_bytes(const std::string& bytes, const std::string& path);
  std::unique_ptr<Impl> impl_;
};

/// Reads <dir>/vocab.txt. Throws IOError if missing, FormatError if malformed.
VocabFingerprint read_vocab_fingerprint(const std::string& dir);

}  // namespace attn::translate
