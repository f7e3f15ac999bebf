// .mo catalogs and the gettext corpus built from them: parsing, cleaning rules, and a split that
// does not depend on the order of the files. Parallel text files are in test_corpus_io.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <attn/error.hpp>
#include <attn/random.hpp>

#include "error_helpers.hpp"
#include "temp_paths.hpp"

#include "corpus_io.hpp"
#include "gettext_corpus.hpp"
#include "mo_catalog.hpp"
#include "mo_writer.hpp"
#include "text.hpp"

namespace fs = std::filesystem;
using namespace attn::translate;
using attn::testing::error_of;
using attn::translate::testing::make_mo;
using attn::translate::testing::put32;
using attn::translate::testing::RawEntry;
using attn::translate::testing::temp_dir;
using attn::translate::testing::unreadable_paths;
using attn::translate::testing::write_file;

namespace {

std::vector<RawEntry> sample_entries() {
  using namespace std::string_literals;
  return {{"", "Content-Type: text/plain; charset=UTF-8\n"},
          {"Open the file",
           "Datei \xc3\xb6"
           "ffnen"},
          {"menu\x04_Quit", "_Beenden"},
          {"One file\0%d files"s, "Eine Datei\0%d Dateien"s}};
}

}  // namespace

// ---------------------------------------------------------------------------------------- .mo

TEST(MoCatalog, ParsesBothByteOrders) {
  for (bool big : {false, true}) {
    const MoCatalog c = parse_mo(make_mo(sample_entries(), big, 1), "sample.mo");
    EXPECT_EQ(c.big_endian, big);
    EXPECT_EQ(c.revision, 1u);
    ASSERT_EQ(c.entries.size(), 4u);
    EXPECT_EQ(c.entries[0].msgid, "");
    EXPECT_EQ(c.entries[1].msgid, "Open the file");
    EXPECT_EQ(c.entries[1].msgstr, std::vector<std::string>{"Datei \xc3\xb6"
                                                            "ffnen"});
    EXPECT_FALSE(c.entries[1].has_context);
    EXPECT_TRUE(c.entries[2].has_context);
    EXPECT_EQ(c.entries[2].context, "menu");
    EXPECT_EQ(c.entries[2].msgid, "_Quit");
    EXPECT_TRUE(c.entries[3].plural);
    EXPECT_EQ(c.entries[3].msgid, "One file");
    EXPECT_EQ(c.entries[3].msgid_plural, "%d files");
    EXPECT_EQ(c.entries[3].msgstr, (std::vector<std::string>{"Eine Datei", "%d Dateien"}));
  }
}

TEST(MoCatalog, BadMagicAndRevision) {
  std::string bytes = make_mo(sample_entries());
  bytes[0] = 'X';
  EXPECT_NE(error_of<attn::FormatError>([&] {
              parse_mo(bytes, "x.mo");
            }).find("'x.mo': not a .mo file: expected magic 0x950412de"),
            std::string::npos);
  const std::string rev2 = make_mo(sample_entries(), false, 2u << 16);
  EXPECT_NE(
      error_of<attn::FormatError>([&] { parse_mo(rev2, "r.mo"); }).find("expected 0 or 1, found 2"),
      std::string::npos);
}

TEST(MoCatalog, TableAndStringBoundsAreNamed) {
  std::string bytes = make_mo(sample_entries());
  put32(bytes, 8, 0x7fffffff, false);  // absurd count
  EXPECT_NE(error_of<attn::FormatError>([&] {
              parse_mo(bytes, "n.mo");
            }).find("the original table of 2147483647 entries"),
            std::string::npos);
  bytes = make_mo(sample_entries());
  put32(bytes, 28 + 8 + 4, 0xfffffff0, false);  // offset of original 1
  EXPECT_NE(error_of<attn::FormatError>([&] {
              parse_mo(bytes, "o.mo");
            }).find("original string 1 spans bytes [4294967280"),
            std::string::npos);
  bytes = make_mo(sample_entries());
  put32(bytes, 28 + 8, 3, false);  // length of original 1 shortened: its NUL is now a letter
  EXPECT_NE(error_of<attn::FormatError>([&] {
              parse_mo(bytes, "t.mo");
            }).find("original string 1 is not NUL-terminated"),
            std::string::npos);
}

