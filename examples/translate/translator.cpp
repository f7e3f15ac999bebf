#include "translator.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>

#include <attn/strict_number.hpp>
#include <attn/train/averaging.hpp>
#include <attn/train/checkpoint.hpp>
#include <attn/train/model_file.hpp>

#include "corpus_io.hpp"

namespace attn::translate {

namespace {

/// Throws FormatError if `m` names a vocabulary other than `vocab`.
void check_vocab_metadata(const std::map<std::string, std::string>& m, const SubwordVocab& vocab,
                          const std::string& file) {
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

std::vector<std::vector<TokenId>> translate_ids(Transformer<float>& model,
                                                const std::vector<std::vector<TokenId>>& sources,
                                                const TranslateOptions& options) {
  ATTN_CHECK(options.batch_size >= 1, ConfigError, "batch size must be >= 1, got ",
             options.batch_size);
  std::vector<std::vector<TokenId>> out(sources.size());
  // Sorting by length keeps padding (and wasted decoder steps) small within each batch.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < sources.size(); ++i)
    if (!sources[i].empty()) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return sources[a].size() < sources[b].size();
  });
  DecodeOptions dec;
  dec.bos = SubwordVocab::kBos;
  dec.eos = SubwordVocab::kEos;
  dec.beam_size = options.beam;
  dec.length_penalty = options.alpha;
  dec.max_extra_length = options.max_extra_length;
  dec.validate(model.config().tgt_vocab,
               model.config().pad_id);  // before any work, and also when every line is empty
  const TokenId pad = model.config().pad_id;
  for (std::size_t begin = 0; begin < order.size();
       begin += static_cast<std::size_t>(options.batch_size)) {
    const std::size_t end =
        std::min(order.size(), begin + static_cast<std::size_t>(options.batch_size));
    Index S = 0;
    for (std::size_t k = begin; k < end; ++k)
      S = std::max<Index>(S, static_cast<Index>(sources[order[k]].size()));
    Tensor<TokenId> src = Tensor<TokenId>::full({static_cast<Index>(end - begin), S}, pad);
    for (std::size_t k = begin; k < end; ++k) {
      const auto& s = sources[order[k]];
      for (std::size_t j = 0; j < s.size(); ++j)
        src(static_cast<Index>(k - begin), static_cast<Index>(j)) = s[j];
    }
    auto hyps = options.greedy ? greedy_decode(model, src, dec) : beam_search(model, src, dec);
    for (std::size_t k = begin; k < end; ++k) out[order[k]] = std::move(hyps[k - begin]);
  }
  return out;
}

namespace {

Index parse_max_len(const std::map<std::string, std::string>& m, const std::string& file) {
  auto it = m.find(kMaxLenKey);
  ATTN_CHECK(it != m.end(), FormatError, file, " lacks metadata ", kMaxLenKey);
  const Index v =
      parse_number_or_throw<Index>(it->second, file, std::string("metadata ") + kMaxLenKey);
  ATTN_CHECK(v >= 1 && v <= kMaxTranslateLength, FormatError, file, ": metadata ", kMaxLenKey,
             " = ", v, " is outside [1, ", kMaxTranslateLength, "]");
  return v;
}

}  // namespace

Translator::Translator(const std::string& dir) : vocab_(SubwordVocab::load(dir)) {
  vocab_.check_directory(dir);
  const std::string file = model_file(dir);
  const SafetensorsFile weights = load_safetensors(file);
  // Every value of the metadata is checked before the model it describes is built.
  const TransformerConfig config = model_config(weights, vocab_);
  max_len_ = parse_max_len(weights.metadata(), file);
  model_ = std::make_unique<Transformer<float>>(config);
  load_model(weights, model_->parameters(), LoadOptions{kTrainingStatePrefixes});
  check_finite_parameters(model_->parameters(), file);
  model_->eval();
}

std::vector<std::string> Translator::translate(const std::vector<std::string>& lines,
                                               const TranslateOptions& options,
                                               const std::string& input_name,
                                               std::size_t first_line) {
  // Every line is checked before the first is decoded, so a bad line costs no decoding time.
  std::vector<std::vector<TokenId>> ids(lines.size());
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::size_t bad = find_invalid_utf8(lines[i]);
    ATTN_CHECK(bad == std::string::npos, DataError, input_name, " line ", first_line + i,
               ": expected UTF-8 text, found an invalid byte sequence at byte offset ", bad);
    ids[i] = encode_source(vocab_, lines[i], max_len_,
                           detail::concat(input_name, " line ", first_line + i));
  }
  const auto out = translate_ids(*model_, ids, options);
  std::vector<std::string> text(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) text[i] = vocab_.decode(out[i]);
  return text;
}

