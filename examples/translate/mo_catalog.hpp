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
// corrupt file throws FormatError instead of reading out of bounds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace attn::translate {

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
/// missing NUL terminator).
MoCatalog parse_mo(std::string_view bytes, const std::string& name);

/// Reads and parses a .mo file. Throws IOError if it cannot be read, FormatError as parse_mo.
MoCatalog read_mo_file(const std::string& path);

}  // namespace attn::translate
