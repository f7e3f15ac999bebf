// GNU gettext .mo catalogs (the binary message catalogs under /usr/share/locale), read strictly.
//
// Layout (GNU gettext manual, "The Format of GNU MO Files"), all integers 32-bit in the byte
// order announced by the magic number 0x950412de:
//   0: magic   4: revision   8: N strings   12: offset O of the original table
//   16: offset T of the translation table   20: hash table size S   24: hash table offset H
// Each table holds N (length, offset) pairs; string i occupies [offset, offset + length) and is
// followed by a NUL. An original "ctx\x04id\0id_plural" carries a context and a plural; its
// translation holds the plural forms separated by NUL.
//
// Every offset and length is checked against the file size before it is used, so a truncated or
// corrupt file throws FormatError instead of reading out of bounds. The header, the two tables
// and the strings must together fit in the file, as msgfmt lays them out one after the other, and
// a translation holds at most kMaxPluralForms forms, so a catalog takes memory proportional to its
// file: at most about 20 bytes per byte (a 136-byte MoEntry and 16 32-byte forms for 33 bytes of
// tables and NULs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace attn::translate {

/// The largest .mo file read_mo_file reads: 16 MiB. The largest of the 3,811 catalogs under
/// /usr/share/locale of a Debian 12 system with PostgreSQL and git is ru/postgres-15.mo, 1,017,040
/// bytes; the cap leaves 16 times that for larger suites, and it bounds what a device or a huge
/// file put in place of a catalog costs before a byte is read.
inline constexpr std::size_t kMaxMoBytes = std::size_t{16} << 20;

/// The most plural forms (NUL-separated strings) a translation may hold. Languages need at most 6
/// (Arabic); none of those 3,811 catalogs has more. Each form costs a 32-byte std::string for as
/// little as one NUL of the file, so 50 million NULs took 2 GB before this bound.
inline constexpr std::size_t kMaxPluralForms = 16;

struct MoEntry {
  bool has_context = false;
  std::string context;              ///< msgctxt, when has_context
  std::string msgid;                ///< the original (singular) text, without its context
  bool plural = false;              ///< true when the original carries an msgid_plural
  std::string msgid_plural;         ///< when plural
  std::vector<std::string> msgstr;  ///< one translation per plural form; one for singular entries
};

struct MoCatalog {
  std::uint32_t revision = 0;
  bool big_endian = false;
  std::vector<MoEntry> entries;  ///< in file order (sorted by original, as msgfmt writes them)
};

/// Parses the bytes of a .mo file; `name` is used in error messages. Throws FormatError naming
/// `name` and what is wrong (bad magic, unsupported revision, table or string out of bounds,
/// missing NUL terminator, strings overlapping each other or the tables, more than
/// kMaxPluralForms forms in a translation).
MoCatalog parse_mo(std::string_view bytes, const std::string& name);

/// Reads and parses a .mo file. Throws IOError naming `path` unless it is a regular file of at most
/// kMaxMoBytes bytes (a directory, a FIFO or a device is refused before a byte is read, and a
/// FIFO without a writer does not block), FormatError as parse_mo.
MoCatalog read_mo_file(const std::string& path);

}  // namespace attn::translate
