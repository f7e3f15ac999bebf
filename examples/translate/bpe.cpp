#include "bpe.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <optional>
#include <sstream>
#include <unordered_map>

#include <attn/error.hpp>
#include <attn/strict_number.hpp>
#include <attn/train/atomic_file.hpp>
#include <attn/train/regular_file.hpp>

#include "gettext_corpus.hpp"  // stable_hash

namespace attn::translate {
namespace {

constexpr const char* kModelFile = "spm.model";
constexpr const char* kInfoFile = "vocab.txt";
// The largest files the readers take: a sentencepiece model of 37,000 pieces is about 1 MB (one
// of a million pieces some 30 MB); vocab.txt is three short lines.
constexpr std::size_t kMaxModelBytes = std::size_t{256} << 20;
constexpr std::size_t kMaxInfoBytes = 4096;
constexpr const char* kInfoMagic = "attn-translate-vocab";

class VectorIterator : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& lines_;
  std::size_t i_ = 0;
};

std::string path_in(const std::string& dir, const char* file) {
  return (std::filesystem::path(dir) / file).string();
}

// Atomic: a full disk or a kill leaves the old file (or none), never a partial spm.model.
void write_file(const std::string& path, const std::string& bytes) {
  write_file_atomically(path, bytes);
}

std::string describe(const VocabFingerprint& f) {
  return detail::concat("size ", f.size, ", spm.model hash ", hex16(f.hash));
}

}  // namespace

struct SubwordVocab::Impl {
  sentencepiece::SentencePieceProcessor sp;
  VocabFingerprint fingerprint;
};

SubwordVocab::SubwordVocab(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SubwordVocab::SubwordVocab(SubwordVocab&&) noexcept = default;
SubwordVocab& SubwordVocab::operator=(SubwordVocab&&) noexcept = default;
SubwordVocab::~SubwordVocab() = default;

std::unique_ptr<SubwordVocab::Impl> SubwordVocab::from_bytes(const std::string& bytes,
                                                             const std::string& path) {
  auto impl = std::make_unique<SubwordVocab::Impl>();
  const auto status = impl->sp.LoadFromSerializedProto(bytes);
  ATTN_CHECK(status.ok(), FormatError, "'", path,
             "' is not a sentencepiece model: ", status.ToString());
  const auto& sp = impl->sp;
  ATTN_CHECK(sp.pad_id() == SubwordVocab::kPad && sp.unk_id() == SubwordVocab::kUnk &&
                 sp.bos_id() == SubwordVocab::kBos && sp.eos_id() == SubwordVocab::kEos,
             FormatError, "'", path,
             "': expected special ids pad 0, unk 1, bos 2, eos 3, found pad ", sp.pad_id(),
             ", unk ", sp.unk_id(), ", bos ", sp.bos_id(), ", eos ", sp.eos_id());
  impl->fingerprint = {sp.GetPieceSize(), stable_hash(bytes)};
  return impl;
}

SubwordVocab SubwordVocab::train(const std::vector<std::string>& sentences, const std::string& dir,
                                 const BpeTrainOptions& options) {
  ATTN_CHECK(!sentences.empty(), DataError, "cannot train a subword vocabulary on no sentences");
  ATTN_CHECK(options.vocab_size <= kMaxVocabSize, ConfigError, "a vocabulary of ",
             options.vocab_size, " subwords is more than the ", kMaxVocabSize, " one may have");
  const std::unordered_map<std::string, std::string> args{
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"character_coverage", "1.0"},
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
      // Identity normalisation keeps decode(encode(s)) == s, so BLEU sees the text as written.
      {"normalization_rule_name", "identity"},
      // Use every sentence in the given order: no sampling, so training is deterministic.
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", std::to_string(options.num_threads)},
      {"minloglevel", "2"},
  };
  VectorIterator it(sentences);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  ATTN_CHECK(status.ok(), DataError, "sentencepiece BPE training (vocab_size ", options.vocab_size,
             ", ", sentences.size(), " sentences) failed: ", status.ToString());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ATTN_CHECK(!ec, IOError, "cannot create directory '", dir, "': ", ec.message());
  const std::string model_path = path_in(dir, kModelFile);
  auto impl = from_bytes(model, model_path);
  write_file(model_path, model);
  write_file(path_in(dir, kInfoFile),
             detail::concat(kInfoMagic, " 1\nsize ", impl->fingerprint.size, "\nhash ",
                            hex16(impl->fingerprint.hash), "\n"));
  return SubwordVocab(std::move(impl));
}