BleuScore Translator::evaluate(const std::vector<std::string>& src,
                               const std::vector<std::string>& refs,
                               const TranslateOptions& options, const BleuOptions& bleu,
                               std::vector<std::string>* hyps, const std::string& src_name) {
  ATTN_CHECK(src.size() == refs.size(), DataError,
             "evaluate: expected one reference per source "
             "line, got ",
             src.size(), " source lines and ", refs.size(), " reference lines");
  std::vector<std::string> out = translate(src, options, src_name);
  BleuScore score = corpus_bleu(out, refs, bleu);
  if (hyps) *hyps = std::move(out);
  return score;
}

namespace {

/// NumericError unless every value of the average in `params` is finite, naming the parameter,
/// the element and the first of `inputs` that holds a non-finite value there: the mean of finite
/// floats, summed in double, is finite, so one of them does. A model with a NaN weight is refused
/// by translate and --resume; average used to write one without a word.
void check_finite_average(const std::vector<NamedParameter<float>>& params,
                          const std::vector<std::string>& inputs, const std::string& output) {
  for (const auto& p : params) {
    const float* avg = p.value.data();
    Index bad = 0;
    while (bad < p.value.numel() && std::isfinite(avg[bad])) ++bad;
    if (bad == p.value.numel()) continue;
    std::string source = "no input holds one there";
    for (const std::string& input : inputs) {
      const float x = load_safetensors(input).tensor<float>(p.name).data()[bad];
      if (std::isfinite(x)) continue;
      source = detail::concat(input, " holds ", x, " there");
      break;
    }
    throw NumericError(detail::concat("average: not writing ", output, ": parameter ", p.name,
                                      " of the average is ", avg[bad], " at element ", bad, " (",
                                      source, ")"));
  }
}

}  // namespace

void average_files(const std::vector<std::string>& inputs, const std::string& output) {
  ATTN_CHECK(!inputs.empty(), ConfigError, "average: no input checkpoints given");
  // The model, its vocabulary and its translation settings: the same in every input, and the
  // only metadata kept (not the training state, step, RNG and data position, of one checkpoint).
  const std::vector<std::string> model_metadata{"config.", "vocab.", "translate."};
  TransformerConfig config;
  std::map<std::string, std::string> keep;
  {  // released before the average reads the inputs: one checkpoint in memory at a time, not two
    const SafetensorsFile first = load_safetensors(inputs.front());
    config = config_from_model_file(first);
    keep = attn::detail::metadata_with_prefixes(first.metadata(), model_metadata);
  }
  Transformer<float> model(config);
  average_checkpoints(inputs, model.parameters(), LoadOptions{kTrainingStatePrefixes},
                      model_metadata);
  check_finite_average(model.parameters(), inputs, output);
  keep["averaged_from"] = std::to_string(inputs.size());
  save_model(output, model, keep);
}

std::vector<std::string> average_last(const std::string& dir, int n) {
  ATTN_CHECK(n >= 1, ConfigError, "average: --last must be >= 1, got ", n);
  // A trainer at work in `dir` removes its oldest checkpoint as it writes a new one, so one listed
  // here may be gone when it is read (13 of 70 runs against a trainer saving every update): then
  // the checkpoints are listed again.
  constexpr int kListings = 10;
  for (int listing = 1;; ++listing) {
    const auto ckpts = list_checkpoints(dir);
    ATTN_CHECK(static_cast<std::size_t>(n) <= ckpts.size(), ConfigError,
               "average: asked for the last ", n, " checkpoints but '", dir, "' has ",
               ckpts.size());
    std::vector<std::string> paths;
    for (std::size_t i = ckpts.size() - static_cast<std::size_t>(n); i < ckpts.size(); ++i)
      paths.push_back(ckpts[i].second);
    try {
      average_files(paths, final_model_path(dir));
      return paths;
    } catch (const IOError&) {
      const auto gone = [](const std::string& p) {
        std::error_code ec;
        return !std::filesystem::exists(p, ec) && !ec;
      };
      if (listing == kListings || std::none_of(paths.begin(), paths.end(), gone)) throw;
    }
  }
}

}  // namespace attn::translate