TEST(MoCatalog, EveryTruncationIsAFormatError) {
  const std::string bytes = make_mo(sample_entries(), true);
  ASSERT_NO_THROW(parse_mo(bytes, "full.mo"));
  // The last string ends the file, so every proper prefix must be rejected.
  for (std::size_t n = 0; n < bytes.size(); ++n)
    EXPECT_THROW(parse_mo(std::string_view(bytes).substr(0, n), "cut.mo"), attn::FormatError)
        << "prefix of " << n << " bytes";
}

TEST(MoCatalog, RandomByteFlipsParseOrThrowFormatError) {
  const std::string good = make_mo(sample_entries());
  std::mt19937 gen(7);
  std::size_t parsed = 0, rejected = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    std::string bytes = good;
    const int flips = 1 + trial % 3;
    for (int k = 0; k < flips; ++k) bytes[gen() % bytes.size()] = static_cast<char>(gen() & 0xFF);
    try {
      const MoCatalog c = parse_mo(bytes, "flip.mo");
      EXPECT_LE(c.entries.size(), bytes.size() / 16);
      ++parsed;
    } catch (const attn::FormatError&) {
      ++rejected;
    }
  }
  EXPECT_GT(parsed, 0u);  // flips inside string bodies leave a valid file
  EXPECT_GT(rejected, 0u);
}

TEST(MoCatalog, StringsOverlappingTheTablesAreRefused) {
  // Eight entries whose empty strings all end at a zero byte of the header: 16 bytes of strings in
  // a file without room for them beside the tables (what lets one byte of a file become an entry).
  std::string bytes = make_mo(std::vector<RawEntry>(8));
  for (std::size_t slot = 0; slot < 16; ++slot) put32(bytes, 28 + 8 * slot + 4, 20, false);
  bytes.resize(28 + 16 * 8);
  EXPECT_NE(error_of<attn::FormatError>([&] { parse_mo(bytes, "o.mo"); })
                .find("'o.mo': the header, the table entries and the strings of entries 0 to 7 "
                      "take 172 bytes, more than the file holds (156 bytes)"),
            std::string::npos);
}

TEST(MoCatalog, PluralFormsAreBounded) {
  // Each form costs a std::string: a 50 MB translation of NULs took 2 GB.
  using namespace std::string_literals;
  const std::string most(kMaxPluralForms - 1, '\0');  // kMaxPluralForms empty forms
  const MoCatalog c = parse_mo(make_mo({{"file\0files"s, most}}), "most.mo");
  ASSERT_EQ(c.entries.size(), 1u);
  EXPECT_EQ(c.entries[0].msgstr.size(), kMaxPluralForms);
  const std::string expected =
      "NUL-separated plural forms, expected at most " + std::to_string(kMaxPluralForms);
  EXPECT_NE(error_of<attn::FormatError>([&] {
              parse_mo(make_mo({{"file\0files"s, most + '\0'}}), "more.mo");
            })
                .find("'more.mo': translation string 0 holds " +
                      std::to_string(kMaxPluralForms + 1) + " " + expected),
            std::string::npos);
  const std::string flood = make_mo({{"", ""}, {"x", std::string(std::size_t{1} << 20, '\0')}});
  EXPECT_NE(error_of<attn::FormatError>([&] {
              parse_mo(flood, "flood.mo");
            }).find("'flood.mo': translation string 1 holds 1048577 " + expected),
            std::string::npos);
}

TEST(MoCatalog, MissingFileIsIOError) {
  EXPECT_NE(error_of<attn::IOError>([] {
              read_mo_file("/nonexistent/x.mo");
            }).find("cannot open /nonexistent/x.mo: No such file or directory"),
            std::string::npos);
}

