#include "bleu.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>

#include <attn/error.hpp>

#include "text.hpp"  // next_code_point

namespace attn::translate {
namespace {

// Python's s.replace(from, to) for a `to` no longer than `from`, in place: writing never passes
// reading, so a line of many matches costs no second copy.
void replace_all(std::string& s, std::string_view from, std::string_view to) {
  ATTN_ASSERT(to.size() <= from.size());
  char* data = s.data();
  std::size_t write = 0, read = 0;
  for (std::size_t at; (at = s.find(from, read)) != std::string::npos; read = at + from.size()) {
    std::memmove(data + write, data + read, at - read);
    write += at - read;
    std::memcpy(data + write, to.data(), to.size());
    write += to.size();
  }
  if (read == 0) return;  // no match
  std::memmove(data + write, data + read, s.size() - read);
  s.resize(write + s.size() - read);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// sacreBLEU's first regex: [\{-\~\[-\` -\&\(-\+\:-\@\/]
bool is_split_symbol(char c) {
  return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') ||
         (c >= '(' && c <= '+') || (c >= ':' && c <= '@') || c == '/';
}

bool is_ascii_whitespace(char c) { return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20); }

// Length of the Python whitespace character starting at s[i], or 0.
std::size_t whitespace_at(std::string_view s, std::size_t i) {
  if (is_ascii_whitespace(s[i])) return 1;
  const auto c = static_cast<unsigned char>(s[i]);
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

std::string_view rstrip(std::string_view s) {
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
  return s.substr(0, end);
}

// Calls on_token(std::string_view) for each token of Python's text.split(), in order. Having
// passed a token it reads `text` only after it, so on_token may overwrite what lies before.
template <class OnToken>
void for_each_token(std::string_view text, OnToken&& on_token) {
  std::size_t start = 0;  // of the current token
  for (std::size_t i = 0; i < text.size();) {
    if (const std::size_t ws = whitespace_at(text, i); ws == 0) {
      ++i;
    } else {
      if (i > start) on_token(text.substr(start, i - start));
      start = i += ws;
    }
  }
  if (start < text.size()) on_token(text.substr(start));
}

// ' '.join(s.split()) without a second string.
void join_tokens_in_place(std::string& s) {
  std::size_t write = 0;
  for_each_token(s, [&](std::string_view token) {
    if (write > 0) s[write++] = ' ';
    std::memmove(s.data() + write, token.data(), token.size());
    write += token.size();
  });
  s.resize(write);
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

// Tokenizer13a's regexes after the first, chained as streaming stages so that the line is not
// copied once per regex. Each puts spaces around a matching pair of characters, after each
// ("\1 \2 ") or before each (" \1 \2"), scanning as re.sub does: left to right, a match
// consuming both characters. A stage holds back one character, the possible first of a pair.
enum class SpacePlacement { kAfterEach, kBeforeEach };

template <bool (*kMatches)(char, char), SpacePlacement kSpaces, class Next>
struct PairRewrite {
  void put(char c) {
    if (holding && kMatches(held, c)) {
      const bool after = kSpaces == SpacePlacement::kAfterEach;
      for (char out : after ? std::array{held, ' ', c, ' '} : std::array{' ', held, ' ', c})
        next.put(out);
      holding = false;
      return;
    }
    if (holding) next.put(held);
    held = c;
    holding = true;
  }

  void finish() {  // the end of the line
    if (holding) next.put(held);
    next.finish();
  }

  Next& next;
  char held = 0;
  bool holding = false;
};

// Matching bytes equals Python's matching code points here: the only class a non-ASCII
// character can match is [^0-9], which all its bytes match too, and they pass through in order.
// ([^0-9])([\.,]) -> "\1 \2 "
bool punct_after_non_digit(char a, char b) { return !is_digit(a) && (b == '.' || b == ','); }
// ([\.,])([^0-9]) -> " \1 \2"
bool punct_before_non_digit(char a, char b) { return (a == '.' || a == ',') && !is_digit(b); }
// ([0-9])(-) -> "\1 \2 "
bool hyphen_after_digit(char a, char b) { return is_digit(a) && b == '-'; }

// The end of the chain: appends to `out` with each run of ASCII whitespace as one space, which
// keeps a line of symbols from tripling; tokenize_13a then splits on all whitespace.
struct CollapseAsciiWhitespace {
  void put(char c) {
    if (is_ascii_whitespace(c) && (out.empty() || out.back() == ' ')) return;
    out += is_ascii_whitespace(c) ? ' ' : c;
  }
  void finish() {}

  std::string& out;
};

// Tokenizer13a's first regex, [\{-\~\[-\` -\&\(-\+\:-\@\/] -> " \g<0> ", on one character.
template <class Next>
void split_symbol(char c, Next& next) {
  const bool split = is_split_symbol(c);
  if (split) next.put(' ');
  next.put(c);
  if (split) next.put(' ');
}

// An n-gram of the longer side that the shorter side lacks; no n-gram containing it matches.
constexpr std::uint32_t kAbsent = std::numeric_limits<std::uint32_t>::max();

// One order's n-grams of a sentence pair as ids, one per start position, equal for equal n-grams:
// dense over the shorter side's n-grams, the only ones hashed, so no table outgrows that side.
struct NgramIds {
  std::vector<std::uint32_t> shorter, longer;  // [tokens - order + 1] of each side
  std::size_t distinct = 0;                    // ids are < distinct (or kAbsent in `longer`)
};

NgramIds unigram_ids(std::string_view shorter, std::string_view longer) {
  std::unordered_map<std::string_view, std::uint32_t> ids;
  NgramIds out;
  for_each_token(shorter, [&](std::string_view token) {
    out.shorter.push_back(ids.emplace(token, static_cast<std::uint32_t>(ids.size())).first->second);
  });
  ATTN_CHECK(out.shorter.size() < kAbsent, DataError, "corpus_bleu: expected sentences of fewer ",
             "than ", kAbsent, " tokens, got one of ", out.shorter.size());
  std::size_t longer_tokens = 0;  // counted first: this side can be the size of its file
  for_each_token(longer, [&](std::string_view) { ++longer_tokens; });
  out.longer.reserve(longer_tokens);
  for_each_token(longer, [&](std::string_view token) {
    const auto it = ids.find(token);
    out.longer.push_back(it == ids.end() ? kAbsent : it->second);
  });
  out.distinct = ids.size();
  return out;
}

// From the ids of order n - 1 to those of order n, in place: the n-gram starting at i is the
// pair of (n-1)-grams starting at i and i + 1, and no other pair gives the same n-gram.
void extend_to_next_order(NgramIds& ngrams) {
  std::unordered_map<std::uint64_t, std::uint32_t> ids;
  auto pair_key = [](std::uint32_t a, std::uint32_t b) { return std::uint64_t{a} << 32 | b; };
  auto& [shorter, longer, distinct] = ngrams;
  for (std::size_t i = 0; i + 1 < shorter.size(); ++i) {
    const std::uint64_t key = pair_key(shorter[i], shorter[i + 1]);
    shorter[i] = ids.emplace(key, static_cast<std::uint32_t>(ids.size())).first->second;
  }
  if (!shorter.empty()) shorter.pop_back();
  for (std::size_t i = 0; i + 1 < longer.size(); ++i) {
    const bool absent = longer[i] == kAbsent || longer[i + 1] == kAbsent;
    const auto it = absent ? ids.end() : ids.find(pair_key(longer[i], longer[i + 1]));
    longer[i] = it == ids.end() ? kAbsent : it->second;
  }
  if (!longer.empty()) longer.pop_back();
  distinct = ids.size();
}

// Sum over n-grams g of min(count of g in hyp, count of g in ref): sacreBLEU's clipped
// matches, symmetric in the two sides.
std::int64_t clipped_matches(const NgramIds& ngrams) {
  std::vector<std::uint32_t> unmatched(ngrams.distinct, 0);  // [distinct] in `shorter`
  for (std::uint32_t id : ngrams.shorter) ++unmatched[id];
  std::int64_t matches = 0;
  for (std::uint32_t id : ngrams.longer) {
    if (id == kAbsent || unmatched[id] == 0) continue;
    --unmatched[id];
    ++matches;
  }
  return matches;
}

// Adds one sentence pair's lengths, hypothesis n-gram totals and clipped matches to `s`.
void add_sentence_pair(std::string_view hyp, std::string_view ref, BleuScore& s) {
  const bool hyp_is_shorter = hyp.size() <= ref.size();
  NgramIds ngrams = hyp_is_shorter ? unigram_ids(hyp, ref) : unigram_ids(ref, hyp);
  const auto hyp_len =
      static_cast<std::int64_t>((hyp_is_shorter ? ngrams.shorter : ngrams.longer).size());
  s.hyp_len += hyp_len;
  s.ref_len += static_cast<std::int64_t>(ngrams.shorter.size() + ngrams.longer.size()) - hyp_len;
  for (int n = 0; n < BleuScore::kOrder; ++n) {
    if (n > 0) extend_to_next_order(ngrams);
    s.totals[n] += static_cast<double>(std::max<std::int64_t>(hyp_len - n, 0));
    s.counts[n] += static_cast<double>(clipped_matches(ngrams));
  }
}

}  // namespace

std::string tokenize_13a(std::string_view input) {
  std::string line(input);
  constexpr std::pair<std::string_view, std::string_view> kReplacements[] = {
      {"<skipped>", ""}, {"-\n", ""},   {"\n", " "},  {"&quot;", "\""},
      {"&amp;", "&"},    {"&lt;", "<"}, {"&gt;", ">"}};  // in sacreBLEU's order
  for (const auto& [from, to] : kReplacements) replace_all(line, from, to);

  std::string out;
  out.reserve(line.size() + 2);
  CollapseAsciiWhitespace sink{out};
  using Kind = SpacePlacement;  // regexes 4, 3 and 2 of sacreBLEU's, chained back to front
  PairRewrite<hyphen_after_digit, Kind::kAfterEach, decltype(sink)> regex4{sink};
  PairRewrite<punct_before_non_digit, Kind::kBeforeEach, decltype(regex4)> regex3{regex4};
  PairRewrite<punct_after_non_digit, Kind::kAfterEach, decltype(regex3)> regex2{regex3};
  // sacreBLEU pads the line with a space each side before the first regex.
  split_symbol(' ', regex2);
  for (char c : line) split_symbol(c, regex2);
  split_symbol(' ', regex2);
  regex2.finish();
  join_tokens_in_place(out);
  return out;
}

std::string lowercase_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t start = i;
    const std::uint32_t cp = next_code_point(text, i);
    const std::uint32_t lower = cp == kNotACodePoint ? cp : lower_code_point(cp);
    if (lower == cp) {
      out.append(text.substr(start, i - start));  // as it was, a byte that starts no sequence too
    } else {
      encode_utf8(lower, out);
    }
  }
  return out;
}

std::vector<std::string> split_whitespace(std::string_view text) {
  std::vector<std::string> tokens;
  for_each_token(text, [&](std::string_view token) { tokens.emplace_back(token); });
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
  // sacreBLEU's lowercase, rstrip and tokenize; `storage` holds the text unless it is `sentence`.
  auto prepare = [&](const std::string& sentence, std::string& storage) {
    std::string_view text = sentence;
    if (options.lowercase) text = storage = lowercase_utf8(sentence);
    text = rstrip(text);
    if (options.tokenize == BleuTokenizer::k13a) text = storage = tokenize_13a(text);
    return text;
  };
  std::string hyp_storage, ref_storage;
  for (std::size_t i = 0; i < hyps.size(); ++i)
    add_sentence_pair(prepare(hyps[i], hyp_storage), prepare(refs[i], ref_storage), s);

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
