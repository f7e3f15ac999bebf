#include "debian_descriptions.hpp"

#include <lz4frame.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <memory>
#include <set>
#include <unordered_map>

#include <attn/error.hpp>
#include <attn/train/regular_file.hpp>

#include "text.hpp"

namespace attn::translate {
namespace {

namespace fs = std::filesystem;

bool is_md5(std::string_view s) {
  return s.size() == 32 && std::all_of(s.begin(), s.end(), [](char c) {
           return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// A list item starts its own paragraph, so that lists align item by item.
bool starts_list_item(std::string_view line) {
  return line.size() >= 2 && std::string_view("*-+o").find(line[0]) != std::string_view::npos &&
         line[1] == ' ';
}

// One record's fields of interest, collected line by line.
struct RecordBuilder {
  std::string md5;
  bool has_description = false, bad = false, in_description = false;
  // The description's lines as read: normalize_spaces decodes "\xC2 " as U+00A0 and drops it,
  // turning ill-formed text into well-formed text, so the raw text is what is checked.
  bool valid_utf8 = true;
  Description d;
  std::string paragraph;

  void end_paragraph() {
    const std::string p = normalize_spaces(paragraph);
    if (!p.empty()) d.paragraphs.push_back(p);
    paragraph.clear();
  }
  void continuation(std::string_view line) {  // line without its leading space
    if (!in_description) return;              // continuation of another field
    if (trim(line) == ".") return end_paragraph();
    const std::string_view text = trim(line);
    valid_utf8 = valid_utf8 && is_valid_utf8(text);
    if (starts_list_item(text)) end_paragraph();
    paragraph += ' ';
    paragraph += text;
  }
};

// Adds the finished record to `out` if it is well formed; counts it either way.
void finish_record(RecordBuilder& r, std::vector<Description>& out, DebianDescriptionStats& st) {
  r.end_paragraph();
  ++st.records;
  const bool utf8 = r.valid_utf8;
  if (r.bad || !is_md5(r.md5) || !r.has_description || r.d.short_text.empty() || !utf8) {
    ++st.malformed;
    st.invalid_utf8 += utf8 ? 0 : 1;
  } else {
    r.d.md5 = r.md5;
    out.push_back(std::move(r.d));
  }
  r = RecordBuilder{};
}

bool is_abbreviation(std::string_view word) {
  static const std::set<std::string, std::less<>> kAbbrev = {
      "e.g",  "i.e", "etc", "vs",  "cf",  "approx", "incl", "dr",   "mr",
      "mrs",  "no",  "z.b", "bzw", "usw", "ca",     "bspw", "inkl", "ggf",
      "evtl", "d.h", "u.a", "sog", "vgl", "nr",     "engl", "u.ä"};
  if (count_code_points(word) <= 1) return true;  // initials, "z. B."
  std::string lower(word);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return kAbbrev.count(lower) > 0;
}

bool starts_sentence(std::string_view rest) {
  if (rest.empty()) return false;
  const auto c = static_cast<unsigned char>(rest[0]);
  if (std::isupper(c) || std::isdigit(c)) return true;
  // Ä, Ö, Ü in UTF-8: C3 84, C3 96, C3 9C
  return c == 0xC3 && rest.size() > 1 &&
         (rest[1] == '\x84' || rest[1] == '\x96' || rest[1] == '\x9C');
}

// "* item", "- item", "+ item", "o item": the marker is layout, not text to translate.
std::string_view strip_list_marker(std::string_view s) {
  return starts_list_item(s) ? trim(s.substr(2)) : s;
}

// Lengths that a translation cannot have: one side over max_length_ratio times the other (in code
// points, once the longer side has 20 or more). Sentences paired by count alone misalign this
// way ("It uses the gcc backend." / "Dies ist der GNU-Fortran-Compiler, der ... erzeugt.").
bool lengths_disagree(std::string_view en, std::string_view de, double max_ratio) {
  const double a = static_cast<double>(count_code_points(en)),
               b = static_cast<double>(count_code_points(de));
  const double lo = std::min(a, b), hi = std::max(a, b);
  return hi >= 20 && hi > max_ratio * std::max(lo, 1.0);
}

// Adds the pair if it is usable text; counts why not if it is not.
void add_pair(ParallelCorpus& out, std::string_view en, std::string_view de,
              const DebianDescriptionOptions& o, DebianDescriptionStats& st) {
  en = strip_list_marker(en);
  de = strip_list_marker(de);
  if (en.empty() || de.empty() || en == de) return;
  if (count_code_points(en) > o.max_chars || count_code_points(de) > o.max_chars) return;
  if (en.find("://") != std::string_view::npos || de.find("://") != std::string_view::npos) {
    ++st.dropped_urls;
    return;
  }
  if (lengths_disagree(en, de, o.max_length_ratio)) {
    ++st.dropped_ratio;
    return;
  }
  out.src.emplace_back(en);
  out.tgt.emplace_back(de);
}

}  // namespace

std::string lz4_decompress_if_framed(std::string_view data, const std::string& name,
                                     std::size_t max_bytes) {
  static constexpr std::array<unsigned char, 4> kMagic = {0x04, 0x22, 0x4D, 0x18};
  if (data.size() < 4 ||
      !std::equal(kMagic.begin(), kMagic.end(), data.begin(),
                  [](unsigned char m, char c) { return m == static_cast<unsigned char>(c); }))
    return std::string(data);
  LZ4F_dctx* raw = nullptr;
  ATTN_CHECK(!LZ4F_isError(LZ4F_createDecompressionContext(&raw, LZ4F_VERSION)), IOError,
             "cannot create an lz4 decompression context for '", name, "'");
  std::unique_ptr<LZ4F_dctx, decltype(&LZ4F_freeDecompressionContext)> dctx(
      raw, &LZ4F_freeDecompressionContext);
  std::string out;
  std::string buffer(std::size_t{1} << 16, '\0');
  std::size_t pos = 0, hint = 1;
  while (pos < data.size()) {
    std::size_t dst = buffer.size(), src = data.size() - pos;
    hint = LZ4F_decompress(dctx.get(), buffer.data(), &dst, data.data() + pos, &src, nullptr);
    ATTN_CHECK(!LZ4F_isError(hint), FormatError, "'", name, "': corrupt lz4 frame at byte ", pos,
               ": ", LZ4F_getErrorName(hint));
    ATTN_CHECK(out.size() + dst <= max_bytes, FormatError, "'", name, "' inflates to more than ",
               max_bytes, " bytes");
    out.append(buffer.data(), dst);
    pos += src;
    if (src == 0 && dst == 0) break;  // no progress: cannot happen on valid input
  }
  ATTN_CHECK(hint == 0, FormatError, "'", name, "': truncated lz4 frame (", data.size(),
             " bytes read, the frame expects more)");
  return out;
}

std::vector<Description> parse_translation_records(std::string_view text, std::string_view lang,
                                                   DebianDescriptionStats* stats) {
  DebianDescriptionStats local;
  DebianDescriptionStats& st = stats ? *stats : local;
  const std::string field = "Description-" + std::string(lang);
  std::vector<Description> out;
  RecordBuilder r;
  bool open = false;  // a record has started
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    pos = end + 1;
    if (trim(line).empty()) {
      if (open) finish_record(r, out, st);
      open = false;
      continue;
    }
    open = true;
    if (line[0] == ' ' || line[0] == '\t') {
      r.continuation(line.substr(1));
      continue;
    }
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0 ||
        line.substr(0, colon).find(' ') != std::string_view::npos) {
      r.bad = true;  // neither a field nor a continuation
      continue;
    }
    const std::string_view name = line.substr(0, colon), value = trim(line.substr(colon + 1));
    r.in_description = name == field;
    if (name == "Description-md5") r.md5 = std::string(value);
    if (r.in_description) {
      r.bad = r.bad || r.has_description;  // two descriptions in one record
      r.has_description = true;
      r.valid_utf8 = r.valid_utf8 && is_valid_utf8(value);
      r.d.short_text = normalize_spaces(value);
    }
  }
  if (open) finish_record(r, out, st);
  return out;
}

std::vector<std::string> split_sentences(std::string_view p) {
  std::vector<std::string> out;
  std::size_t start = 0;
  int depth = 0;  // of parentheses: "(Emil Klumpp. 1956)" ends no sentence
  for (std::size_t i = 0; i + 2 < p.size(); ++i) {
    depth += p[i] == '(' ? 1 : p[i] == ')' && depth > 0 ? -1 : 0;
    if (depth > 0 || (p[i] != '.' && p[i] != '!' && p[i] != '?') || p[i + 1] != ' ') continue;
    if (!starts_sentence(p.substr(i + 2))) continue;
    if (p[i] == '.') {
      const std::size_t word = p.rfind(' ', i);
      const std::size_t from = word == std::string_view::npos || word < start ? start : word + 1;
      if (is_abbreviation(p.substr(from, i - from))) continue;
    }
    out.emplace_back(trim(p.substr(start, i + 1 - start)));
    start = i + 2;
  }
  const std::string_view last = trim(p.substr(std::min(start, p.size())));
  if (!last.empty()) out.emplace_back(last);
  return out;
}

ParallelCorpus pair_descriptions(const std::vector<Description>& english,
                                 const std::vector<Description>& german,
                                 const DebianDescriptionOptions& options,
                                 DebianDescriptionStats* stats) {
  DebianDescriptionStats local;
  DebianDescriptionStats& st = stats ? *stats : local;
  std::unordered_map<std::string, const Description*> by_md5;
  for (const Description& d : english) by_md5.emplace(d.md5, &d);
  std::set<std::string> done;
  ParallelCorpus out;
  for (const Description& de : german) {
    if (!done.insert(de.md5).second) continue;
    const auto it = by_md5.find(de.md5);
    if (it == by_md5.end()) {
      ++st.unmatched;
      continue;
    }
    ++st.matched;
    const Description& en = *it->second;
    add_pair(out, en.short_text, de.short_text, options, st);
    if (en.paragraphs.size() != de.paragraphs.size()) {
      ++st.paragraphs_misaligned;
      continue;
    }
    for (std::size_t p = 0; p < en.paragraphs.size(); ++p) {
      const auto s_en = split_sentences(en.paragraphs[p]), s_de = split_sentences(de.paragraphs[p]);
      // Equal counts can still pair the wrong sentences (one side split where the other joined):
      // then a pair's lengths disagree, and the paragraph is treated as misaligned.
      bool aligned = s_en.size() == s_de.size();
      for (std::size_t k = 0; aligned && k < s_en.size(); ++k)
        aligned = !lengths_disagree(s_en[k], s_de[k], options.max_length_ratio);
      if (aligned) {
        for (std::size_t k = 0; k < s_en.size(); ++k) add_pair(out, s_en[k], s_de[k], options, st);
      } else {
        ++st.sentences_misaligned;
        add_pair(out, en.paragraphs[p], de.paragraphs[p], options, st);  // if short enough
      }
    }
  }
  st.pairs += out.size();
  return out;
}

ParallelCorpus load_debian_descriptions(const DebianDescriptionOptions& options,
                                        DebianDescriptionStats* stats) {
  DebianDescriptionStats local;
  DebianDescriptionStats& st = stats ? *stats : local;
  std::vector<fs::path> files[2];  // en, de
  std::error_code ec;
  for (fs::directory_iterator it(options.directory, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    for (int l = 0; l < 2; ++l) {
      const std::string tag = l == 0 ? "_i18n_Translation-en" : "_i18n_Translation-de";
      const std::size_t at = name.find(tag);
      if (at == std::string::npos) continue;
      const std::string rest = name.substr(at + tag.size());
      if (rest.empty() || rest == ".lz4") files[l].push_back(it->path());
    }
  }
  ATTN_CHECK(!ec, IOError, "cannot list '", options.directory, "': ", ec.message());
  ATTN_CHECK(!files[0].empty() && !files[1].empty(), IOError, "no ",
             files[0].empty() ? "English" : "German", " package descriptions (*_i18n_Translation-",
             files[0].empty() ? "en" : "de", ") in '", options.directory,
             "'; fetch them with: apt-get update -o Acquire::Languages=de,en");
  std::vector<Description> parsed[2];
  std::size_t total = 0;
  for (int l = 0; l < 2; ++l) {
    std::sort(files[l].begin(), files[l].end());
    for (const fs::path& path : files[l]) {
      const std::string text =
          lz4_decompress_if_framed(read_regular_file(path.string(), options.max_file_bytes),
                                   path.string(), options.max_file_bytes);
      // One file past the limit is held at once at most, before it is refused.
      ATTN_CHECK(text.size() <= options.max_total_bytes - total, FormatError,
                 "the package descriptions in '", options.directory, "' hold more than ",
                 options.max_total_bytes, " bytes together, the most that are read (at '",
                 path.string(), "')");
      total += text.size();
      auto records = parse_translation_records(text, l == 0 ? "en" : "de", &st);
      parsed[l].insert(parsed[l].end(), std::make_move_iterator(records.begin()),
                       std::make_move_iterator(records.end()));
      ++st.files;
    }
  }
  return pair_descriptions(parsed[0], parsed[1], options, &st);
}

}  // namespace attn::translate