TEST(MoCatalog, OnlyARegularFileWithinTheCapIsRead) {
  // A directory named x.mo threw std::ios_base::failure without the path, past the callers' catch
  // of attn::Error; a FIFO hung the reader; a link to /dev/zero was read until std::bad_alloc.
  const fs::path dir = temp_dir("mo_files");
  write_file(dir / "good.mo", make_mo(sample_entries()));
  EXPECT_EQ(read_mo_file((dir / "good.mo").string()).entries.size(), 4u);
  for (const auto& [path, why] : unreadable_paths(dir, kMaxMoBytes, ".mo")) {
    const std::string& file = path;  // C++17 lambdas cannot capture a structured binding
    const std::string error = error_of<attn::IOError>([&] { read_mo_file(file); });
    EXPECT_NE(error.find("cannot read " + path + ": " + why), std::string::npos) << error;
  }
}

// ----------------------------------------------------------------------------- gettext corpus

TEST(GettextCorpus, AcceleratorsAndSpaces) {
  EXPECT_EQ(strip_accelerator("_Open File"), "Open File");
  EXPECT_EQ(strip_accelerator("Sa_ve as"), "Save as");
  EXPECT_EQ(strip_accelerator("&Save && Quit"), "Save & Quit");
  EXPECT_EQ(strip_accelerator("Tom & Jerry"), "Tom & Jerry");
  EXPECT_EQ(strip_accelerator("_\xc3\x96"
                              "ffnen"),
            "\xc3\x96"
            "ffnen");
  EXPECT_EQ(normalize_spaces("  a \xc2\xa0 b   c "), "a b c");
  EXPECT_EQ(normalize_spaces("100\xe2\x80\xaf%"), "100 %");
}

