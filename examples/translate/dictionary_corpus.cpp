#include "dictionary_corpus.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>

#include <attn/error.hpp>
#include <attn/train/regular_file.hpp>

#include "text.hpp"

namespace attn::translate {
namespace {

// Splits at every occurrence of `sep`.
std::vector<std::string_view> split(std::string_view s, std::string_view sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (std::size_t at; (at = s.find(sep, start)) != std::string_view::npos; start = at + sep.size())
    out.push_back(s.substr(start, at - start));
  out.push_back(s.substr(start));
  return out;
}

// A "/ABBR/" at s[i] == '/': a slash-delimited token without spaces, at a word boundary.
std::size_t abbreviation_end(std::string_view s, std::size_t i) {
  if (i > 0 && s[i - 1] != ' ') return std::string_view::npos;
  const std::size_t close = s.find('/', i + 1);
  if (close == std::string_view::npos || close == i + 1 || close - i > 24)
    return std::string_view::npos;
  if (s.substr(i + 1, close - i - 1).find(' ') != std::string_view::npos)
    return std::string_view::npos;
  if (close + 1 < s.size() && s[close + 1] != ' ') return std::string_view::npos;
  return close + 1;
}

bool has_placeholder(std::string_view s) {
  static const char* const kMarks[] = {"sth.", "sb.", "sb's",  "sth", "etw.", "jdn.", "jdm.",
                                       "jds.", "jd.", "one's", "…",   "...",  " / ",  "~"};
  for (const char* m : kMarks) {
    const std::size_t at = s.find(m);
    if (at == std::string_view::npos) continue;
    if (!std::isalpha(static_cast<unsigned char>(m[0]))) return true;
    // A whole word: "sth" must not match inside "something".
    const bool left = at == 0 || !std::isalpha(static_cast<unsigned char>(s[at - 1]));
    const std::size_t after = at + std::strlen(m);
    const bool right = after >= s.size() || !std::isalpha(static_cast<unsigned char>(s[after]));
    if (left && right) return true;
  }
  return false;
}

}  // namespace

const char* dict_kind_name(DictKind kind) {
  switch (kind) {
    case DictKind::kWord:
      return "word";
    case DictKind::kPhrase:
      return "phrase";
    case DictKind::kSentence:
      return "sentence";
    case DictKind::kPattern:
      return "pattern";
    case DictKind::kCount:
      break;
  }
  return "?";
}

bool strip_dictionary_annotations(std::string_view s, std::string& out) {
  out.clear();
  out.reserve(s.size());
  char close = 0;  // the bracket that ends the current annotation; brackets do not nest here
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (close != 0) {
      if (c == close) close = 0;
      continue;
    }
    switch (c) {
      case '{':
        close = '}';
        break;
      case '[':
        close = ']';
        break;
      case '<':
        close = '>';
        break;
      case '(':
        close = ')';
        break;
      case '}':
      case ']':
      case '>':
      case ')':
        return false;
      case '/': {
        const std::size_t end = abbreviation_end(s, i);
        if (end == std::string_view::npos) {
          out += c;
        } else {
          i = end - 1;
        }
        break;
      }
      default:
        out += c;
    }
  }
  if (close != 0) return false;
  out = normalize_spaces(out);
  return true;
}

DictKind classify_dictionary_pair(std::string_view en, std::string_view de) {
  if (has_placeholder(en) || has_placeholder(de)) return DictKind::kPattern;
  const auto first = static_cast<unsigned char>(en.empty() ? ' ' : en.front());
  const char last = en.empty() ? ' ' : en.back();
  if (count_words(en) >= 3 && (std::isupper(first) || std::isdigit(first)) &&
      (last == '.' || last == '!' || last == '?'))
    return DictKind::kSentence;
  if (count_words(en) >= 2 && count_words(de) >= 2) return DictKind::kPhrase;
  return DictKind::kWord;
}

std::vector<DictPair> parse_dictionary(std::string_view text, DictionaryStats* stats) {
  DictionaryStats local;
  DictionaryStats& st = stats ? *stats : local;
  std::vector<DictPair> out;
  std::string de_clean, en_clean;
  for (std::size_t pos = 0; pos < text.size();) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    ++st.lines;
    if (!is_valid_utf8(line)) {
      ++st.invalid_utf8;
      continue;
    }
    const auto sides = split(line, " :: ");
    if (sides.size() != 2) {
      ++st.malformed;
      continue;
    }
    const auto de_subs = split(sides[0], " | "), en_subs = split(sides[1], " | ");
    if (de_subs.size() != en_subs.size()) {
      ++st.misaligned;
      continue;
    }
    std::vector<DictPair> line_pairs;
    bool bad = false;
    for (std::size_t k = 0; k < de_subs.size() && !bad; ++k) {
      // The first synonym of each side: the dictionary lists the most common one first.
      const std::string_view de = split(de_subs[k], ";")[0], en = split(en_subs[k], ";")[0];
      bad = !strip_dictionary_annotations(de, de_clean) ||
            !strip_dictionary_annotations(en, en_clean);
      if (bad) break;
      if (de_clean.empty() || en_clean.empty()) {
        ++st.empty;
        continue;
      }
      const DictKind kind = classify_dictionary_pair(en_clean, de_clean);
      line_pairs.push_back({en_clean, de_clean, kind});
    }
    if (bad) {
      ++st.malformed;
      continue;
    }
    for (auto& p : line_pairs) {
      ++st.by_kind[static_cast<std::size_t>(p.kind)];
      out.push_back(std::move(p));
    }
  }
  return out;
}

std::vector<DictPair> load_dictionary(const std::string& path, DictionaryStats* stats) {
  std::string text;
  try {
    text = read_regular_file(path, kMaxDictionaryBytes);
  } catch (const IOError& e) {  // it names the path and why; say where the file comes from
    throw IOError(detail::concat(
        "cannot open the dictionary (Debian package trans-de-en: apt-get install trans-de-en): ",
        e.what()));
  }
  return parse_dictionary(text, stats);
}

}  // namespace attn::translate
