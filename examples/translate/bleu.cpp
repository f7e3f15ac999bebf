#include "bleu.hpp"

#include <cmath>
#include <cstdio>
#include <unordered_map>

#include <attn/error.hpp>

namespace attn::translate {
namespace {

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  std::size_t start = 0;
  for (std::size_t at; (at = s.find(from, start)) != std::string::npos; start = at + from.size()) {
    out.append(s, start, at - start);
    out.append(to);
  }
  out.append(s, start, std::string::npos);
  s.swap(out);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// sacreBLEU's first regex: [\{-\~\[-\` -\&\(-\+\:-\@\/]
bool is_split_symbol(char c) {
  return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') ||
         (c >= '(' && c <= '+') || (c >= ':' && c <= '@') || c == '/';
}

// Length of the Python whitespace character starting at s[i], or 0.
std::size_t whitespace_at(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
  auto next = [&](std::size_t k) {
    return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0;
  };
  if (c == 0xC2 && (next(1) == 0x85 || next(1) == 0xA0)) return 2;  // U+0085, U+00A0
  if (c == 0xE1 && next(1) == 0x9A && next(2) == 0x80) return 3;    // U+1680
  if (c == 0xE2 && next(1) == 0x80) {
    const unsigned char d = next(2);  // U+2000..200A, U+2028, U+2029, U+202F
    if ((d >= 0x80 && d <= 0x8A) || d == 0xA8 || d == 0xA9 || d == 0xAF) return 3;
  }
  if (c == 0xE2 && next(1) == 0x81 && next(2) == 0x9F) return 3;  // U+205F
  if (c == 0xE3 && next(1) == 0x80 && next(2) == 0x80) return 3;  // U+3000
  return 0;
}

std::string rstrip(std::string_view s) {
  // Whitespace characters are at most 3 bytes: trim while the tail is one.
  std::size_t end = s.size();
  for (bool trimmed = true; trimmed && end > 0;) {
    trimmed = false;
    for (std::size_t len = 1; len <= 3 && len <= end; ++len) {
      if (whitespace_at(s.substr(0, end), end - len) == len) {
        end -= len;
        trimmed = true;
        break;
      }
    }
  }
  return std::string(s.substr(0, end));
}

void encode_utf8(std::uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | cp >> 6);
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | cp >> 12);
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | cp >> 18);
    out += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
    out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::uint32_t lower_code_point(std::uint32_t cp) {
  if (cp >= 'A' && cp <= 'Z') return cp + 32;
  if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 32;
  if (cp == 0x178) return 0xFF;
  if ((cp >= 0x100 && cp <= 0x12F) || (cp >= 0x132 && cp <= 0x137) || (cp >= 0x14A && cp <= 0x177))
    return cp | 1;  // pairs (upper even, lower odd)
  if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E))
    return (cp & 1) ? cp + 1 : cp;  // pairs (upper odd, lower even)
  if (cp >= 0x391 && cp <= 0x3AB && cp != 0x3A2) return cp + 32;
  if (cp >= 0x410 && cp <= 0x42F) return cp + 32;
  if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
  if (cp == 0x1E9E) return 0xDF;
  return cp;
}

using NgramCounts = std::unordered_map<std::string, std::int64_t>;

// All n-grams of orders 1..4, each keyed by its tokens joined with ' ' (tokens hold no spaces).
NgramCounts count_ngrams(const std::vector<std::string>& tokens) {
  NgramCounts counts;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    std::string key;
    for (std::size_t n = 1; n <= BleuScore::kOrder && i + n <= tokens.size(); ++n) {
      if (n > 1) key += ' ';
      key += tokens[i + n - 1];
      ++counts[std::to_string(n) + key];  // the order prefix keeps orders apart
    }
  }
  return counts;
}

}  // namespace

std::string tokenize_13a(std::string_view input) {
  std::string line(input);
  replace_all(line, "<skipped>", "");
  replace_all(line, "-\n", "");
  replace_all(line, "\n", " ");
  replace_all(line, "&quot;", "\"");
  replace_all(line, "&amp;", "&");
  replace_all(line, "&lt;", "<");
  replace_all(line, "&gt;", ">");
  line = " " + line + " ";

  std::string a;
  for (char c : line) {
    if (is_split_symbol(c)) {
      a += ' ';
      a += c;
      a += ' ';
    } else {
      a += c;
    }
  }
  // ([^0-9])([\.,]) -> "\1 \2 "; a byte-wise scan equals Python's code-point scan here because
  // the pattern's second character is ASCII and the first is copied through unchanged.
  std::string b;
  std::size_t i = 0;
  for (; i + 1 < a.size(); ++i) {
    if (!is_digit(a[i]) && (a[i + 1] == '.' || a[i + 1] == ',')) {
      b += a[i];
      b += ' ';
      b += a[i + 1];
      b += ' ';
      ++i;
    } else {
      b += a[i];
    }
  }
  if (i < a.size()) b += a[i];
  // ([\.,])([^0-9]) -> " \1 \2"
  std::string c;
  for (i = 0; i + 1 < b.size(); ++i) {
    if ((b[i] == '.' || b[i] == ',') && !is_digit(b[i + 1])) {
      c += ' ';
      c += b[i];
      c += ' ';
      c += b[i + 1];
      ++i;
    } else {
      c += b[i];
    }
  }
  if (i < b.size()) c += b[i];
  // ([0-9])(-) -> "\1 \2 "
  std::string d;
  for (i = 0; i + 1 < c.size(); ++i) {
    if (is_digit(c[i]) && c[i + 1] == '-') {
      d += c[i];
      d += " - ";
      ++i;
    } else {
      d += c[i];
    }
  }
  if (i < c.size()) d += c[i];

  std::string out;
  for (const std::string& token : split_whitespace(d)) {
    if (!out.empty()) out += ' ';
    out += token;
  }
  return out;
}