// stable_hash orders the built-in corpus before its split and is every model's vocab.hash: its
// bits are pinned (FNV-1a 64's published value for "a", then SplitMix64's finaliser).
TEST(Text, TheStableHashNeverChanges) {
  const char a = 'a';
  EXPECT_EQ(attn::fnv1a(attn::kFnv1aOffset, &a, 1), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(stable_hash(""), 0xf52a15e9a9b5e89bULL);
  EXPECT_EQ(stable_hash("Das Paket"), 0x0e74a7e43fcb8f38ULL);
  EXPECT_EQ(count_code_points("gr\xc3\xbc\xc3\x9f"
                              "e"),
            5u);
  EXPECT_EQ(count_words("  two  words "), 2u);
}

// A byte that starts no UTF-8 sequence (0x80..0xC1, or a lead byte the text cuts short) is passed
// over alone: it neither takes the byte after it into a code point nor reads past the end.
TEST(Text, NextCodePointPassesOverAByteThatStartsNoSequence) {
  const std::string s = "a\xc3\xa4\x80 \xc1\xbf\xf0\x9f\x98\x80\xe2\x82";
  std::vector<std::uint32_t> cps;
  std::size_t i = 0;
  while (i < s.size()) cps.push_back(next_code_point(s, i));
  EXPECT_EQ(i, s.size());
  EXPECT_EQ(cps,
            (std::vector<std::uint32_t>{'a', 0xE4, kNotACodePoint, ' ', kNotACodePoint,
                                        kNotACodePoint, 0x1F600, kNotACodePoint, kNotACodePoint}));
  // The space after the stray byte is a space: "\x80 " decoded as U+0020 and vanished before.
  EXPECT_EQ(normalize_spaces("a\x80  b\xc3"), "a\x80 b\xc3");
}

TEST(Text, CheckUtf8LineNamesTheLineTheOffsetAndTheByte) {
  EXPECT_NO_THROW(
      check_utf8_line("gr\xc3\xbc\xc3\x9f"
                      "e",
                      "'f.txt'", 3));
  EXPECT_EQ(error_of<attn::DataError>([] {
              check_utf8_line(
                  "thr\xe9"
                  "e",
                  "<stdin>", 3);
            }),
            "<stdin> line 3: expected UTF-8 text, found an invalid byte sequence at byte offset 3 "
            "of the line (byte 0xe9)");
}

TEST(GettextCorpus, FormatDetection) {
  for (const char* s : {"Copy %s now", "%1$s items", "%-5.2lf left", "%(name)s gone", "%{x} y",
                        "Show {count} files", "Set $HOME now", "<b>bold</b> text",
                        "Fish &amp; chips", "snake_case_name here", "&File &Edit"})
    EXPECT_TRUE(has_format_markup(s)) << s;
  for (const char* s : {"Open the file", "Save & Quit", "_Open a file", "100 % done"})
    EXPECT_FALSE(has_format_markup(s)) << s;
}

TEST(GettextCorpus, CleaningRules) {
  const GettextCorpusOptions o;
  auto reason = [&](std::string_view id, std::string_view str, bool plural = false) {
    return clean_gettext_entry(id, str, plural, o).reason;
  };
  EXPECT_EQ(reason("", "header"), DropReason::kHeader);
  EXPECT_EQ(reason("One file", "Eine Datei", true), DropReason::kPlural);
  EXPECT_EQ(reason("Open a file", ""), DropReason::kEmpty);
  EXPECT_EQ(reason("Open a file", "Datei \xc3 offnen"), DropReason::kInvalidUtf8);
  EXPECT_EQ(reason("Open\na file",
                   "Datei\n\xc3\xb6"
                   "ffnen"),
            DropReason::kControl);
  EXPECT_EQ(reason("Copy %s now", "Kopiere %s jetzt"), DropReason::kFormat);
  EXPECT_EQ(reason("/usr/bin 1.2.3", "/usr/bin 1.2.4"), DropReason::kSymbols);
  EXPECT_EQ(reason(std::string(201, 'a') + " b", "kurz und gut"), DropReason::kLength);
  EXPECT_EQ(reason("Quit", "Beenden"), DropReason::kShort);
  EXPECT_EQ(reason("Gnome Shell", "Gnome Shell"), DropReason::kUntranslated);
  const CleanResult kept = clean_gettext_entry("_Open a  file",
                                               "Datei \xc3\xb6"
                                               "ff_nen",
                                               false, o);
  EXPECT_EQ(kept.reason, DropReason::kKept);
  EXPECT_EQ(kept.src, "Open a file");
  EXPECT_EQ(kept.tgt,
            "Datei \xc3\xb6"
            "ffnen");
}

TEST(GettextCorpus, SplitIsDeterministicAndIndependentOfFileOrder) {
  // Two catalogs over the same 40 sentences, one of them reversed and with a conflicting
  // translation that loses the majority vote.
  std::vector<RawEntry> a{{"", "Content-Type: text/plain; charset=UTF-8\n"}}, b = a, c = a;
  for (int i = 0; i < 40; ++i) {
    a.push_back({"open file number " + std::to_string(i), "Datei nummer " + std::to_string(i)});
    c.push_back(a.back());
  }
  b.push_back({"open file number 3", "Zzz falsch drei"});
  const fs::path d1 = temp_dir("mo1"), d2 = temp_dir("mo2");
  write_file(d1 / "a.mo", make_mo(a));
  write_file(d1 / "b.mo", make_mo(b));
  write_file(d1 / "c.mo", make_mo(c, true));
  write_file(d1 / "ignored.txt", "not a catalog");
  // Same content under names that list in another order.
  write_file(d2 / "z.mo", make_mo(a));
  write_file(d2 / "m.mo", make_mo(b, true));
  write_file(d2 / "a.mo", make_mo(c));
  GettextCorpusOptions o;
  o.valid_size = 5;
  o.test_size = 5;
  GettextCorpusStats s1, s2;
  o.directory = d1.string();
  const CorpusSplit x = load_gettext_corpus(o, &s1);
  o.directory = d2.string();
  const CorpusSplit y = load_gettext_corpus(o, &s2);
  EXPECT_EQ(s1.files, 3u);
  EXPECT_EQ(s1.pairs, 40u);
  EXPECT_EQ(s1.duplicates, 41u);
  EXPECT_EQ(x.valid.src, y.valid.src);
  EXPECT_EQ(x.test.src, y.test.src);
  EXPECT_EQ(x.train.src, y.train.src);
  EXPECT_EQ(x.train.tgt, y.train.tgt);
  EXPECT_EQ(x.valid.size(), 5u);
  EXPECT_EQ(x.test.size(), 5u);
  EXPECT_EQ(x.train.size(), 30u);
  std::set<std::string> all(x.train.src.begin(), x.train.src.end());
  all.insert(x.valid.src.begin(), x.valid.src.end());
  all.insert(x.test.src.begin(), x.test.src.end());
  EXPECT_EQ(all.size(), 40u);  // disjoint parts covering everything
  for (const ParallelCorpus* p : {&x.train, &x.valid, &x.test})
    for (std::size_t i = 0; i < p->size(); ++i) {
      if (p->src[i] == "open file number 3") {
        EXPECT_EQ(p->tgt[i], "Datei nummer 3");
      }
    }

  o.valid_size = 20;
  o.test_size = 20;
  EXPECT_NE(error_of<attn::DataError>([&] { load_gettext_corpus(o); })
                .find("yield 40 usable pairs from 3 files; expected more than valid_size + "
                      "test_size = 40"),
            std::string::npos);
  o.directory = "/nonexistent/locale";
  EXPECT_NE(error_of<attn::IOError>([&] { load_gettext_corpus(o); }).find("/nonexistent/locale"),
            std::string::npos);
}

TEST(GettextCorpus, AnUnreadableCatalogIsLeftOutAndTheOthersRead) {
  // One package's broken catalog (or a directory named like one) used to end the whole source.
  std::vector<RawEntry> a{{"", "Content-Type: text/plain; charset=UTF-8\n"}};
  for (int i = 0; i < 40; ++i)
    a.push_back({"open file number " + std::to_string(i), "Datei nummer " + std::to_string(i)});
  const fs::path d = temp_dir("mo_unreadable");
  write_file(d / "a.mo", make_mo(a));
  write_file(d / "broken.mo", make_mo(a).substr(0, 20));
  fs::create_directories(d / "dir.mo");
  GettextCorpusOptions o;
  o.directory = d.string();
  o.valid_size = o.test_size = 0;
  GettextCorpusStats st;
  EXPECT_EQ(load_gettext_corpus(o, &st).train.size(), 40u);
  EXPECT_EQ(st.files, 1u);
  ASSERT_EQ(st.unreadable.size(), 2u);
  std::sort(st.unreadable.begin(), st.unreadable.end());
  EXPECT_NE(st.unreadable[0].find("broken.mo"), std::string::npos) << st.unreadable[0];
  EXPECT_EQ(st.unreadable[1], "cannot read " + (d / "dir.mo").string() +
                                  ": expected a regular file, found a directory");
}

TEST(GettextCorpus, SystemCatalogs) {
  // Exercises the real catalogs when the machine has them (Debian's default does).
  GettextCorpusOptions o;
  if (!fs::exists(o.directory)) GTEST_SKIP() << o.directory << " is absent";
  GettextCorpusStats st;
  const CorpusSplit split = load_gettext_corpus(o, &st);
  std::printf(
      "gettext corpus: %zu files (%zu skipped), %zu entries, %zu pairs: train %zu, valid "
      "%zu, test %zu\n",
      st.files, st.files_skipped, st.entries, st.pairs, split.train.size(), split.valid.size(),
      split.test.size());
  for (std::size_t r = 0; r < st.by_reason.size(); ++r)
    std::printf("  %-22s %zu\n", drop_reason_name(static_cast<DropReason>(r)), st.by_reason[r]);
  EXPECT_EQ(split.valid.size(), 500u);
  for (std::size_t i = 0; i < 8; ++i)
    std::printf("  %s  =>  %s\n", split.train.src[i].c_str(), split.train.tgt[i].c_str());
  for (const std::string& s : split.train.src) ASSERT_FALSE(has_format_markup(s)) << s;
}
