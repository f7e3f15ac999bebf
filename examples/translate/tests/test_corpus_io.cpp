// Parallel text files (corpus_io.hpp): UTF-8 validation, plain and gzip reading within the caps
// of one text file, stdin's line reader, atomic writes, and the errors that name the file.
#include <gtest/gtest.h>
#include <zlib.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <attn/error.hpp>

#include "error_helpers.hpp"
#include "temp_paths.hpp"

#include "corpus_io.hpp"

namespace fs = std::filesystem;
using namespace attn::translate;
using attn::testing::error_of;
using attn::translate::testing::read_file;
using attn::translate::testing::temp_dir;
using attn::translate::testing::write_file;

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
  write_file(dir / "crlf.txt", "one\r\ntwo\r\nthree");
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
  EXPECT_NE(e.find("; a gzip file that inflates this far is refused"), std::string::npos) << e;
  // A plain file (/dev/zero, say) is no gzip file: the message does not call it one.
  write_lines((dir / "plain").string(), {std::string(kCap, 'p')});
  const std::string plain =
      error_of<attn::FormatError>([&] { read_lines((dir / "plain").string(), kCap); });
  EXPECT_NE(plain.find("holds more than 1048576 bytes of text (the limit of one text file)"),
            std::string::npos)
      << plain;
  EXPECT_EQ(plain.find("gzip"), std::string::npos) << plain;
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
  const std::string a = read_file(dir / "a.gz"), b = read_file(dir / "b.gz");
  write_file(dir / "ab.gz", a + b + std::string(100000, '\0'));
  const std::vector<std::string> lines = read_lines((dir / "ab.gz").string());
  ASSERT_EQ(lines.size(), 30002u);
  EXPECT_EQ(lines[1], "two");
  EXPECT_EQ(lines[30001], "three four five");

  write_file(dir / "tail.gz", a + std::string(3, '\0') + "more text\n");
  const std::string t =
      error_of<attn::FormatError>([&] { read_lines((dir / "tail.gz").string()); });
  EXPECT_NE(t.find("tail.gz' has bytes after its gzip stream that are neither another gzip member "
                   "nor zeros (byte 0x6d at offset " +
                   std::to_string(a.size() + 3) + ")"),
            std::string::npos)
      << t;

  // Bytes after the stream that begin like a member but are none.
  write_file(dir / "magic.gz", a + "\x1f hi");
  const std::string m =
      error_of<attn::FormatError>([&] { read_lines((dir / "magic.gz").string()); });
  EXPECT_NE(m.find("magic.gz' is not a valid gzip stream: incorrect header check (in the bytes "
                   "after its first member, from offset " +
                   std::to_string(a.size()) + ")"),
            std::string::npos)
      << m;
  write_file(dir / "lone.gz", a + "\x1f");
  const std::string l =
      error_of<attn::FormatError>([&] { read_lines((dir / "lone.gz").string()); });
  EXPECT_NE(l.find("lone.gz' is a truncated or corrupt gzip stream: it ends in the member from "
                   "offset " +
                   std::to_string(a.size())),
            std::string::npos)
      << l;

  std::string corrupt = b;
  for (std::size_t i = 20; i < 40; ++i) corrupt[i] = static_cast<char>(~corrupt[i]);
  write_file(dir / "bad.gz", corrupt);
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

// A write that fails part-way (here: the file size limit, as a full disk would) leaves the old
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

  write_file(dir / "bad.txt", "fine\nalso fine\nbroken \xc3\x28 here\n");
  const std::string u = error_of<attn::DataError>([&] { read_lines((dir / "bad.txt").string()); });
  EXPECT_NE(u.find("bad.txt' line 3: expected UTF-8 text, found an invalid byte sequence at byte "
                   "offset 7"),
            std::string::npos)
      << u;

  // A gzip stream cut in half.
  write_lines((dir / "c.gz").string(), std::vector<std::string>(2000, "some compressible text"));
  const std::string gz = read_file(dir / "c.gz");
  write_file(dir / "cut.gz", gz.substr(0, gz.size() / 2));
  const std::string g = error_of<attn::FormatError>([&] { read_lines((dir / "cut.gz").string()); });
  EXPECT_NE(g.find("cut.gz' is a truncated or corrupt gzip stream"), std::string::npos) << g;
}
