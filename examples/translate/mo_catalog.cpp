#include "mo_catalog.hpp"

#include <algorithm>

#include <attn/error.hpp>
#include <attn/train/regular_file.hpp>

namespace attn::translate {
namespace {

constexpr std::uint32_t kMagic = 0x950412de;
constexpr std::uint64_t kHeaderBytes = 28;

class Reader {
 public:
  Reader(std::string_view bytes, const std::string& name) : bytes_(bytes), name_(name) {}

  std::uint32_t u32(std::uint64_t offset, const char* what) const {
    ATTN_CHECK(offset + 4 <= bytes_.size(), FormatError, "'", name_, "': ", what, " at byte ",
               offset, " lies beyond the end of the file (", bytes_.size(), " bytes)");
    const auto* p = reinterpret_cast<const unsigned char*>(bytes_.data() + offset);
    if (big_endian)
      return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 |
             p[3];
    return std::uint32_t{p[3]} << 24 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[1]} << 8 | p[0];
  }

  // String `index` of the table at `table`: its bytes, without the NUL that must follow them.
  std::string_view string_at(std::uint64_t table, std::uint64_t index, const char* which) const {
    const std::uint64_t entry = table + 8 * index;
    const std::uint64_t length = u32(entry, "a string length");
    const std::uint64_t offset = u32(entry + 4, "a string offset");
    // 64-bit sums cannot overflow from 32-bit parts, so these comparisons are exact.
    ATTN_CHECK(offset + length + 1 <= bytes_.size(), FormatError, "'", name_, "': ", which,
               " string ", index, " spans bytes [", offset, ", ", offset + length,
               "] plus its NUL, beyond the end of the file (", bytes_.size(), " bytes)");
    ATTN_CHECK(bytes_[offset + length] == '\0', FormatError, "'", name_, "': ", which, " string ",
               index, " is not NUL-terminated: expected byte 0 at offset ", offset + length,
               ", found ",
               static_cast<unsigned>(static_cast<unsigned char>(bytes_[offset + length])));
    return bytes_.substr(offset, length);
  }

  std::size_t size() const { return bytes_.size(); }
  bool big_endian = false;

 private:
  std::string_view bytes_;
  const std::string& name_;
};

// The plural forms of translation `index`, separated by NUL. They are counted before a string is
// made: one NUL of the file costs a 32-byte std::string, so a translation of 50 million NULs took
// 2 GB.
std::vector<std::string> split_plural_forms(std::string_view translation, std::uint64_t index,
                                            const std::string& name) {
  const auto forms =
      static_cast<std::size_t>(std::count(translation.begin(), translation.end(), '\0')) + 1;
  ATTN_CHECK(forms <= kMaxPluralForms, FormatError, "'", name, "': translation string ", index,
             " holds ", forms, " NUL-separated plural forms, expected at most ", kMaxPluralForms);
  std::vector<std::string> parts;
  parts.reserve(forms);
  std::size_t start = 0;
  for (std::size_t end; (end = translation.find('\0', start)) != std::string_view::npos;
       start = end + 1)
    parts.emplace_back(translation.substr(start, end - start));
  parts.emplace_back(translation.substr(start));
  return parts;
}

// Entry `index` from its original ("ctx\x04id\0id_plural", context and plural optional) and its
// translation.
MoEntry make_entry(std::string_view original, std::string_view translation, std::uint64_t index,
                   const std::string& name) {
  MoEntry entry;
  const std::size_t eot = original.find('\x04');
  if (eot != std::string_view::npos) {
    entry.has_context = true;
    entry.context = std::string(original.substr(0, eot));
    original.remove_prefix(eot + 1);
  }
  const std::size_t nul = original.find('\0');
  if (nul != std::string_view::npos) {
    entry.plural = true;
    entry.msgid_plural = std::string(original.substr(nul + 1));
    original = original.substr(0, nul);
  }
  entry.msgid = std::string(original);
  entry.msgstr = split_plural_forms(translation, index, name);
  return entry;
}

}  // namespace

