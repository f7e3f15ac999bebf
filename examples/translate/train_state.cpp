#include "train_state.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>
#include <type_traits>

#include <attn/strict_number.hpp>

#include "model_metadata.hpp"
#include "text.hpp"

namespace attn::translate {

namespace {

/// Metadata `key` as a T within `range`.
template <class T>
T bounded(const Metadata& m, const std::string& key, const std::string& file,
          const Range<T>& range) {
  const T v = parse_number_or_throw<T>(metadata_value(m, key, file), file, "metadata " + key);
  ATTN_CHECK(range.contains(v), FormatError, file, ": metadata ", key, " = ", v, " must be ",
             range.text());
  return v;
}

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

static_assert(std::string_view(kMaxLenKey) == "translate.max_len",
              "TrainOptions::visit_saved stores max_len under the key the translator reads");
static_assert(kMaxTranslateLength == Index(1) << 16,
              "TrainOptions::visit_saved bounds max_len by kMaxTranslateLength");

void store_options(const TrainOptions& o, Metadata& m) {
  o.visit_saved([&](const char* key, const auto& v, bool, const auto&) { m[key] = exact_text(v); });
}

void restore_options(TrainOptions& o, const Metadata& m, const std::string& file) {
  TrainOptions r = o;  // nothing changes unless every value is good
  r.visit_saved([&](const char* key, auto& v, bool required, const auto& range) {
    using V = std::decay_t<decltype(v)>;
    if (!required && !m.count(key))
      v = V{};  // a checkpoint from before the option existed: trained with it off
    else
      v = bounded<V>(m, key, file, range);
  });
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

void store_curves(const std::vector<CurvePoint>& curves, Metadata& m) {
  m["curves"] = encode_curves(curves);
}

std::vector<CurvePoint> restore_curves(const Metadata& m, const std::string& file) {
  const auto it = m.find("curves");
  return it != m.end() ? decode_curves(it->second, file) : std::vector<CurvePoint>{};
}

void store_resume_point(Metadata& m) { m[kResumePointKey] = "1"; }

bool is_resume_point(const Metadata& m) { return m.count(kResumePointKey) > 0; }

void store_data_position(const DataPosition& p, Metadata& m) {
  m["data.epoch"] = std::to_string(p.epoch);
  m["data.batch"] = std::to_string(p.batch);
}

void store_log_window(const LogWindowState& w, Metadata& m) {
  m["log.loss_sum"] = round_trip_text(w.loss_sum);
  m["log.updates"] = std::to_string(w.updates);
}

LogWindowState restore_log_window(const Metadata& m, const std::string& file, Index max_updates) {
  LogWindowState w;
  if (!m.count("log.loss_sum") && !m.count("log.updates")) return w;
  w.loss_sum = parse_number_or_throw<double>(metadata_value(m, "log.loss_sum", file), file,
                                             "metadata log.loss_sum");
  ATTN_CHECK(std::isfinite(w.loss_sum) && w.loss_sum >= 0, FormatError, file,
             ": metadata log.loss_sum = ", w.loss_sum, ", expected a finite sum of losses >= 0");
  w.updates = bounded(m, "log.updates", file, option_rows::within(Index(0), max_updates));
  return w;
}

void store_data_fingerprint(std::uint64_t fingerprint, Metadata& m) {
  m["data.fingerprint"] = hex16(fingerprint);
}

void check_data_fingerprint(const Metadata& m, const std::string& file, std::uint64_t given) {
  const auto it = m.find("data.fingerprint");
  if (it == m.end()) return;
  const std::string& text = it->second;
  const std::optional<std::uint64_t> saved = parse_hex<std::uint64_t>(text);
  ATTN_CHECK(text.size() == 16 && saved.has_value(), FormatError, file,
             ": metadata data.fingerprint: expected 16 hex digits, got '", text.substr(0, 40), "'");
  ATTN_CHECK(*saved == given, OtherDataError, "--resume: ", file,
             " was trained on other data (training batches with fingerprint ", text,
             "; the given data's: ", hex16(given),
             "): pass the interrupted run's --src and --tgt (without them, the built-in corpus)");
}

DataPosition restore_data_position(const Metadata& m, const std::string& file,
                                   const std::function<std::size_t(std::uint64_t)>& batches_in) {
  DataPosition p;
  p.epoch = parse_number_or_throw<std::uint64_t>(metadata_value(m, "data.epoch", file), file,
                                                 "metadata data.epoch");
  p.batch =
      bounded(m, "data.batch", file, option_rows::within(std::size_t(0), batches_in(p.epoch)));
  return p;
}

}  // namespace attn::translate
