// .mo catalogs, the gettext corpus and parallel text files.
#include <gtest/gtest.h>
#include <zlib.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <attn/error.hpp>

#include "error_helpers.hpp"
#include "temp_paths.hpp"

#include "corpus_io.hpp"
#include "gettext_corpus.hpp"
#include "mo_catalog.hpp"

namespace fs = std::filesystem;
using namespace attn::translate;
using attn::testing::error_of;
using attn::translate::testing::temp_dir;

namespace {

// A minimal .mo writer, independent of the parser: header, original table, translation table,
// no hash table, then the strings, each followed by a NUL.
struct RawEntry {
  std::string original, translation;
};

void put32(std::string& out, std::size_t at, std::uint32_t v, bool big) {
  for (int k = 0; k < 4; ++k) {
    const int shift = big ? 24 - 8 * k : 8 * k;
    out[at + static_cast<std::size_t>(k)] = static_cast<char>((v >> shift) & 0xFF);
  }
}

std::string make_mo(const std::vector<RawEntry>& entries, bool big_endian = false,
                    std::uint32_t revision = 0) {
  const std::size_t n = entries.size();
  const std::size_t originals = 28, translations = 28 + 8 * n;
  std::string out(28 + 16 * n, '\0');
  put32(out, 0, 0x950412de, big_endian);
  put32(out, 4, revision, big_endian);
  put32(out, 8, static_cast<std::uint32_t>(n), big_endian);
  put32(out, 12, static_cast<std::uint32_t>(originals), big_endian);
  put32(out, 16, static_cast<std::uint32_t>(translations), big_endian);
  put32(out, 20, 0, big_endian);
  put32(out, 24, static_cast<std::uint32_t>(out.size()), big_endian);
  auto add = [&](std::size_t table, std::size_t i, const std::string& s) {
    put32(out, table + 8 * i, static_cast<std::uint32_t>(s.size()), big_endian);
    put32(out, table + 8 * i + 4, static_cast<std::uint32_t>(out.size()), big_endian);
    out += s;
    out += '\0';
  };
  for (std::size_t i = 0; i < n; ++i) add(originals, i, entries[i].original);
  for (std::size_t i = 0; i < n; ++i) add(translations, i, entries[i].translation);
  return out;
}

std::vector<RawEntry> sample_entries() {
  using namespace std::string_literals;
  return {{"", "Content-Type: text/plain; charset=UTF-8\n"},
          {"Open the file",
           "Datei \xc3\xb6"
           "ffnen"},
          {"menu\x04_Quit", "_Beenden"},
          {"One file\0%d files"s, "Eine Datei\0%d Dateien"s}};
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
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

TEST(MoCatalog, MissingFileIsIOError) {
  EXPECT_NE(error_of<attn::IOError>([] {
              read_mo_file("/nonexistent/x.mo");
            }).find("'/nonexistent/x.mo'"),
            std::string::npos);
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
  write_bytes(d1 / "a.mo", make_mo(a));
  write_bytes(d1 / "b.mo", make_mo(b));
  write_bytes(d1 / "c.mo", make_mo(c, true));
  write_bytes(d1 / "ignored.txt", "not a catalog");
  // Same content under names that list in another order.
  write_bytes(d2 / "z.mo", make_mo(a));
  write_bytes(d2 / "m.mo", make_mo(b, true));
  write_bytes(d2 / "a.mo", make_mo(c));
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

// ------------------------------------------------------------------------------- parallel text

TEST(Utf8, Validator) {
  EXPECT_TRUE(is_valid_utf8("plain ascii"));
  EXPECT_TRUE(is_valid_utf8("\xc3\xa4\xe2\x82\xac\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf"));
  EXPECT_EQ(find_invalid_utf8("ab\x80"), 2u);            // stray continuation
  EXPECT_EQ(find_invalid_utf8("a\xc0\xaf"), 1u);         // overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xe0\x80\xaf"), 0u);      // overlong 3-byte
  EXPECT_EQ(find_invalid_utf8("\xf0\x80\x80\xaf"), 0u);  // overlong 4-byte
  EXPECT_EQ(find_invalid_utf8("x\xed\xa0\x80"), 1u);     // surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0u);  // U+110000
  EXPECT_EQ(find_invalid_utf8("ok\xe2\x82"), 2u);        // truncated
  EXPECT_EQ(find_invalid_utf8("\xff"), 0u);
  EXPECT_EQ(find_invalid_utf8("\xc3\xa4\xc3("), 2u);  // bad continuation
}

TEST(CorpusIo, PlainAndGzipRoundTrip) {
  const fs::path dir = temp_dir("io");
  const std::vector<std::string> en{"a man sleeps .", "two dogs run"};
  const std::vector<std::string> de{
      "ein mann schl\xc3\xa4"
      "ft .",
      "zwei hunde rennen"};
  write_lines((dir / "x.en").string(), en);
  write_lines((dir / "x.de.gz").string(), de);
  const ParallelCorpus c = read_parallel((dir / "x.en").string(), (dir / "x.de.gz").string());
  EXPECT_EQ(c.src, en);
  EXPECT_EQ(c.tgt, de);
  // CRLF endings and a last line without '\n'.
  write_bytes(dir / "crlf.txt", "one\r\ntwo\r\nthree");
  EXPECT_EQ(read_lines((dir / "crlf.txt").string()),
            (std::vector<std::string>{"one", "two", "three"}));
}

// A gzip bomb: 64 KB that inflate to 64 MB. Reading stops at the cap (1 MB here; 1 GiB by
// default) with an error naming it, before the text grows past the cap; it used to read it all.
TEST(CorpusIo, GzipBombStopsAtTheCap) {
  const fs::path dir = temp_dir("bomb");
  const std::string bomb = (dir / "bomb.gz").string();
  gzFile f = gzopen(bomb.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  const std::string chunk(1 << 20, 'a');
  for (int i = 0; i < 64; ++i)
    ASSERT_EQ(gzwrite(f, chunk.data(), static_cast<unsigned>(chunk.size())), 1 << 20);
  ASSERT_EQ(gzclose(f), Z_OK);
  ASSERT_LT(fs::file_size(bomb), 1u << 17);
  constexpr std::size_t kCap = 1 << 20;
  const std::string e = error_of<attn::FormatError>([&] { read_lines(bomb, kCap); });
  EXPECT_NE(e.find("bomb.gz' holds more than 1048576 bytes of text (the limit of one text file"),
            std::string::npos)
      << e;
  ReadParallelOptions capped;
  capped.max_bytes = kCap;
  const std::string p = error_of<attn::FormatError>([&] { read_parallel(bomb, bomb, capped); });
  EXPECT_NE(p.find("more than 1048576 bytes"), std::string::npos) << p;
  // Text of exactly the cap is read; the default cap is the documented 1 GiB.
  write_lines((dir / "fits.gz").string(), {std::string(kCap - 1, 'b')});
  EXPECT_EQ(read_lines((dir / "fits.gz").string(), kCap).at(0).size(), kCap - 1);
  EXPECT_THROW(read_lines((dir / "fits.gz").string(), kCap - 1), attn::FormatError);
  EXPECT_EQ(kMaxTextFileBytes, std::size_t{1} << 30);
}

// 64 KB of gzip that inflate to 2^26 + 1 empty lines: refused before the lines are made (each
// line took 32 bytes, 2 GiB here, and 1 GiB of empty lines would have taken 32 GiB).
TEST(CorpusIo, MoreLinesThanTheCapAreRefusedBeforeTheyAreMade) {
  const fs::path dir = temp_dir("lines");
  const std::string path = (dir / "newlines.gz").string();
  gzFile f = gzopen(path.c_str(), "wb9");
  ASSERT_NE(f, nullptr);
  const std::string chunk(1 << 20, '\n');
  for (std::size_t i = 0; i < kMaxTextFileLines >> 20; ++i)
    ASSERT_EQ(gzwrite(f, chunk.data(), static_cast<unsigned>(chunk.size())), 1 << 20);
  ASSERT_EQ(gzwrite(f, "x", 1), 1);  // a last line without '\n' counts too
  ASSERT_EQ(gzclose(f), Z_OK);
  const std::string e = error_of<attn::FormatError>([&] { read_lines(path); });
  EXPECT_NE(e.find("newlines.gz' has 67108865 lines, more than the 67108864 of one text file"),
            std::string::npos)
      << e;
}

// gzip members one after another are read as gzip -d reads them; zeros after the last are
// padding; anything else after it is named (zlib's gzread dropped it in silence).
TEST(CorpusIo, GzipMembersPaddingAndTrailingBytes) {
  const fs::path dir = temp_dir("members");
  write_lines((dir / "a.gz").string(), {"one", "two"});
  write_lines((dir / "b.gz").string(), std::vector<std::string>(30000, "three four five"));
  std::ifstream ina(dir / "a.gz", std::ios::binary), inb(dir / "b.gz", std::ios::binary);
  const std::string a((std::istreambuf_iterator<char>(ina)), std::istreambuf_iterator<char>());
  const std::string b((std::istreambuf_iterator<char>(inb)), std::istreambuf_iterator<char>());
  write_bytes(dir / "ab.gz", a + b + std::string(100000, '\0'));
  const std::vector<std::string> lines = read_lines((dir / "ab.gz").string());
  ASSERT_EQ(lines.size(), 30002u);
  EXPECT_EQ(lines[1], "two");
  EXPECT_EQ(lines[30001], "three four five");

  write_bytes(dir / "tail.gz", a + std::string(3, '\0') + "more text\n");
  const std::string t =
      error_of<attn::FormatError>([&] { read_lines((dir / "tail.gz").string()); });
  EXPECT_NE(t.find("tail.gz' has bytes after its gzip stream that are neither another gzip member "
                   "nor zeros (byte 0x6d at offset " +
                   std::to_string(a.size() + 3) + ")"),
            std::string::npos)
      << t;

  // Bytes after the stream that begin like a member but are none.
  write_bytes(dir / "magic.gz", a + "\x1f hi");
  const std::string m =
      error_of<attn::FormatError>([&] { read_lines((dir / "magic.gz").string()); });
  EXPECT_NE(m.find("magic.gz' is not a valid gzip stream: incorrect header check (in the bytes "
                   "after its first member, from offset " +
                   std::to_string(a.size()) + ")"),
            std::string::npos)
      << m;
  write_bytes(dir / "lone.gz", a + "\x1f");
  const std::string l =
      error_of<attn::FormatError>([&] { read_lines((dir / "lone.gz").string()); });
  EXPECT_NE(l.find("lone.gz' is a truncated or corrupt gzip stream: it ends in the member from "
                   "offset " +
                   std::to_string(a.size())),
            std::string::npos)
      << l;

  std::string corrupt = b;
  for (std::size_t i = 20; i < 40; ++i) corrupt[i] = static_cast<char>(~corrupt[i]);
  write_bytes(dir / "bad.gz", corrupt);
  const std::string c = error_of<attn::FormatError>([&] { read_lines((dir / "bad.gz").string()); });
  EXPECT_NE(c.find("bad.gz' is not a valid gzip stream: "), std::string::npos) << c;
}

// read_line (translate's stdin): the line ends and the cap of read_lines, without reading on.
TEST(CorpusIo, ReadLineStopsAtTheCap) {
  std::istringstream in(
      "\xEF\xBB\xBF"  // a byte order mark, not part of the cap
      "ab\r\n\nabcd\r\nabc");
  std::string line;
  std::vector<std::string> got;
  while (read_line(in, line, 4, "<in>", got.size() + 1, "")) got.push_back(line);
  EXPECT_EQ(got, (std::vector<std::string>{"ab", "", "abcd", "abc"}));
  EXPECT_FALSE(read_line(in, line, 4, "<in>", 5, ""));

  // A line with no end: reading stops one byte past the cap.
  std::istringstream endless("ok\n" + std::string(1000, 'z'));
  ASSERT_TRUE(read_line(endless, line, 4, "<in>", 1, " (why)"));
  const std::string e =
      error_of<attn::DataError>([&] { read_line(endless, line, 4, "<in>", 2, " (why)"); });
  EXPECT_NE(e.find("<in> line 2 is longer than 4 bytes (why)"), std::string::npos) << e;
  EXPECT_EQ(endless.tellg(), std::streampos(3 + 6));
}

// file as it was and no temporary file behind; the failure is an IOError naming the path.
TEST(CorpusIo, FailedWriteKeepsTheOldFile) {
  const fs::path dir = temp_dir("atomic");
  const std::string path = (dir / "out.txt").string();
  write_lines(path, {"old", "content"});
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);  // the write then fails with EFBIG instead of killing us
    const rlimit limit{4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    try {
      write_lines(path, std::vector<std::string>(10000, "a line that will not fit"));
    } catch (const attn::IOError& e) {
      ::_exit(std::string(e.what()).find("out.txt") != std::string::npos ? 0 : 2);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(4);  // no error: the limit did not bite
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "0: IOError naming the file, 2: message, 3: other, 4: none";
  EXPECT_EQ(read_lines(path), (std::vector<std::string>{"old", "content"}));
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename(), "out.txt") << "left behind: " << entry.path();
  // And a successful write replaces it.
  write_lines(path, {"new"});
  EXPECT_EQ(read_lines(path), std::vector<std::string>{"new"});
}

TEST(CorpusIo, Multi30kIfPresent) {
  const char* shared = std::getenv("ATTN_SHARED_DIR");
  const fs::path dir = fs::path(shared ? shared : "/work/shared") / "data" / "multi30k";
  const fs::path en = dir / "train.lc.norm.tok.en.gz", de = dir / "train.lc.norm.tok.de.gz";
  if (!fs::exists(en) || !fs::exists(de)) GTEST_SKIP() << dir << " has no train files";
  const ParallelCorpus c = read_parallel(en.string(), de.string());
  EXPECT_GT(c.size(), 20000u);
  EXPECT_EQ(c.src.size(), c.tgt.size());
}

TEST(CorpusIo, Errors) {
  const fs::path dir = temp_dir("ioerr");
  const std::string missing = (dir / "missing.en").string();
  EXPECT_NE(error_of<attn::IOError>([&] { read_lines(missing); }).find(missing), std::string::npos);

  write_lines((dir / "a.en").string(), {"one", "two", "three"});
  write_lines((dir / "a.de").string(), {"eins", "zwei"});
  const std::string m = error_of<attn::DataError>(
      [&] { read_parallel((dir / "a.en").string(), (dir / "a.de").string()); });
  EXPECT_NE(m.find("a.en' has 3"), std::string::npos) << m;
  EXPECT_NE(m.find("a.de' has 2"), std::string::npos) << m;

  write_lines((dir / "b.en").string(), {"one", "two", "three"});
  write_lines((dir / "b.de").string(), {"eins", "  ", "drei"});
  const std::string e = error_of<attn::DataError>(
      [&] { read_parallel((dir / "b.en").string(), (dir / "b.de").string()); });
  EXPECT_NE(e.find("b.de' line 2: expected a sentence, found an empty line"), std::string::npos)
      << e;
  std::size_t skipped = 0;
  const ParallelCorpus kept = read_parallel((dir / "b.en").string(), (dir / "b.de").string(),
                                            ReadParallelOptions{EmptyLinePolicy::kSkip}, &skipped);
  EXPECT_EQ(skipped, 1u);
  EXPECT_EQ(kept.src, (std::vector<std::string>{"one", "three"}));

  write_bytes(dir / "bad.txt", "fine\nalso fine\nbroken \xc3\x28 here\n");
  const std::string u = error_of<attn::DataError>([&] { read_lines((dir / "bad.txt").string()); });
  EXPECT_NE(u.find("bad.txt' line 3: expected UTF-8 text, found an invalid byte sequence at byte "
                   "offset 7"),
            std::string::npos)
      << u;

  // A gzip stream cut in half.
  write_lines((dir / "c.gz").string(), std::vector<std::string>(2000, "some compressible text"));
  std::ifstream in(dir / "c.gz", std::ios::binary);
  std::string gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_bytes(dir / "cut.gz", gz.substr(0, gz.size() / 2));
  const std::string g = error_of<attn::FormatError>([&] { read_lines((dir / "cut.gz").string()); });
  EXPECT_NE(g.find("cut.gz' is a truncated or corrupt gzip stream"), std::string::npos) << g;
}