MoCatalog parse_mo(std::string_view bytes, const std::string& name) {
  Reader in(bytes, name);
  ATTN_CHECK(bytes.size() >= kHeaderBytes, FormatError, "'", name, "': expected a .mo header of ",
             kHeaderBytes, " bytes, the file has ", bytes.size());
  MoCatalog catalog;
  const std::uint32_t magic = in.u32(0, "the magic number");
  if (magic != kMagic) {
    in.big_endian = true;
    ATTN_CHECK(in.u32(0, "the magic number") == kMagic, FormatError, "'", name,
               "': not a .mo file: expected magic 0x950412de in either byte order, found 0x",
               std::hex, magic);
  }
  catalog.big_endian = in.big_endian;
  catalog.revision = in.u32(4, "the revision");
  // Major revisions 0 and 1 share this layout; GNU gettext refuses any other.
  ATTN_CHECK((catalog.revision >> 16) <= 1, FormatError, "'", name,
             "': unsupported .mo major revision: expected 0 or 1, found ", catalog.revision >> 16);
  const std::uint64_t count = in.u32(8, "the string count");
  const std::uint64_t originals = in.u32(12, "the original table offset");
  const std::uint64_t translations = in.u32(16, "the translation table offset");
  const std::uint64_t hash_size = in.u32(20, "the hash table size");
  const std::uint64_t hash_offset = in.u32(24, "the hash table offset");
  const std::uint64_t size = bytes.size();
  // Checking the tables before the loop bounds `count` by the file size, so a corrupt count
  // cannot make us reserve gigabytes.
  ATTN_CHECK(originals + 8 * count <= size, FormatError, "'", name, "': the original table of ",
             count, " entries at offset ", originals, " ends at byte ", originals + 8 * count,
             ", beyond the end of the file (", size, " bytes)");
  ATTN_CHECK(translations + 8 * count <= size, FormatError, "'", name,
             "': the translation table of ", count, " entries at offset ", translations,
             " ends at byte ", translations + 8 * count, ", beyond the end of the file (", size,
             " bytes)");
  ATTN_CHECK(hash_offset + 4 * hash_size <= size, FormatError, "'", name, "': the hash table of ",
             hash_size, " entries at offset ", hash_offset, " ends at byte ",
             hash_offset + 4 * hash_size, ", beyond the end of the file (", size, " bytes)");

  catalog.entries.reserve(count);
  // msgfmt writes every string as a region of its own, after the header and the two tables, so
  // together they fit in the file. Without the first bound, entries all pointing at one long
  // string would copy it again and again: a 1 MB file could ask for tens of gigabytes
  // (std::bad_alloc instead of FormatError). The second also charges each entry its 16 bytes of
  // tables, so that the entries, with their plural forms, take memory proportional to the file.
  std::uint64_t referenced = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::string_view original = in.string_at(originals, i, "original");
    const std::string_view translation = in.string_at(translations, i, "translation");
    referenced += original.size() + translation.size() + 2;
    ATTN_CHECK(referenced <= size, FormatError, "'", name, "': the strings of entries 0 to ", i,
               " take ", referenced, " bytes with their NULs, more than the file holds (", size,
               " bytes): strings overlap");
    const std::uint64_t laid_out = kHeaderBytes + 16 * (i + 1) + referenced;
    ATTN_CHECK(laid_out <= size, FormatError, "'", name, "': the header, the table entries and ",
               "the strings of entries 0 to ", i, " take ", laid_out,
               " bytes, more than the file holds (", size, " bytes): strings overlap the tables");
    catalog.entries.push_back(make_entry(original, translation, i, name));
  }
  return catalog;
}

MoCatalog read_mo_file(const std::string& path) {
  return parse_mo(read_regular_file(path, kMaxMoBytes), path);
}

}  // namespace attn::translate
