// safetensors I/O: round trips of every dtype, every kind of corruption and truncation, and
// atomic writes (a failed or redirected write leaves the old file and no temporary).
//
// Interoperability with PyTorch is checked outside this test (Debian's python has no safetensors
// package): tests/tools/read_safetensors.py reads a file written by save_model into torch tensors
// and torch.nn.Linear.load_state_dict, and writes one (--write) that load_safetensors reads back.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <attn/train/safetensors.hpp>

#include <cstdio>
#include <fstream>
#include <limits>

#include "error_helpers.hpp"
#include "pch.hpp"
#include "sanitizers.hpp"
#include "temp_dir.hpp"

namespace attn {
namespace {

using testing::contains;
using testing::error_of;
using testing::read_file;
using testing::write_file;

class SafetensorsIo : public testing::TempDirTest {
 protected:
  void TearDown() override {
    detail::safetensors_fail_after_bytes() = std::numeric_limits<std::size_t>::max();
    detail::directory_fsync_fails_with() = 0;
    TempDirTest::TearDown();
  }
  /// A file with header `json` (unpadded) and `data_bytes` zero bytes of data.
  static std::string raw_file(const std::string& json, std::size_t data_bytes,
                              std::uint64_t n = 0) {
    if (n == 0) n = json.size();
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>(n >> (8 * i));
    return s + json + std::string(data_bytes, '\0');
  }
  /// load_safetensors' FormatError message for a file holding `bytes` (parsed in memory when
  /// `in_memory`, for the loops over thousands of corruptions).
  std::string format_error(const std::string& bytes, bool in_memory = false) {
    if (!in_memory) write_file(path("bad.safetensors"), bytes);
    try {
      if (in_memory)
        parse_safetensors(std::vector<unsigned char>(bytes.begin(), bytes.end()),
                          path("bad.safetensors"));
      else
        load_safetensors(path("bad.safetensors"));
    } catch (const FormatError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("(wrong exception) ") + e.what();
    }
    return "(no exception)";
  }
};

Tensor<float> arange_f(const Shape& s, float start) {
  Tensor<float> t(s);
  for (Index i = 0; i < t.numel(); ++i) t.data()[i] = start + 0.25f * static_cast<float>(i);
  return t;
}

std::vector<TensorEntry> sample_entries() {
  auto f = arange_f({2, 3}, -1.0f);
  auto d = Tensor<double>::from({4}, {1e-300, -2.5, 3.141592653589793, 1e300});
  auto i64 = Tensor<std::int64_t>::from({3}, {-1, 0, std::numeric_limits<std::int64_t>::max()});
  auto i32 = Tensor<TokenId>::from({2, 2}, {7, -8, 9, 10});
  return {tensor_entry("layer.weight", f),
          tensor_entry("scale", d),
          tensor_entry("ids64", i64),
          tensor_entry("ids32", i32),
          tensor_entry("empty", Tensor<float>({0, 5})),
          tensor_entry("scalar", Tensor<double>::full(Shape{}, 0.5))};
}

TEST_F(SafetensorsIo, SafetensorsRoundTripsEveryDtypeAndMetadata) {
  const auto entries = sample_entries();
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"config", "{\"d_model\": 512, \"s\": \"\\u00e9\"}"}};
  save_safetensors(path("a.safetensors"), entries, meta);
  const SafetensorsFile f = load_safetensors(path("a.safetensors"));
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.size(), entries.size());
  std::size_t offset = 0;
  for (std::size_t k = 0; k < entries.size(); ++k) {
    const auto& e = entries[k];
    EXPECT_EQ(f.names()[k], e.name);  // header order is the order given
    const TensorInfo& ti = f.info(e.name);
    EXPECT_EQ(ti.dtype, e.dtype) << e.name;
    EXPECT_EQ(ti.shape, e.shape) << e.name;
    EXPECT_EQ(ti.begin, offset) << e.name;  // contiguous, in order
    EXPECT_EQ(ti.end - ti.begin, e.nbytes) << e.name;
    if (e.nbytes > 0) {
      EXPECT_EQ(std::memcmp(f.bytes(e.name), e.data, e.nbytes), 0) << e.name;
    }
    offset += e.nbytes;
  }
  const Tensor<double> d = f.tensor<double>("scale");
  EXPECT_EQ(d.shape(), Shape({4}));
  EXPECT_EQ(d(3), 1e300);
  EXPECT_EQ(f.tensor<std::int64_t>("ids64")(2), std::numeric_limits<std::int64_t>::max());
  EXPECT_EQ(f.tensor<TokenId>("ids32")(0, 1), -8);
  EXPECT_EQ(f.tensor<double>("scalar").numel(), 1);
  EXPECT_EQ(f.tensor<float>("empty").shape(), Shape({0, 5}));
  EXPECT_TRUE(contains(error_of([&] { f.tensor<float>("scale"); }), "has dtype F64, expected F32"));
  EXPECT_TRUE(contains(error_of([&] { f.info("nope"); }), "no tensor named 'nope'"));

  // Layout: 8-byte length, a '{'-first header padded with spaces to a multiple of 8, the data.
  const std::string raw = read_file(path("a.safetensors"));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(raw[static_cast<std::size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw[8], '{');
  EXPECT_EQ(raw.size(), 8 + n + offset);
  EXPECT_EQ(raw.substr(8, n).find("\"__metadata__\""), 1u);  // metadata first, as the reference
}

