#include "bpe.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <thread>
#include <unordered_map>

#include <attn/error.hpp>
#include <attn/strict_number.hpp>
#include <attn/train/atomic_file.hpp>
#include <attn/train/regular_file.hpp>

#include "text.hpp"

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

// The protobuf wire format, as far as the code below reads and writes it: a message is a sequence
// of fields, each a varint key (field number << 3 | wire type) and a value: a varint (type 0), 8
// bytes (1), a varint length and that many bytes (2), or 4 bytes (5).
bool read_varint(std::string_view& in, std::uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const auto byte = static_cast<unsigned char>(in.front());
    in.remove_prefix(1);
    value |= std::uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80u) == 0) return true;
  }
  return false;
}

void append_varint(std::string& out, std::uint64_t value) {
  for (; value >= 0x80u; value >>= 7) out += static_cast<char>((value & 0x7fu) | 0x80u);
  out += static_cast<char>(value);
}

/// One field of a message: its number, its wire type, its value if length-delimited (type 2), and
/// all of its bytes, key included.
struct WireField {
  std::uint64_t number = 0, type = 0;
  std::string_view value, bytes;
};

/// Calls visit(field) for each field of `message` in order, while it returns true. False if the
/// message is not well-formed wire format or a visit returned false.
template <class Visit>
bool for_each_field(std::string_view message, Visit visit) {
  while (!message.empty()) {
    const std::string_view start = message;
    std::uint64_t key = 0, value = 0;
    // protobuf reads a key as 32 bits and drops any above them: a key padded past them would
    // name another field here than there, and hide the map from the check below.
    if (!read_varint(message, key) || key > 0xffffffffu) return false;
    WireField f{key >> 3, key & 7u, {}, {}};
    std::size_t skip = f.type == 1 ? 8 : f.type == 5 ? 4 : 0;
    if (f.type == 0 && !read_varint(message, value)) return false;
    if (f.type == 2) {
      if (!read_varint(message, value) || value > message.size()) return false;
      skip = static_cast<std::size_t>(value);
      f.value = message.substr(0, skip);
    }
    if ((f.type != 0 && f.type != 1 && f.type != 2 && f.type != 5) || skip > message.size())
      return false;
    message.remove_prefix(skip);
    f.bytes = start.substr(0, start.size() - message.size());
    if (!visit(f)) return false;
  }
  return true;
}

/// The values of the length-delimited fields numbered `field` of `message`, in order; nothing if
/// the message is not well-formed wire format.
std::optional<std::vector<std::string_view>> length_delimited_fields(std::string_view message,
                                                                     std::uint64_t field) {
  std::vector<std::string_view> found;
  const bool ok = for_each_field(message, [&](const WireField& f) {
    if (f.type == 2 && f.number == field) found.push_back(f.value);
    return true;
  });
  if (!ok) return std::nullopt;
  return found;
}

/// The model sentencepiece trained, less the thread count its trainer ran on (ModelProto's
/// trainer_spec = 2, a TrainerSpec whose num_threads is field 16): a record of how the model was
/// made that encoding never reads, and that made --threads 1 and 2 write spm.model files, and so
/// vocabulary hashes in every model file, that differ.
std::string without_thread_count(const std::string& model) {
  std::string out;
  const bool ok = for_each_field(model, [&](const WireField& f) {
    if (f.number != 2 || f.type != 2) {
      out += f.bytes;
      return true;
    }
    std::string spec;
    const bool spec_ok = for_each_field(f.value, [&](const WireField& g) {
      if (g.number != 16) spec += g.bytes;
      return true;
    });
    append_varint(out, f.number << 3 | f.type);
    append_varint(out, spec.size());
    out += spec;
    return spec_ok;
  });
  ATTN_CHECK(ok, DataError,
             "sentencepiece's trainer returned a model that is not protobuf "
             "wire format (",
             model.size(), " bytes)");
  return out;
}