std::string lowercase_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const std::size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (c >= 0x80 && (c < 0xC2 || i + len > text.size())) {  // not a lead byte: keep as is
      out += text[i++];
      continue;
    }
    std::uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (std::size_t k = 1; k < len; ++k)
      cp = cp << 6 | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    const std::uint32_t lower = lower_code_point(cp);
    if (lower == cp) {
      out.append(text.substr(i, len));
    } else {
      encode_utf8(lower, out);
    }
    i += len;
  }
  return out;
}

std::vector<std::string> split_whitespace(std::string_view text) {
  std::vector<std::string> tokens;
  std::string current;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t ws = whitespace_at(text, i);
    if (ws > 0) {
      if (!current.empty()) tokens.push_back(std::move(current));
      current.clear();
      i += ws;
    } else {
      current += text[i++];
    }
  }
  if (!current.empty()) tokens.push_back(std::move(current));
  return tokens;
}

std::string BleuScore::str() const {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "BLEU = %.2f %.1f/%.1f/%.1f/%.1f (BP = %.3f ratio = %.3f hyp_len = %lld ref_len = "
                "%lld)",
                score, precisions[0], precisions[1], precisions[2], precisions[3], bp, ratio,
                static_cast<long long>(hyp_len), static_cast<long long>(ref_len));
  return buf;
}

BleuScore corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs,
                      const BleuOptions& options) {
  ATTN_CHECK(hyps.size() == refs.size(), DataError, "corpus_bleu: expected one reference per ",
             "hypothesis, got ", hyps.size(), " hypotheses and ", refs.size(), " references");
  constexpr int N = BleuScore::kOrder;
  BleuScore s;
  auto prepare = [&](const std::string& sentence) {
    std::string text = options.lowercase ? lowercase_utf8(sentence) : sentence;
    text = rstrip(text);
    if (options.tokenize == BleuTokenizer::k13a) text = tokenize_13a(text);
    return split_whitespace(text);
  };
  for (std::size_t i = 0; i < hyps.size(); ++i) {
    const std::vector<std::string> hyp = prepare(hyps[i]);
    const std::vector<std::string> ref = prepare(refs[i]);
    s.hyp_len += static_cast<std::int64_t>(hyp.size());
    s.ref_len += static_cast<std::int64_t>(ref.size());
    const NgramCounts ref_counts = count_ngrams(ref);
    for (const auto& [ngram, count] : count_ngrams(hyp)) {
      const int n = ngram[0] - '1';
      s.totals[n] += static_cast<double>(count);
      const auto it = ref_counts.find(ngram);
      if (it != ref_counts.end()) s.counts[n] += static_cast<double>(std::min(count, it->second));
    }
  }

  // From here on this is sacreBLEU's BLEU.compute_bleu, step for step.
  double smooth_value = options.smooth_value;
  if (smooth_value < 0) smooth_value = options.smooth == BleuSmoothing::kFloor ? 0.1 : 1.0;
  if (s.hyp_len < s.ref_len) {
    s.bp = s.hyp_len > 0
               ? std::exp(1.0 - static_cast<double>(s.ref_len) / static_cast<double>(s.hyp_len))
               : 0.0;
  } else {
    s.bp = 1.0;
  }
  s.ratio = s.ref_len > 0 ? static_cast<double>(s.hyp_len) / static_cast<double>(s.ref_len) : 0;
  bool any_match = false;
  for (double c : s.counts) any_match = any_match || c != 0;
  if (!any_match) return s;  // score 0, precisions 0 (sacreBLEU issue #141)

  double smooth_mteval = 1;
  for (int n = 0; n < N; ++n) {
    if (options.smooth == BleuSmoothing::kAddK && n > 0) {
      s.counts[n] += smooth_value;
      s.totals[n] += smooth_value;
    }
    if (s.totals[n] == 0) break;
    if (s.counts[n] == 0) {
      if (options.smooth == BleuSmoothing::kExp) {
        smooth_mteval *= 2;
        s.precisions[n] = 100.0 / (smooth_mteval * s.totals[n]);
      } else if (options.smooth == BleuSmoothing::kFloor) {
        s.precisions[n] = 100.0 * smooth_value / s.totals[n];
      }
    } else {
      s.precisions[n] = 100.0 * s.counts[n] / s.totals[n];
    }
  }
  // sacreBLEU's my_log floors log(0) at -9999999999 rather than -inf.
  double log_sum = 0;
  for (double p : s.precisions) log_sum += p == 0 ? -9999999999.0 : std::log(p);
  s.score = s.bp * std::exp(log_sum / N);
  return s;
}

}  // namespace attn::translate