TEST_F(SafetensorsIo, SafetensorsWriterRejectsBadEntries) {
  auto t = arange_f({2}, 0);
  EXPECT_TRUE(contains(error_of([&] {
                         save_safetensors(path("x"), {tensor_entry("a", t), tensor_entry("a", t)});
                       }),
                       "'a' appears twice"));
  EXPECT_THROW(save_safetensors(path("x"), {tensor_entry("__metadata__", t)}), ConfigError);
  EXPECT_THROW(save_safetensors(path("x"), {tensor_entry("", t)}), ConfigError);
  auto e = tensor_entry("a", t);
  e.shape = {3};
  EXPECT_TRUE(
      contains(error_of([&] { save_safetensors(path("x"), {e}); }), "needs 12 bytes, got 8"));
  EXPECT_TRUE(list().empty());  // nothing written
  // bytes_entry carries dtypes attn does not compute in.
  save_safetensors(path("h.safetensors"), {bytes_entry("h", Dtype::F16, {2}, {0, 0x3c, 0, 0xc0})});
  const auto f = load_safetensors(path("h.safetensors"));
  EXPECT_EQ(f.info("h").dtype, Dtype::F16);
  EXPECT_EQ(f.bytes("h")[1], 0x3c);
}

TEST_F(SafetensorsIo, MissingOrUnreadableFileIsIOErrorNamingThePath) {
  const std::string p = path("missing.safetensors");
  try {
    load_safetensors(p);
    FAIL() << "no exception";
  } catch (const FormatError& e) {
    FAIL() << "a missing file is not a format error: " << e.what();
  } catch (const IOError& e) {
    EXPECT_TRUE(contains(e.what(), p)) << e.what();
    EXPECT_TRUE(contains(e.what(), "No such file")) << e.what();
  }
  ASSERT_EQ(::mkdir(path("adir").c_str(), 0755), 0);
  EXPECT_TRUE(contains(error_of([&] { load_safetensors(path("adir")); }), path("adir")));
  EXPECT_THROW(load_safetensors(path("adir")), IOError);
  EXPECT_TRUE(contains(error_of([&] { save_safetensors(path("nodir/x.safetensors"), {}); }),
                       "nodir/x.safetensors"));
}

