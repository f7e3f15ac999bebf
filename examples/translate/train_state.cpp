#include "train_state.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>

#include <attn/strict_number.hpp>

#include "translator.hpp"

namespace attn::translate {

namespace {

std::string str(double v) {
  std::ostringstream o;
  o.precision(17);
  o << v;
  return o.str();
}

/// Metadata `key` as a T within [lo, hi].
template <class T>
T bounded(const Metadata& m, const std::string& key, const std::string& file, T lo, T hi) {
  const T v = parse_number_or_throw<T>(metadata_value(m, key, file), file, "metadata " + key);
  ATTN_CHECK(v >= lo && v <= hi, FormatError, file, ": metadata ", key, " = ", v,
             " is outside [", lo, ", ", hi, "]");
  return v;
}

constexpr Index kMaxIndex = std::numeric_limits<Index>::max();
constexpr double kHuge = std::numeric_limits<double>::max();

/// One number of a curve item: finite, or NaN where it was not measured.
double curve_value(std::string_view text, const std::string& file) {
  double v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  ATTN_CHECK(r.ec == std::errc() && r.ptr == text.data() + text.size() && !std::isinf(v),
             FormatError, file, ": metadata curves: \"", std::string(text),
             "\" is not a number or nan");
  return v;
}

}  // namespace

const std::string& metadata_value(const Metadata& m, const std::string& key,
                                  const std::string& file) {
  auto it = m.find(key);
  ATTN_CHECK(it != m.end(), FormatError, file, " lacks metadata ", key,
             " (not a checkpoint written by attn-translate train?)");
  return it->second;
}

void store_options(const TrainOptions& o, Metadata& m) {
  m["train.label_smoothing"] = str(o.label_smoothing);
  m["train.warmup"] = std::to_string(o.warmup);
  m["train.lr_factor"] = str(o.lr_factor);
  m["train.clip_norm"] = str(o.clip_norm);
  m["train.max_tokens"] = std::to_string(o.max_tokens);
  m["train.tokens_per_update"] = std::to_string(o.tokens_per_update);
  m["train.seed"] = std::to_string(o.seed);
  m[kMaxLenKey] = std::to_string(o.max_len);
}

void restore_options(TrainOptions& o, const Metadata& m, const std::string& file) {
  TrainOptions r = o;  // nothing changes unless every value is good
  r.label_smoothing = bounded(m, "train.label_smoothing", file, 0.0, 0.999999);
  r.warmup = bounded<Index>(m, "train.warmup", file, 1, kMaxIndex);
  r.lr_factor = bounded(m, "train.lr_factor", file, 0.0, kHuge);
  // Checkpoints from before --clip-norm existed were trained without clipping.
  r.clip_norm = m.count("train.clip_norm") ? bounded(m, "train.clip_norm", file, 0.0, kHuge) : 0;
  r.max_tokens = bounded<Index>(m, "train.max_tokens", file, 1, Index(1) << 40);
  r.tokens_per_update = bounded<Index>(m, "train.tokens_per_update", file, 0, Index(1) << 40);
  r.seed = parse_number_or_throw<std::uint64_t>(metadata_value(m, "train.seed", file), file,
                                                "metadata train.seed");
  r.max_len = bounded<Index>(m, kMaxLenKey, file, 1, kMaxTranslateLength);
  o = r;
}

std::string encode_curves(const std::vector<CurvePoint>& curves) {
  std::ostringstream o;
  o.precision(17);  // round-trips a double: a resumed run's curves equal an uninterrupted run's
  for (const auto& c : curves)
    o << c.step << ',' << c.train_loss << ',' << c.valid_loss << ',' << c.valid_bleu << ';';
  return o.str();
}

std::vector<CurvePoint> decode_curves(const std::string& text, const std::string& file) {
  std::vector<CurvePoint> out;
  std::size_t begin = 0;
  while (begin < text.size()) {
    const std::size_t end = text.find(';', begin);
    ATTN_CHECK(end != std::string::npos, FormatError, file,
               ": metadata curves does not end with ';' (truncated?)");
    const std::string_view item(text.data() + begin, end - begin);
    std::vector<std::string_view> fields;
    for (std::size_t from = 0;;) {
      const std::size_t comma = item.find(',', from);
      fields.push_back(item.substr(from, comma == std::string_view::npos ? comma : comma - from));
      if (comma == std::string_view::npos || fields.size() > 4) break;
      from = comma + 1;
    }
    ATTN_CHECK(fields.size() == 4, FormatError, file, ": metadata curves: item \"",
               std::string(item), "\" is not step,train_loss,valid_loss,valid_bleu");
    CurvePoint c;
    c.step = parse_number_or_throw<Index>(fields[0], file, "metadata curves step");
    ATTN_CHECK(c.step >= 0, FormatError, file, ": metadata curves: negative step ", c.step);
    c.train_loss = curve_value(fields[1], file);
    c.valid_loss = curve_value(fields[2], file);
    c.valid_bleu = curve_value(fields[3], file);
    out.push_back(c);
    begin = end + 1;
  }
  return out;
}

void store_data_position(const DataPosition& p, Metadata& m) {
  m["data.epoch"] = std::to_string(p.epoch);
  m["data.batch"] = std::to_string(p.batch);
}

DataPosition restore_data_position(const Metadata& m, const std::string& file,
                                   std::size_t batches_per_epoch) {
  DataPosition p;
  p.epoch = parse_number_or_throw<std::uint64_t>(metadata_value(m, "data.epoch", file), file,
                                                 "metadata data.epoch");
  p.batch = bounded<std::size_t>(m, "data.batch", file, 0, batches_per_epoch);
  return p;
}

}  // namespace attn::translate
