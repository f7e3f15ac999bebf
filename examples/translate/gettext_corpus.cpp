#include "gettext_corpus.hpp"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <tuple>

#include <attn/error.hpp>
#include <attn/random.hpp>

#include "mo_catalog.hpp"
#include "text.hpp"

namespace attn::translate {
namespace {

bool ascii_alnum(unsigned char c) { return std::isalnum(c) != 0; }
// A lead byte of a multi-byte sequence: in catalog text that is almost always a letter.
bool starts_word_char(unsigned char c) { return ascii_alnum(c) || c >= 0xC0; }

bool is_letter(std::uint32_t cp) {
  if (cp < 0x80) return std::isalpha(static_cast<int>(cp)) != 0;
  // Latin-1 letters, then everything outside the punctuation and symbol blocks.
  if (cp < 0xC0 || cp == 0xD7 || cp == 0xF7) return false;
  return !(cp >= 0x2000 && cp <= 0x2BFF) && !(cp >= 0x3000 && cp <= 0x303F);
}

bool has_printf_directive(std::string_view s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') continue;
    std::size_t j = i + 1;
    if (j < s.size() && (s[j] == '(' || s[j] == '{')) return true;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    if (j < s.size() && s[j] == '$') ++j;
    // The space flag is left out: "100 % done" is prose far more often than "% d" is a format.
    while (j < s.size() && std::strchr("-+#0'I", s[j]) != nullptr) ++j;
    while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '*')) ++j;
    if (j < s.size() && s[j] == '.') {
      ++j;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '*')) ++j;
    }
    while (j < s.size() && std::strchr("hlLqjzZt", s[j]) != nullptr) ++j;
    if (j < s.size() && std::strchr("diouxXeEfFgGaAcCsSpnm%", s[j]) != nullptr) return true;
  }
  return false;
}

bool has_html_entity(std::string_view s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') continue;
    std::size_t j = i + 1;
    if (j < s.size() && s[j] == '#') ++j;
    const std::size_t name = j;
    while (j < s.size() && ascii_alnum(static_cast<unsigned char>(s[j]))) ++j;
    if (j > name && j < s.size() && s[j] == ';') return true;
  }
  return false;
}

bool has_control(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7F;
  });
}

bool mostly_letters(std::string_view s) {
  std::size_t letters = 0, visible = 0;
  for (std::size_t i = 0; i < s.size();) {
    const std::uint32_t cp = next_code_point(s, i);
    if (cp == ' ') continue;
    ++visible;
    letters += is_letter(cp) ? 1 : 0;
  }
  return 2 * letters >= visible && visible > 0;
}

// The catalog's charset from its header entry; empty when the header does not say.
std::string header_charset(const MoCatalog& catalog) {
  for (const MoEntry& e : catalog.entries) {
    if (!e.msgid.empty() || e.has_context || e.msgstr.empty()) continue;
    const std::string& h = e.msgstr[0];
    const std::size_t at = h.find("charset=");
    if (at == std::string::npos) return {};
    std::string charset;
    for (std::size_t i = at + 8;
         i < h.size() && !std::isspace(static_cast<unsigned char>(h[i])) && h[i] != ';'; ++i)
      charset += static_cast<char>(std::tolower(static_cast<unsigned char>(h[i])));
    return charset;
  }
  return {};
}

}  // namespace

const char* drop_reason_name(DropReason reason) {
  switch (reason) {
    case DropReason::kKept:
      return "kept";
    case DropReason::kHeader:
      return "header";
    case DropReason::kPlural:
      return "plural";
    case DropReason::kEmpty:
      return "empty";
    case DropReason::kInvalidUtf8:
      return "invalid UTF-8";
    case DropReason::kControl:
      return "control character";
    case DropReason::kFormat:
      return "placeholder or markup";
    case DropReason::kSymbols:
      return "mostly symbols";
    case DropReason::kLength:
      return "too long";
    case DropReason::kShort:
      return "too few words";
    case DropReason::kUntranslated:
      return "untranslated";
    case DropReason::kCount:
      break;
  }
  return "?";
}

std::string strip_accelerator(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool removed = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const bool next_word =
        i + 1 < text.size() && starts_word_char(static_cast<unsigned char>(text[i + 1]));
    if (c == '&' && i + 1 < text.size() && text[i + 1] == '&') {
      out += '&';  // "&&" is how Qt writes a literal ampersand
      ++i;
    } else if ((c == '_' || c == '&') && next_word && !removed) {
      removed = true;
    } else {
      out += c;
    }
  }
  return out;
}