TEST_F(SafetensorsIo, AConsistentFileTooLargeForMemoryIsAnIOErrorNamingIt) {
  // A well-formed file of one 4 GiB tensor (a sparse hole), read in a child process whose address
  // space is 2 GB: std::bad_alloc, naming no file, before the read became an IOError.
  if (testing::kSanitized) GTEST_SKIP() << "address-space limits do not work under ASan or TSan";
  const std::uint64_t data = std::uint64_t{4} << 30;
  const std::string p = path("huge.safetensors");
  write_file(p, raw_file(R"({"w":{"dtype":"F32","shape":[1073741824],"data_offsets":[0,)" +
                             std::to_string(data) + "]}}",
                         0));
  const std::uint64_t size = std::filesystem::file_size(p) + data;
  ASSERT_EQ(::truncate(p.c_str(), static_cast<off_t>(size)), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const rlimit limit{std::uint64_t{2} << 30, std::uint64_t{2} << 30};
    if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(4);
    int code = 2;  // no exception
    try {
      load_safetensors(p);
    } catch (const IOError& e) {
      code = contains(e.what(), "cannot read " + p + ": its " + std::to_string(size) +
                                    " bytes do not fit in this machine's memory")
                 ? 0
                 : 1;
      if (code != 0) std::fprintf(stderr, "%s\n", e.what());
    } catch (...) {
      code = 3;
    }
    ::_exit(code);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: another message, 2: no error, 3: another exception";
}

TEST_F(SafetensorsIo, EveryKindOfCorruptionIsAFormatErrorSayingWhat) {
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(format_error(raw_file(good, 8)), "(no exception)");
  struct Case {
    std::string bytes, message;
  };
  const std::vector<Case> cases = {
      {"", "file is 0 bytes, shorter than the 8-byte header length"},
      {std::string(7, '\0'), "file is 7 bytes"},
      {raw_file(good, 8, 4096), "header length 4096 runs past the end of the file (70 bytes)"},
      {raw_file(good, 8, 200'000'000), "header length 200000000 exceeds the limit"},
      {raw_file(good, 8, 0xffffffffffffffffULL), "exceeds the limit"},
      {raw_file(R"({"a":{"dtype":"F32",)", 0), "header is not valid JSON"},
      {raw_file(R"(["a", 1])", 0), "does not start with a JSON object"},
      {raw_file(R"({"a": 3})", 0), "tensor a: entry is not an object"},
      {raw_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8),
       "missing or non-string \"dtype\""},
      {raw_file(R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", 8),
       "non-string \"dtype\""},
      {raw_file(R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})", 8),
       "non-array \"shape\""},
      {raw_file(R"({"a":{"dtype":"F32","shape":[2]}})", 8),
       "\"data_offsets\" must be an array of two"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", 8), "array of two"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-1,8]}})", 8), "array of two"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       "shape entries must be non-negative integers, got -2"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8), "got 2.5"},
      {raw_file(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8),
       "unknown dtype \"F33\""},
      {raw_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "tensor a: dtype F32 and shape [3] need 12 bytes, but data_offsets [0, 8] hold 8"},
      {raw_file(
           R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})",
           8),
       "is too large"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8),
       "data_offsets [0, 16] are out of bounds of the 8-byte data buffer"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "out of bounds"},
      {raw_file(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
           12),
       "tensor b starts at byte 4 of the data buffer but the previous tensor a ends at byte 8 "
       "(overlap)"},
      {raw_file(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
           16),
       "tensor b starts at byte 12 of the data buffer but the previous tensor a ends at byte 8 "
       "(gap)"},
      {raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       "but data starts at byte 0 (gap)"},
      {raw_file(good, 12), "the tensors cover 8 bytes but the data buffer holds 12"},
      {raw_file(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           8),
       "tensor name 'a' appears twice in the header"},
      {raw_file(R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                8),
       "__metadata__ value of 'k' is not a string"},
      {raw_file(R"({"__metadata__":[1],"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
       "__metadata__ must be an object"},
      {raw_file("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
       "not valid JSON"},
  };
  for (const auto& c : cases) {
    const std::string msg = format_error(c.bytes);
    EXPECT_TRUE(contains(msg, c.message)) << "expected: " << c.message << "\n     got: " << msg;
    EXPECT_TRUE(contains(msg, path("bad.safetensors"))) << msg;
  }
}

TEST_F(SafetensorsIo, EveryTruncationIsAFormatError) {
  save_safetensors(path("a.safetensors"), sample_entries(), {{"k", "v"}});
  const std::string raw = read_file(path("a.safetensors"));
  ASSERT_GT(raw.size(), 300u);
  for (std::size_t len = 0; len < raw.size(); ++len) {
    const std::string msg = format_error(raw.substr(0, len), /*in_memory=*/len % 16 != 0);
    EXPECT_FALSE(contains(msg, "(no exception)") || contains(msg, "(wrong exception)"))
        << "truncated at " << len << ": " << msg;
  }
}

TEST_F(SafetensorsIo, FlippedHeaderBytesNeverCrash) {
  save_safetensors(path("a.safetensors"), sample_entries(), {{"k", "v"}});
  const std::string raw = read_file(path("a.safetensors"));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(raw[static_cast<std::size_t>(i)]);
  int format_errors = 0, loads = 0;
  for (std::size_t pos = 0; pos < 8 + n; ++pos) {
    for (unsigned char mask : {0x01, 0x20, 0x80, 0xff}) {
      std::string bad = raw;
      bad[pos] = static_cast<char>(static_cast<unsigned char>(bad[pos]) ^ mask);
      const std::string msg = format_error(bad, /*in_memory=*/true);
      if (msg == "(no exception)") {
        ++loads;  // e.g. a changed letter in a name or metadata value: still a valid file
      } else {
        EXPECT_FALSE(contains(msg, "(wrong exception)")) << "byte " << pos << ": " << msg;
        ++format_errors;
      }
    }
  }
  EXPECT_GT(format_errors, 3 * loads);  // most flips break the structure and are caught
}

