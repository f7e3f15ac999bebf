// The shared English+German subword vocabulary: a sentencepiece BPE model trained on both sides
// of the training corpus, stored as <dir>/spm.model beside the model it belongs to.
//
// Ids: pad 0, unk 1, bos 2, eos 3, as the batching and the decoder assume. A model directory
// also gets <dir>/vocab.txt with the vocabulary size and a hash of spm.model, so a checkpoint is
// never paired with a vocabulary it was not trained with.
#pragma once

#include <cstdint>
#include <functional>
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

/// The most threads sentencepiece's trainer takes (it refuses more with an internal error).
inline constexpr int kMaxBpeThreads = 128;

struct BpeTrainOptions {
  int vocab_size = 8000;
  int num_threads = 2;  // taken as at most kMaxBpeThreads; not stored in spm.model
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
  /// BPE-dropout (Provilkov et al., 2020, "BPE-Dropout: Simple and Effective Subword
  /// Regularization"): `text` encoded with each merge skipped with probability `dropout`, so that
  /// a word may come out in smaller pieces; decode() still gives `text`. 0 is encode(); `dropout`
  /// must be in [0, 1) (ConfigError). The draws come from sentencepiece's generator of the calling
  /// thread: inside with_sampling_seed they are a function of its seed alone.
  std::vector<TokenId> sample_encode(std::string_view text, double dropout) const;
  /// Runs `encode_all` in a new thread and waits for it, rethrowing what it throws. sentencepiece
  /// seeds each thread's generator from a process-wide seed when the thread first draws, so the
  /// sample_encode calls of `encode_all`, in a fixed order, give the same pieces for the same
  /// `seed` on every run, and on every machine with the same sentencepiece and C++ library (its
  /// draws go through std::uniform_real_distribution). One such run at a time in the process (a
  /// lock: `encode_all` must not call it again). The seed stays set afterwards (sentencepiece has
  /// no way back to its default), so later draws in new threads are not seeded at random.
  static void with_sampling_seed(std::uint64_t seed, const std::function<void()>& encode_all);
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

/// Bytes of text per subword token beyond which a line is not encoded. sentencepiece's encoder
/// takes about 230 bytes of memory per byte of the line (a 10 MB line took 2.3 GB), so a line is
/// measured before it is encoded. A piece is at most 16 characters, 64 bytes of UTF-8: a line of
/// more than 64 * max_len bytes has more than max_len tokens unless the normalizer drops most of
/// it (runs of spaces, control characters) or it is a run of characters the vocabulary lacks
/// (which becomes one <unk>). Such lines are treated as too long.
inline constexpr Index kMaxBytesPerToken = 64;

/// Whether `text` is longer than kMaxBytesPerToken * max_tokens bytes (then it is not encoded).
inline bool too_long_to_encode(std::string_view text, Index max_tokens) {
  return static_cast<Index>(text.size()) > kMaxBytesPerToken * max_tokens;
}

/// Encodes a source line for a model trained on at most `max_len` tokens per side. Throws
/// DataError naming `where` (e.g. "'in.txt' line 3") if the line has more than max_len tokens or,
/// before encoding it, if too_long_to_encode(line, max_len).
std::vector<TokenId> encode_source(const SubwordVocab& vocab, std::string_view line, Index max_len,
                                   const std::string& where);

}  // namespace attn::translate