VocabFingerprint read_vocab_fingerprint(const std::string& dir) {
  const std::string path = path_in(dir, kInfoFile);
  std::istringstream in(read_regular_file(path, kMaxInfoBytes));
  std::string magic, size_key, hash_key, hash_hex;
  int version = 0;
  VocabFingerprint f;
  std::string size_text;
  in >> magic >> version >> size_key >> size_text >> hash_key >> hash_hex;
  ATTN_CHECK(in && magic == kInfoMagic && version == 1 && size_key == "size" && hash_key == "hash",
             FormatError, "'", path, "': expected \"", kInfoMagic,
             " 1\" followed by \"size N\" and \"hash HEX\" lines");
  // Strictly: istream >> int and stoull took "-5" as a size and "-1" as the hash 2^64-1.
  const std::optional<int> size = parse_number<int>(size_text);
  ATTN_CHECK(size && *size > 0, FormatError, "'", path, "': size '", size_text,
             "' is not a positive integer");
  f.size = *size;
  const std::optional<std::uint64_t> hash = parse_hex<std::uint64_t>(hash_hex);
  ATTN_CHECK(hash.has_value(), FormatError, "'", path, "': hash '", hash_hex,
             "' is not hexadecimal");
  f.hash = *hash;
  std::string rest;
  ATTN_CHECK(!(in >> rest), FormatError, "'", path, "': unexpected '", rest,
             "' after the hash line");
  return f;
}

SubwordVocab SubwordVocab::load(const std::string& dir) {
  const std::string model_path = path_in(dir, kModelFile);
  SubwordVocab vocab(from_bytes(read_regular_file(model_path, kMaxModelBytes), model_path));
  vocab.check_directory(dir);
  return vocab;
}

void SubwordVocab::check_directory(const std::string& dir) const {
  const VocabFingerprint stored = read_vocab_fingerprint(dir);
  ATTN_CHECK(stored == impl_->fingerprint, FormatError, "model directory '", dir,
             "' was trained with a different vocabulary: its vocab.txt says ", describe(stored),
             ", this vocabulary has ", describe(impl_->fingerprint));
}

std::vector<TokenId> SubwordVocab::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  ATTN_CHECK(status.ok(), DataError, "cannot encode '", text, "': ", status.ToString());
  return {ids.begin(), ids.end()};
}

std::vector<TokenId> encode_source(const SubwordVocab& vocab, std::string_view line, Index max_len,
                                   const std::string& where) {
  ATTN_CHECK(!too_long_to_encode(line, max_len), DataError, where, " has ", line.size(),
             " bytes, more than the ", kMaxBytesPerToken,
             " per subword token of the model's max_len ", max_len,
             " (the longest it was trained on); it is refused without encoding it");
  std::vector<TokenId> ids = vocab.encode(line);
  ATTN_CHECK(static_cast<Index>(ids.size()) <= max_len, DataError, where, " has ", ids.size(),
             " subword tokens, more than the model's max_len ", max_len,
             " (the longest it was trained on)");
  return ids;
}

std::string SubwordVocab::decode(const std::vector<TokenId>& ids) const {
  const int n = size();
  for (TokenId id : ids)
    ATTN_CHECK(id >= 0 && id < n, IndexError, "decode: token id ", id,
               " is outside the vocabulary [0, ", n, ")");
  std::string text;
  const auto status = impl_->sp.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  ATTN_CHECK(status.ok(), DataError, "cannot decode: ", status.ToString());
  return text;
}

std::vector<std::string> SubwordVocab::pieces(const std::vector<TokenId>& ids) const {
  std::vector<std::string> out;
  out.reserve(ids.size());
  const int n = size();
  for (TokenId id : ids) {
    ATTN_CHECK(id >= 0 && id < n, IndexError, "pieces: token id ", id,
               " is outside the vocabulary [0, ", n, ")");
    out.push_back(impl_->sp.IdToPiece(id));
  }
  return out;
}

int SubwordVocab::size() const { return impl_->fingerprint.size; }
VocabFingerprint SubwordVocab::fingerprint() const { return impl_->fingerprint; }

}  // namespace attn::translate
