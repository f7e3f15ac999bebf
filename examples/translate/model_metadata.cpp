#include "model_metadata.hpp"

#include <cstdint>
#include <optional>

#include <attn/strict_number.hpp>
#include <attn/train/model_file.hpp>

namespace attn::translate {

namespace {

/// Throws FormatError if `m` names a vocabulary other than `vocab`.
void check_vocab_metadata(const Metadata& m, const SubwordVocab& vocab, const std::string& file) {
  auto size = m.find(kVocabSizeKey), hash = m.find(kVocabHashKey);
  ATTN_CHECK(size != m.end() && hash != m.end(), FormatError, file, " lacks the ", kVocabSizeKey,
             " / ", kVocabHashKey, " metadata of the vocabulary it was trained with");
  const VocabFingerprint fp = vocab.fingerprint();
  if (size->second == std::to_string(fp.size) && hash->second == std::to_string(fp.hash)) return;
  // The metadata holds the hash in decimal; vocab.txt and its messages show it in hex.
  const std::optional<std::uint64_t> stored = parse_number<std::uint64_t>(hash->second);
  const std::string stored_hash = stored ? hex16(*stored) : hash->second;
  throw FormatError(detail::concat(file, " was trained with a different vocabulary: expected the ",
                                   "directory's size ", fp.size, ", spm.model hash ",
                                   hex16(fp.hash), ", found size ", size->second,
                                   ", spm.model hash ", stored_hash));
}

}  // namespace

void store_vocab_metadata(const SubwordVocab& vocab, Metadata& m) {
  const VocabFingerprint fp = vocab.fingerprint();
  m[kVocabSizeKey] = std::to_string(fp.size);
  m[kVocabHashKey] = std::to_string(fp.hash);
}

LoadOptions model_file_options(const std::vector<NamedParameter<float>>& params) {
  std::size_t bytes = 0;
  for (const auto& p : params) bytes += static_cast<std::size_t>(p.value.numel()) * sizeof(float);
  return LoadOptions{kTrainingStatePrefixes, false, 2 * bytes};
}

TransformerConfig model_config(const SafetensorsFile& file, const SubwordVocab& vocab) {
  check_vocab_metadata(file.metadata(), vocab, file.path());
  const TransformerConfig c = config_from_model_file(file);
  const Index V = vocab.size();
  ATTN_CHECK(c.src_vocab == V && c.tgt_vocab == V, FormatError, file.path(),
             ": metadata config.src_vocab = ", c.src_vocab, " and config.tgt_vocab = ", c.tgt_vocab,
             ", expected both to be the vocabulary's size, ", V);
  ATTN_CHECK(c.pad_id == SubwordVocab::kPad, FormatError, file.path(),
             ": metadata config.pad_id = ", c.pad_id, ", expected the vocabulary's pad id, ",
             SubwordVocab::kPad);
  return c;
}

Index model_max_len(const SafetensorsFile& file) {
  const Metadata& m = file.metadata();
  const std::string& path = file.path();
  auto it = m.find(kMaxLenKey);
  ATTN_CHECK(it != m.end(), FormatError, path, " lacks metadata ", kMaxLenKey);
  const Index v =
      parse_number_or_throw<Index>(it->second, path, std::string("metadata ") + kMaxLenKey);
  ATTN_CHECK(v >= 1 && v <= kMaxTranslateLength, FormatError, path, ": metadata ", kMaxLenKey,
             " = ", v, " is outside [1, ", kMaxTranslateLength, "]");
  return v;
}

std::optional<double> model_alpha(const SafetensorsFile& file) {
  const auto it = file.metadata().find(kAlphaKey);
  if (it == file.metadata().end()) return std::nullopt;
  const auto alpha =
      parse_number_or_throw<double>(it->second, file.path(), std::string("metadata ") + kAlphaKey);
  ATTN_CHECK(alpha >= 0, FormatError, file.path(), ": metadata ", kAlphaKey, " = ", alpha,
             ", expected a length penalty >= 0");
  return alpha;
}

}  // namespace attn::translate