bool has_format_markup(std::string_view s) {
  if (has_printf_directive(s) || has_html_entity(s)) return true;
  if (s.find_first_of("{}<>") != std::string_view::npos) return true;
  for (std::size_t i = 0; i + 1 < s.size(); ++i)
    if (s[i] == '$' &&
        (std::isalpha(static_cast<unsigned char>(s[i + 1])) || s[i + 1] == '{' || s[i + 1] == '_'))
      return true;
  if (std::count(s.begin(), s.end(), '_') > 1) return true;
  std::size_t ampersands = 0;
  for (std::size_t i = 0; i + 1 < s.size(); ++i) {
    if (s[i] == '&' && s[i + 1] == '&') {
      ++i;
    } else if (s[i] == '&' && starts_word_char(static_cast<unsigned char>(s[i + 1]))) {
      ++ampersands;
    }
  }
  return ampersands > 1;
}

CleanResult clean_gettext_entry(std::string_view msgid, std::string_view msgstr, bool plural,
                                const GettextCorpusOptions& options) {
  CleanResult r;
  auto drop = [&r](DropReason why) {
    r.reason = why;
    r.src.clear();
    r.tgt.clear();
    return r;
  };
  if (msgid.empty()) return drop(DropReason::kHeader);
  if (plural) return drop(DropReason::kPlural);
  if (msgstr.empty()) return drop(DropReason::kEmpty);
  if (!is_valid_utf8(msgid) || !is_valid_utf8(msgstr)) return drop(DropReason::kInvalidUtf8);
  if (has_control(msgid) || has_control(msgstr)) return drop(DropReason::kControl);
  if (has_format_markup(msgid) || has_format_markup(msgstr)) return drop(DropReason::kFormat);
  r.src = normalize_spaces(strip_accelerator(msgid));
  r.tgt = normalize_spaces(strip_accelerator(msgstr));
  if (!mostly_letters(r.src) || !mostly_letters(r.tgt)) return drop(DropReason::kSymbols);
  if (count_code_points(r.src) > options.max_chars || count_code_points(r.tgt) > options.max_chars)
    return drop(DropReason::kLength);
  if (count_words(r.src) < options.min_words) return drop(DropReason::kShort);
  if (r.src == r.tgt) return drop(DropReason::kUntranslated);
  return r;
}

CorpusSplit load_gettext_corpus(const GettextCorpusOptions& options, GettextCorpusStats* stats) {
  namespace fs = std::filesystem;
  GettextCorpusStats local;
  GettextCorpusStats& st = stats != nullptr ? *stats : local;
  st = GettextCorpusStats{};

  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(options.directory, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().extension() == ".mo") files.push_back(it->path());
  ATTN_CHECK(!ec, IOError, "cannot list the gettext catalogs in '", options.directory,
             "': ", ec.message());
  std::sort(files.begin(), files.end());  // unreadable catalogs named in the same order each run

  // source -> translation -> how many catalogs give it
  std::map<std::string, std::map<std::string, std::size_t>> seen;
  for (const fs::path& path : files) {
    MoCatalog catalog;
    try {
      catalog = read_mo_file(path.string());
    } catch (const Error& e) {  // one package's broken catalog leaves the others in
      st.unreadable.push_back(e.what());
      continue;
    }
    const std::string charset = header_charset(catalog);
    if (!(charset.empty() || charset == "utf-8" || charset == "utf8" || charset == "ascii" ||
          charset == "us-ascii")) {
      ++st.files_skipped;
      continue;
    }
    ++st.files;
    for (const MoEntry& e : catalog.entries) {
      ++st.entries;
      const std::string_view msgstr = e.msgstr.empty() ? std::string_view() : e.msgstr[0];
      CleanResult r = clean_gettext_entry(e.msgid, msgstr, e.plural, options);
      ++st.by_reason[static_cast<std::size_t>(r.reason)];
      if (r.reason != DropReason::kKept) continue;
      auto& targets = seen[r.src];
      if (!targets.empty()) ++st.duplicates;
      ++targets[r.tgt];
    }
  }

  std::vector<std::tuple<std::uint64_t, std::string, std::string>> pairs;
  pairs.reserve(seen.size());
  for (auto& [src, targets] : seen) {
    // Most frequent translation; std::map order makes the smallest string win ties.
    auto best = targets.begin();
    for (auto it = targets.begin(); it != targets.end(); ++it)
      if (it->second > best->second) best = it;
    pairs.emplace_back(stable_hash(src), src, best->first);
  }
  std::sort(pairs.begin(), pairs.end());
  st.pairs = pairs.size();
  const std::size_t held_out = options.valid_size + options.test_size;
  ATTN_CHECK(pairs.size() > held_out, DataError, "the gettext catalogs in '", options.directory,
             "' yield ", pairs.size(), " usable pairs from ", st.files,
             " files; expected more than valid_size + test_size = ", held_out,
             st.unreadable.empty()
                 ? std::string()
                 : detail::concat(" (", st.unreadable.size(),
                                  " could not be read, the first: ", st.unreadable[0], ")"));

  CorpusSplit split;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    ParallelCorpus& part = i < options.valid_size ? split.valid
                           : i < held_out         ? split.test
                                                  : split.train;
    part.src.push_back(std::move(std::get<1>(pairs[i])));
    part.tgt.push_back(std::move(std::get<2>(pairs[i])));
  }
  return split;
}

}  // namespace attn::translate