// sentencepiece 0.1.97 loads a model's precompiled character maps (ModelProto.normalizer_spec = 3
// and denormalizer_spec = 5, each a NormalizerSpec whose precompiled_charsmap is field 2) without
// checking them, and a crafted one made encoding read out of bounds (SIGSEGV). attn-translate
// trains with identity normalisation, which has none, so a model with one is refused. (Debian's
// libsentencepiece-dev ships no ModelProto header to read these fields through.)
void check_no_character_map(const std::string& bytes, const std::string& path) {
  constexpr const char* kNotWireFormat =
      "' is not a sentencepiece model: its bytes are not protobuf wire format";
  const auto specs = [&](std::uint64_t field) {
    auto found = length_delimited_fields(bytes, field);
    ATTN_CHECK(found.has_value(), FormatError, "'", path, kNotWireFormat);
    return *found;
  };
  for (const std::uint64_t field : {std::uint64_t{3}, std::uint64_t{5}})
    for (const std::string_view spec : specs(field)) {
      const auto maps = length_delimited_fields(spec, 2);
      ATTN_CHECK(maps.has_value(), FormatError, "'", path, kNotWireFormat);
      for (const std::string_view map : *maps)
        ATTN_CHECK(map.empty(), FormatError, "'", path, "': a sentencepiece model whose ",
                   field == 3 ? "normalizer" : "denormalizer", " has a precompiled character map (",
                   map.size(),
                   " bytes); attn-translate trains and reads models with identity "
                   "normalisation, which have none");
    }
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
  check_no_character_map(bytes, path);
  auto impl = std::make_unique<SubwordVocab::Impl>();
  const auto status = impl->sp.LoadFromSerializedProto(bytes);
  ATTN_CHECK(status.ok(), FormatError, "'", path,
             "' is not a sentencepiece model: ", status.ToString());
  const auto& sp = impl->sp;
  ATTN_CHECK(sp.pad_id() == SubwordVocab::kPad && sp.unk_id() == SubwordVocab::kUnk &&
                 sp.bos_id() == SubwordVocab::kBos && sp.eos_id() == SubwordVocab::kEos,
             FormatError, "'", path, "': expected special ids pad ", SubwordVocab::kPad, ", unk ",
             SubwordVocab::kUnk, ", bos ", SubwordVocab::kBos, ", eos ", SubwordVocab::kEos,
             ", found pad ", sp.pad_id(), ", unk ", sp.unk_id(), ", bos ", sp.bos_id(), ", eos ",
             sp.eos_id());
  impl->fingerprint = {sp.GetPieceSize(), stable_hash(bytes)};
  return impl;
}

SubwordVocab SubwordVocab::train(const std::vector<std::string>& sentences, const std::string& dir,
                                 const BpeTrainOptions& options) {
  ATTN_CHECK(!sentences.empty(), DataError, "cannot train a subword vocabulary on no sentences");
  ATTN_CHECK(options.vocab_size <= kMaxVocabSize, ConfigError, "a vocabulary of ",
             options.vocab_size, " subwords is more than the ", kMaxVocabSize, " one may have");
  // sentencepiece leaves out longer sentences, and with none left failed with "Internal: ...
  // [!sentences_.empty()]" (a 200 MB line without a line break).
  constexpr std::size_t kMaxSentenceBytes = 4192;  // TrainerSpec.max_sentence_length's default
  ATTN_CHECK(
      std::any_of(sentences.begin(), sentences.end(),
                  [](const std::string& s) { return !s.empty() && s.size() <= kMaxSentenceBytes; }),
      DataError, "every one of the ", sentences.size(),
      " training sentences is empty or longer than ", kMaxSentenceBytes,
      " bytes, the longest a subword vocabulary is trained on (is the text broken into "
      "lines?)");
  const std::unordered_map<std::string, std::string> args{
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"character_coverage", "1.0"},
      {"pad_id", std::to_string(kPad)},
      {"unk_id", std::to_string(kUnk)},
      {"bos_id", std::to_string(kBos)},
      {"eos_id", std::to_string(kEos)},
      // Identity normalisation keeps decode(encode(s)) == s, so BLEU sees the text as written.
      {"normalization_rule_name", "identity"},
      // Use every sentence in the given order: no sampling, so training is deterministic.
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"num_threads", std::to_string(std::clamp(options.num_threads, 1, kMaxBpeThreads))},
      {"minloglevel", "2"},
  };
  VectorIterator it(sentences);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
  ATTN_CHECK(status.ok(), DataError, "sentencepiece BPE training (vocab_size ", options.vocab_size,
             ", ", sentences.size(), " sentences) failed: ", status.ToString());
  model = without_thread_count(model);
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

std::vector<TokenId> SubwordVocab::sample_encode(std::string_view text, double dropout) const {
  ATTN_CHECK(dropout >= 0 && dropout < 1, ConfigError, "BPE-dropout must be in [0, 1), got ",
             dropout);
  if (dropout == 0) return encode(text);
  std::vector<int> ids;
  // nbest_size is ignored for BPE models; alpha is the probability of dropping a merge.
  const auto status = impl_->sp.SampleEncode(text, -1, static_cast<float>(dropout), &ids);
  ATTN_CHECK(status.ok(), DataError, "cannot encode '", text, "': ", status.ToString());
  return {ids.begin(), ids.end()};
}

void SubwordVocab::with_sampling_seed(std::uint64_t seed, const std::function<void()>& encode_all) {
  // sentencepiece takes its default seed, ~0u, as "draw one from std::random_device".
  constexpr std::uint32_t kRandomDevice = ~std::uint32_t{0};
  std::uint32_t seed32 = static_cast<std::uint32_t>(seed ^ (seed >> 32));
  if (seed32 == kRandomDevice) seed32 = 0;
  static std::mutex one_at_a_time;
  const std::lock_guard<std::mutex> lock(one_at_a_time);
  sentencepiece::SetRandomGeneratorSeed(seed32);
  std::exception_ptr failure;
  std::thread worker([&] {
    try {
      encode_all();
    } catch (...) {
      failure = std::current_exception();
    }
  });
  worker.join();
  if (failure) std::rethrow_exception(failure);
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
