#include "translator.hpp"

#include <algorithm>

#include <attn/decode/beam_search.hpp>
#include <attn/decode/greedy.hpp>
#include <attn/train/averaging.hpp>
#include <attn/train/checkpoint.hpp>
#include <attn/train/model_file.hpp>
#include <attn/train/safetensors.hpp>

#include "model_dir.hpp"  // model_file
#include "model_metadata.hpp"
#include "text.hpp"

namespace attn::translate {

DecodeOptions TranslateOptions::decode_options() const {
  DecodeOptions d;
  d.bos = SubwordVocab::kBos;
  d.eos = SubwordVocab::kEos;
  d.beam_size = beam;
  d.length_penalty = alpha;
  d.max_extra_length = max_extra_length;
  return d;
}

namespace {

// The batches translate_ids decodes: the non-empty sources in `order` (by length, so that padding
// and wasted decoder steps stay small within each batch), batch_size at a time, and each batch's
// longest source.
struct DecodeBatches {
  std::vector<std::size_t> order;
  std::vector<Index> longest;
};

// The batches of `sources`, each checked before any is decoded, with the options: a batch that
// cannot be decoded is refused before the hours the others take, not after them.
DecodeBatches plan_batches(const Transformer<float>& model,
                           const std::vector<std::vector<TokenId>>& sources,
                           const TranslateOptions& options) {
  ATTN_CHECK(options.batch_size >= 1, ConfigError, "batch size must be >= 1, got ",
             options.batch_size);
  // Also when every line is empty.
  options.decode_options().validate(model.config().tgt_vocab, model.config().pad_id);
  DecodeBatches b;
  for (std::size_t i = 0; i < sources.size(); ++i)
    if (!sources[i].empty()) b.order.push_back(i);
  std::stable_sort(b.order.begin(), b.order.end(), [&](std::size_t x, std::size_t y) {
    return sources[x].size() < sources[y].size();
  });
  const auto batch = static_cast<std::size_t>(options.batch_size);
  for (std::size_t begin = 0; begin < b.order.size(); begin += batch) {
    const std::size_t end = std::min(b.order.size(), begin + batch);
    b.longest.push_back(static_cast<Index>(sources[b.order[end - 1]].size()));
    detail::check_decode_memory(model.config(), static_cast<Index>(end - begin), !options.greedy,
                                options.beam, b.longest.back(),
                                b.longest.back() + options.max_extra_length, sizeof(float),
                                "lower --batch-size, --beam or --max-extra-length");
  }
  return b;
}

}  // namespace

std::vector<std::vector<TokenId>> translate_ids(Transformer<float>& model,
                                                const std::vector<std::vector<TokenId>>& sources,
                                                const TranslateOptions& options) {
  const DecodeBatches b = plan_batches(model, sources, options);
  const DecodeOptions dec = options.decode_options();
  const auto batch = static_cast<std::size_t>(options.batch_size);
  const TokenId pad = model.config().pad_id;
  std::vector<std::vector<TokenId>> out(sources.size());
  for (std::size_t begin = 0; begin < b.order.size(); begin += batch) {
    const std::size_t end = std::min(b.order.size(), begin + batch);
    const Index S = b.longest[begin / batch];
    Tensor<TokenId> src = Tensor<TokenId>::full({static_cast<Index>(end - begin), S}, pad);
    for (std::size_t k = begin; k < end; ++k) {
      const auto& s = sources[b.order[k]];
      for (std::size_t j = 0; j < s.size(); ++j)
        src(static_cast<Index>(k - begin), static_cast<Index>(j)) = s[j];
    }
    auto hyps = options.greedy ? greedy_decode(model, src, dec) : beam_search(model, src, dec);
    for (std::size_t k = begin; k < end; ++k) out[b.order[k]] = std::move(hyps[k - begin]);
  }
  return out;
}

Translator::Translator(const std::string& dir) : vocab_(SubwordVocab::load(dir)) {
  vocab_.check_directory(dir);
  load_weights(model_file(dir));
}

Translator::Translator(const std::string& dir, const std::string& weights)
    : vocab_(SubwordVocab::load(dir)) {
  vocab_.check_directory(dir);
  load_weights(weights);
}

void Translator::load_weights(const std::string& file) {
  file_ = file;
  LoadOptions options;
  // Every value of the metadata is checked before the model it describes is built, and the
  // tensors the header declares before they are read.
  const SafetensorsFile weights = load_safetensors(file, [&](const SafetensorsFile& header) {
    const TransformerConfig config = model_config(header, vocab_);
    max_len_ = model_max_len(header);
    alpha_ = model_alpha(header);
    identity_ = detail::metadata_with_prefixes(header.metadata(), kModelMetadataPrefixes);
    model_ = std::make_unique<Transformer<float>>(config);
    options = model_file_options(model_->parameters());
    detail::validate_model_tensors(header, model_->parameters(), options);
  });
  load_model(weights, model_->parameters(), options);
  check_finite_parameters(model_->parameters(), file);
  model_->eval();
}

void Translator::check_same_model(const std::string& path) const {
  const SafetensorsFile header = read_safetensors_header(path);
  model_config(header, vocab_);  // the vocabulary first: its message says what differs
  detail::check_same_metadata(
      identity_, detail::metadata_with_prefixes(header.metadata(), kModelMetadataPrefixes), file_,
      path);
  detail::validate_model_tensors(header, model_->parameters(),
                                 model_file_options(model_->parameters()));
}

void Translator::load_average(const std::vector<std::string>& paths) {
  ATTN_CHECK(!paths.empty(), ConfigError, "no checkpoints to average");
  check_same_model(paths.front());  // average_checkpoints holds the others to the first
  const std::vector<NamedParameter<float>> params = model_->parameters();
  average_checkpoints(paths, params, model_file_options(params), kModelMetadataPrefixes);
  check_finite_parameters(params, detail::concat("the average of ", paths.size(),
                                                 " checkpoints ending with ", paths.back()));
  alpha_.reset();
}

std::vector<std::vector<TokenId>> Translator::encode_lines(const std::string* first, std::size_t n,
                                                           const std::string& input_name,
                                                           std::size_t first_line) const {
  std::vector<std::vector<TokenId>> ids(n);
  for (std::size_t i = 0; i < n; ++i) {
    check_utf8_line(first[i], input_name, first_line + i);
    ids[i] = encode_source(vocab_, first[i], max_len_,
                           detail::concat(input_name, " line ", first_line + i));
  }
  return ids;
}

std::vector<std::string> Translator::translate(const std::vector<std::string>& lines,
                                               const TranslateOptions& options,
                                               const std::string& input_name,
                                               std::size_t first_line) {
  // Every line is checked before the first is decoded, so a bad line costs no decoding time.
  const auto out = translate_ids(
      *model_, encode_lines(lines.data(), lines.size(), input_name, first_line), resolve(options));
  std::vector<std::string> text(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) text[i] = vocab_.decode(out[i]);
  return text;
}

void Translator::translate_each(const std::vector<std::string>& lines,
                                const TranslateOptions& options, const std::string& input_name,
                                const std::function<void(std::string&&)>& sink) {
  // Checked first, chunk by chunk, lines and batches (plan_batches), so that a bad line or a
  // batch too large costs no decoding time; each chunk's ids are made again when it is decoded
  // (encoding costs far less than decoding).
  const TranslateOptions resolved = resolve(options);
  for (std::size_t at = 0; at < lines.size() || at == 0; at += kChunkLines)
    plan_batches(*model_,
                 encode_lines(lines.data() + at, std::min(kChunkLines, lines.size() - at),
                              input_name, at + 1),
                 resolved);
  for (std::size_t at = 0; at < lines.size(); at += kChunkLines) {
    const auto ids = encode_lines(lines.data() + at, std::min(kChunkLines, lines.size() - at),
                                  input_name, at + 1);
    for (const auto& out : translate_ids(*model_, ids, resolved)) sink(vocab_.decode(out));
  }
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

}  // namespace attn::translate