TEST_F(SafetensorsIo, FailedSaveLeavesTheOldFileAndNoTemporary) {
  const std::string p = path("model.safetensors");
  auto old_t = arange_f({4, 4}, 1.0f);
  save_safetensors(p, {tensor_entry("w", old_t)}, {{"v", "old"}});
  const std::string before = read_file(p);
  // A write failing midway (the disk fills up after 100 bytes).
  detail::safetensors_fail_after_bytes() = 100;
  auto new_t = arange_f({64, 64}, 2.0f);
  const std::string msg = error_of([&] {
    save_safetensors(p, {tensor_entry("w", new_t)}, {{"v", "new"}});
  });
  detail::safetensors_fail_after_bytes() = std::numeric_limits<std::size_t>::max();
  EXPECT_TRUE(contains(msg, "cannot write " + p)) << msg;
  EXPECT_TRUE(contains(msg, "No space left")) << msg;
  EXPECT_EQ(read_file(p), before);
  EXPECT_EQ(list(), std::vector<std::string>{"model.safetensors"});  // temporary removed
  EXPECT_EQ(load_safetensors(p).metadata().at("v"), "old");

  // The temporary path cannot be created (a directory is in the way).
  const std::string tmp = p + ".attn-tmp." + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(tmp.c_str(), 0755), 0);
  EXPECT_THROW(save_safetensors(p, {tensor_entry("w", new_t)}), IOError);
  EXPECT_TRUE(contains(error_of([&] { save_safetensors(p, {tensor_entry("w", new_t)}); }),
                       "cannot create " + tmp));
  EXPECT_EQ(read_file(p), before);
  ASSERT_EQ(::rmdir(tmp.c_str()), 0);

  // A stray truncated temporary of a crashed writer does not affect the real file, and the next
  // save goes through.
  write_file(p + ".attn-tmp.99999", before.substr(0, 20));
  EXPECT_EQ(load_safetensors(p).metadata().at("v"), "old");
  save_safetensors(p, {tensor_entry("w", new_t)}, {{"v", "new"}});
  EXPECT_EQ(load_safetensors(p).metadata().at("v"), "new");
  EXPECT_EQ(load_safetensors(p).tensor<float>("w")(63, 63), new_t(63, 63));
}

TEST_F(SafetensorsIo, APlantedSymlinkAtTheTemporaryNameIsNotFollowed) {
  // The temporary file was opened with O_CREAT|O_TRUNC: a symlink planted under its predictable
  // name redirected the write (and truncated its target). Now it is refused.
  const std::string p = path("model.safetensors"), victim = path("victim.txt");
  write_file(victim, "precious");
  const std::string tmp = atomic_temp_path(p);
  ASSERT_EQ(::symlink(victim.c_str(), tmp.c_str()), 0);
  auto t = arange_f({2, 2}, 1.0f);
  const std::string msg = error_of([&] { save_safetensors(p, {tensor_entry("w", t)}); });
  EXPECT_TRUE(contains(msg, "cannot create " + tmp)) << msg;
  EXPECT_EQ(read_file(victim), "precious");
  EXPECT_FALSE(std::ifstream(p).good());
  ::unlink(tmp.c_str());
  // A regular file of this pid at that name is a leftover of ours and is replaced.
  write_file(tmp, "partial");
  save_safetensors(p, {tensor_entry("w", t)});
  EXPECT_EQ(load_safetensors(p).tensor<float>("w")(1, 1), t(1, 1));
  EXPECT_EQ(list(), (std::vector<std::string>{"model.safetensors", "victim.txt"}));
}

TEST_F(SafetensorsIo, AFailedDirectorySyncAfterTheRenameIsAWarningNotAFailedSave) {
  // It used to throw "cannot fsync directory" although the new file was already in place, so a
  // caller believed the save had failed and the old file survived.
  const std::string p = path("model.safetensors");
  auto t = arange_f({2, 2}, 3.0f);
  detail::directory_fsync_fails_with() = EIO;
  AtomicWriteResult r;
  EXPECT_NO_THROW(r = save_safetensors(p, {tensor_entry("w", t)}));
  detail::directory_fsync_fails_with() = 0;
  EXPECT_TRUE(contains(r.warning, p + " was written completely, but cannot fsync directory"))
      << r.warning;
  EXPECT_TRUE(contains(r.warning, "may not survive a power loss")) << r.warning;
  EXPECT_EQ(load_safetensors(p).tensor<float>("w")(1, 1), t(1, 1));
  EXPECT_TRUE(save_safetensors(p, {tensor_entry("w", t)}).warning.empty());
}

TEST_F(SafetensorsIo, APathTurnedIntoAFifoDuringTheWriteIsNotReplaced) {
  // The target was checked once, before the body ran: a FIFO put in its place while a large file
  // was being written was then replaced by the regular file. Now it is checked again before the
  // rename, and the temporary is removed.
  const std::string p = path("out.txt");
  write_file(p, "old");
  const std::string msg = error_of([&] {
    write_file_atomically(p, [&](int fd, std::size_t& written) {
      ::unlink(p.c_str());
      EXPECT_EQ(::mkfifo(p.c_str(), 0644), 0);
      return detail::write_all(fd, "new", 3, written);
    });
  });
  EXPECT_TRUE(contains(msg, "refusing to write " + p + ": it is a FIFO")) << msg;
  struct stat st {};
  ASSERT_EQ(::lstat(p.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(list(), std::vector<std::string>{"out.txt"});  // no temporary left
}

}  // namespace
}  // namespace attn
