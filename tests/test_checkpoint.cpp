// safetensors I/O (round trips, every corruption, atomic writes), model and training checkpoints,
// checkpoint averaging and the exponential moving average.
//
// Interoperability with PyTorch is checked outside this test (Debian's python has no safetensors
// package): tests/tools/read_safetensors.py reads a file written by save_model into torch tensors
// and torch.nn.Linear.load_state_dict, and writes one (--write) that load_safetensors reads back.
#include <dirent.h>
#include <sys/stat.h>
#include <attn/train/averaging.hpp>
#include <attn/train/checkpoint.hpp>
#include <attn/train/safetensors.hpp>
#include <attn/train/schedule.hpp>

#include <cstdio>
#include <fstream>
#include <iterator>

#include "error_helpers.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"

namespace attn {
namespace {

using testing::contains;
using testing::error_of;

/// A fresh empty directory per test, removed (with its files) afterwards.
class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "attn_ckpt_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    detail::safetensors_fail_after_bytes() = std::numeric_limits<std::size_t>::max();
    detail::directory_fsync_fails_with() = 0;
    for (const auto& f : list()) {
      const std::string p = dir_ + "/" + f;
      if (::rmdir(p.c_str()) != 0) std::remove(p.c_str());
    }
    ::rmdir(dir_.c_str());
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::vector<std::string> list() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(dir_.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::string(e->d_name) != "." && std::string(e->d_name) != "..")
          out.push_back(e->d_name);
      ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  static std::string read_bytes(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static void write_bytes(const std::string& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
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
    if (!in_memory) write_bytes(path("bad.safetensors"), bytes);
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

  std::string dir_;
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

TEST_F(Checkpoint, SafetensorsRoundTripsEveryDtypeAndMetadata) {
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
  const std::string raw = read_bytes(path("a.safetensors"));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<unsigned char>(raw[static_cast<std::size_t>(i)]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw[8], '{');
  EXPECT_EQ(raw.size(), 8 + n + offset);
  EXPECT_EQ(raw.substr(8, n).find("\"__metadata__\""), 1u);  // metadata first, as the reference
}

TEST_F(Checkpoint, SafetensorsWriterRejectsBadEntries) {
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

TEST_F(Checkpoint, MissingOrUnreadableFileIsIOErrorNamingThePath) {
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

TEST_F(Checkpoint, EveryKindOfCorruptionIsAFormatErrorSayingWhat) {
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

TEST_F(Checkpoint, EveryTruncationIsAFormatError) {
  save_safetensors(path("a.safetensors"), sample_entries(), {{"k", "v"}});
  const std::string raw = read_bytes(path("a.safetensors"));
  ASSERT_GT(raw.size(), 300u);
  for (std::size_t len = 0; len < raw.size(); ++len) {
    const std::string msg = format_error(raw.substr(0, len), /*in_memory=*/len % 16 != 0);
    EXPECT_FALSE(contains(msg, "(no exception)") || contains(msg, "(wrong exception)"))
        << "truncated at " << len << ": " << msg;
  }
}

TEST_F(Checkpoint, FlippedHeaderBytesNeverCrash) {
  save_safetensors(path("a.safetensors"), sample_entries(), {{"k", "v"}});
  const std::string raw = read_bytes(path("a.safetensors"));
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

TEST_F(Checkpoint, FailedSaveLeavesTheOldFileAndNoTemporary) {
  const std::string p = path("model.safetensors");
  auto old_t = arange_f({4, 4}, 1.0f);
  save_safetensors(p, {tensor_entry("w", old_t)}, {{"v", "old"}});
  const std::string before = read_bytes(p);
  // A write failing midway (the disk fills up after 100 bytes).
  detail::safetensors_fail_after_bytes() = 100;
  auto new_t = arange_f({64, 64}, 2.0f);
  const std::string msg = error_of([&] {
    save_safetensors(p, {tensor_entry("w", new_t)}, {{"v", "new"}});
  });
  detail::safetensors_fail_after_bytes() = std::numeric_limits<std::size_t>::max();
  EXPECT_TRUE(contains(msg, "cannot write " + p)) << msg;
  EXPECT_TRUE(contains(msg, "No space left")) << msg;
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_EQ(list(), std::vector<std::string>{"model.safetensors"});  // temporary removed
  EXPECT_EQ(load_safetensors(p).metadata().at("v"), "old");

  // The temporary path cannot be created (a directory is in the way).
  const std::string tmp = p + ".tmp." + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(tmp.c_str(), 0755), 0);
  EXPECT_THROW(save_safetensors(p, {tensor_entry("w", new_t)}), IOError);
  EXPECT_TRUE(contains(error_of([&] { save_safetensors(p, {tensor_entry("w", new_t)}); }),
                       "cannot create " + tmp));
  EXPECT_EQ(read_bytes(p), before);
  ASSERT_EQ(::rmdir(tmp.c_str()), 0);

  // A stray truncated temporary of a crashed writer does not affect the real file, and the next
  // save goes through.
  write_bytes(p + ".tmp.99999", before.substr(0, 20));
  EXPECT_EQ(load_safetensors(p).metadata().at("v"), "old");
  save_safetensors(p, {tensor_entry("w", new_t)}, {{"v", "new"}});
  EXPECT_EQ(load_safetensors(p).metadata().at("v"), "new");
  EXPECT_EQ(load_safetensors(p).tensor<float>("w")(63, 63), new_t(63, 63));
}

TEST_F(Checkpoint, APlantedSymlinkAtTheTemporaryNameIsNotFollowed) {
  // The temporary file was opened with O_CREAT|O_TRUNC: a symlink planted under its predictable
  // name redirected the write (and truncated its target). Now it is refused.
  const std::string p = path("model.safetensors"), victim = path("victim.txt");
  write_bytes(victim, "precious");
  const std::string tmp = atomic_temp_path(p);
  ASSERT_EQ(::symlink(victim.c_str(), tmp.c_str()), 0);
  auto t = arange_f({2, 2}, 1.0f);
  const std::string msg = error_of([&] { save_safetensors(p, {tensor_entry("w", t)}); });
  EXPECT_TRUE(contains(msg, "cannot create " + tmp)) << msg;
  EXPECT_EQ(read_bytes(victim), "precious");
  EXPECT_FALSE(std::ifstream(p).good());
  ::unlink(tmp.c_str());
  // A regular file of this pid at that name is a leftover of ours and is replaced.
  write_bytes(tmp, "partial");
  save_safetensors(p, {tensor_entry("w", t)});
  EXPECT_EQ(load_safetensors(p).tensor<float>("w")(1, 1), t(1, 1));
  EXPECT_EQ(list(), (std::vector<std::string>{"model.safetensors", "victim.txt"}));
}

TEST_F(Checkpoint, AFailedDirectorySyncAfterTheRenameIsAWarningNotAFailedSave) {
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

TEST_F(Checkpoint, APathTurnedIntoAFifoDuringTheWriteIsNotReplaced) {
  // The target was checked once, before the body ran: a FIFO put in its place while a large file
  // was being written was then replaced by the regular file. Now it is checked again before the
  // rename, and the temporary is removed.
  const std::string p = path("out.txt");
  write_bytes(p, "old");
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

/// Registers children under torch.nn.Transformer-like dotted names.
template <class T>
struct TwoLayers : Module<T> {
  TwoLayers(Index d, Index f, bool bias2 = true) : linear1(d, f), linear2(f, d, bias2) {
    this->register_module("encoder.layers.0.linear1", &linear1);
    this->register_module("encoder.layers.0.linear2", &linear2);
    Rng rng(static_cast<std::uint64_t>(d * 131 + f));
    linear1.reset_parameters(rng);
    linear2.reset_parameters(rng);
    fill_normal(linear1.bias.value, rng, 0, 1);
  }
  Linear<T> linear1, linear2;
};

template <class T>
bool same_bits(const std::vector<NamedParameter<T>>& a, const std::vector<NamedParameter<T>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k)
    if (a[k].name != b[k].name || a[k].value.shape() != b[k].value.shape() ||
        std::memcmp(a[k].value.data(), b[k].value.data(), a[k].value.numel() * sizeof(T)) != 0)
      return false;
  return true;
}

TEST_F(Checkpoint, ModelRoundTripIsBitExact) {
  TwoLayers<float> a(4, 8);
  save_model(path("m.safetensors"), a, {{"config", "{}"}});
  TwoLayers<float> b(4, 8);
  b.linear1.weight.value.fill(0);
  EXPECT_FALSE(same_bits(a.parameters(), b.parameters()));
  const auto meta = load_model(path("m.safetensors"), b);
  EXPECT_TRUE(same_bits(a.parameters(), b.parameters()));
  EXPECT_EQ(meta.at("config"), "{}");
  const auto names = load_safetensors(path("m.safetensors")).names();
  EXPECT_EQ(names.front(), "encoder.layers.0.linear1.weight");
}

TEST_F(Checkpoint, LoadModelNamesTheTensorThatDoesNotFit) {
  TwoLayers<float> model(4, 8);
  const Tensor<float> before = model.linear1.weight.value.clone();
  auto unchanged = [&] {
    return std::memcmp(before.data(), model.linear1.weight.value.data(), before.numel() * 4) == 0;
  };
  TwoLayers<float> wrong_shape(4, 6);
  save_model(path("shape.safetensors"), wrong_shape);
  std::string msg = error_of([&] { load_model(path("shape.safetensors"), model); });
  EXPECT_TRUE(contains(msg,
                       "checkpoint tensor encoder.layers.0.linear1.weight: expected shape [8, 4], "
                       "file has [6, 4]"))
      << msg;
  EXPECT_THROW(load_model(path("shape.safetensors"), model), FormatError);

  TwoLayers<float> no_bias(4, 8, false);
  save_model(path("nobias.safetensors"), no_bias);
  msg = error_of([&] { load_model(path("nobias.safetensors"), model); });
  EXPECT_TRUE(contains(msg, "has no tensor encoder.layers.0.linear2.bias (expected shape [4])"))
      << msg;
  EXPECT_TRUE(unchanged());  // checked before anything is copied

  save_model(path("full.safetensors"), model);
  msg = error_of([&] { load_model(path("full.safetensors"), no_bias); });
  EXPECT_TRUE(contains(msg, "unexpected tensor encoder.layers.0.linear2.bias [4]")) << msg;
  EXPECT_NO_THROW(load_model(path("full.safetensors"), no_bias, LoadOptions{{}, true}));
  EXPECT_NO_THROW(
      load_model(path("full.safetensors"), no_bias, LoadOptions{{"encoder.layers.0.linear2.b"}}));

  TwoLayers<double> dbl(4, 8);
  save_model(path("double.safetensors"), dbl);
  msg = error_of([&] { load_model(path("double.safetensors"), model); });
  EXPECT_TRUE(contains(msg,
                       "checkpoint tensor encoder.layers.0.linear1.weight: expected dtype F32, "
                       "file has F64"))
      << msg;
  EXPECT_TRUE(unchanged());
}

/// One deterministic training step of a Linear: loss sum(y * r) for inputs drawn from `step`,
/// a dropout-like key draw from `rs`, Noam learning rate.
void train_step(Linear<float>& lin, Adam<float>& adam, RandomState& rs, Index step) {
  Rng data(1000 + static_cast<std::uint64_t>(step));
  Tensor<float> x({3, 4}), r({3, 2});
  fill_normal(x, data, 0, 1);
  fill_normal(r, data, 0, 1);
  const std::uint64_t key = rs.next_key();
  for (Index i = 0; i < x.numel(); ++i)
    x.data()[i] *= uniform_at(key, static_cast<std::uint64_t>(i)) < 0.1 ? 0.0f : 1.0f;
  adam.zero_grad();
  lin.forward(x);
  lin.backward(r);
  adam.step(noam_lr(step, 4, 2, 10.0));
}

TEST_F(Checkpoint, TrainingCheckpointResumesBitwise) {
  Rng init(5);
  Linear<float> a(4, 2);
  a.reset_parameters(init);
  Linear<float> b(4, 2);
  std::copy(a.weight.value.begin(), a.weight.value.end(), b.weight.value.begin());
  Adam<float> adam_a(a.parameters()), adam_b(b.parameters());
  RandomState rs_a{42, 0}, rs_b{42, 0};
  ExponentialMovingAverage<float> ema_b(b.parameters(), 0.9);

  for (Index s = 1; s <= 6; ++s) train_step(a, adam_a, rs_a, s);  // uninterrupted
  for (Index s = 1; s <= 3; ++s) {
    train_step(b, adam_b, rs_b, s);
    ema_b.update();
  }
  save_training_checkpoint(path("train.safetensors"), b.parameters(), adam_b, rs_b,
                           {{"config", "{\"d_model\":4}"}}, ema_b.entries("ema."));

  // A fresh process: other values, zero moments, another stream.
  Linear<float> c(4, 2);
  Adam<float> adam_c(c.parameters());
  RandomState rs_c{1, 1};
  ExponentialMovingAverage<float> ema_c(c.parameters(), 0.9);
  const TrainingCheckpoint ck =
      load_training_checkpoint(path("train.safetensors"), c.parameters(), adam_c, rs_c);
  ema_c.load_state(ck.file, "extra.ema.");
  EXPECT_EQ(ck.step, 3);
  EXPECT_EQ(adam_c.steps(), 3);
  EXPECT_EQ(rs_c.seed, 42u);
  EXPECT_EQ(rs_c.counter, rs_b.counter);
  EXPECT_EQ(ck.metadata.at("config"), "{\"d_model\":4}");
  EXPECT_EQ(ck.metadata.at("rng_counter"), "3");
  EXPECT_TRUE(same_bits(b.parameters(), c.parameters()));
  const auto sb = adam_b.state(), sc = adam_c.state();
  for (std::size_t k = 0; k < sb.size(); ++k)
    EXPECT_EQ(std::memcmp(sb[k].value.data(), sc[k].value.data(), sb[k].value.numel() * 4), 0)
        << sb[k].name;
  for (std::size_t k = 0; k < 2; ++k)
    EXPECT_EQ(std::memcmp(ema_b.state()[k].value.data(), ema_c.state()[k].value.data(),
                          ema_b.state()[k].value.numel() * 4),
              0);

  for (Index s = 4; s <= 6; ++s) train_step(c, adam_c, rs_c, s);
  EXPECT_TRUE(same_bits(a.parameters(), c.parameters()));
  EXPECT_EQ(rs_c.counter, rs_a.counter);
  const auto sa = adam_a.state(), sc2 = adam_c.state();
  for (std::size_t k = 0; k < sa.size(); ++k)
    EXPECT_EQ(std::memcmp(sa[k].value.data(), sc2[k].value.data(), sa[k].value.numel() * 4), 0)
        << sa[k].name;

  // A training checkpoint is also a model checkpoint once its training state is ignored.
  Linear<float> d(4, 2);
  EXPECT_TRUE(contains(error_of([&] { load_model(path("train.safetensors"), d); }),
                       "unexpected tensor adam.weight.exp_avg"));
  load_model(path("train.safetensors"), d, LoadOptions{kTrainingStatePrefixes});
  EXPECT_TRUE(same_bits(b.parameters(), d.parameters()));
}

TEST_F(Checkpoint, TrainingCheckpointErrors) {
  Linear<float> lin(4, 2);
  Adam<float> adam(lin.parameters());
  RandomState rs{1, 2};
  EXPECT_TRUE(
      contains(error_of([&] {
                 save_training_checkpoint(path("t"), lin.parameters(), adam, rs, {{"step", "9"}});
               }),
               "metadata key \"step\" is reserved"));
  save_model(path("model.safetensors"), lin);
  std::string msg = error_of(
      [&] { load_training_checkpoint(path("model.safetensors"), lin.parameters(), adam, rs); });
  EXPECT_TRUE(contains(msg, "has no metadata \"step\"")) << msg;

  std::vector<TensorEntry> entries;
  for (const auto& p : lin.parameters()) entries.push_back(tensor_entry(p.name, p.value));
  for (const auto& s : adam.state()) entries.push_back(tensor_entry("adam." + s.name, s.value));
  save_safetensors(path("badstep.safetensors"), entries,
                   {{"step", "12x"}, {"rng_seed", "1"}, {"rng_counter", "2"}});
  msg = error_of(
      [&] { load_training_checkpoint(path("badstep.safetensors"), lin.parameters(), adam, rs); });
  EXPECT_TRUE(
      contains(msg, "metadata \"step\" must be a non-negative decimal integer, got \"12x\""))
      << msg;

  // A step beyond Index used to be cast to a negative count that Adam refused only after the
  // weights had been overwritten: every check now comes before the first change.
  Linear<float> other(4, 2);
  other.weight.value.fill(7.0f);
  std::vector<TensorEntry> other_entries;
  for (const auto& p : other.parameters()) other_entries.push_back(tensor_entry(p.name, p.value));
  for (const auto& s : adam.state())
    other_entries.push_back(tensor_entry("adam." + s.name, s.value));
  for (const char* step : {"9223372036854775808", "18446744073709551616", "-1", " 1", "1 "}) {
    save_safetensors(path("hugestep.safetensors"), other_entries,
                     {{"step", step}, {"rng_seed", "1"}, {"rng_counter", "2"}});
    msg = error_of([&] {
      load_training_checkpoint(path("hugestep.safetensors"), lin.parameters(), adam, rs);
    });
    EXPECT_TRUE(contains(msg,
                         "hugestep.safetensors: metadata \"step\" must be a non-negative "
                         "decimal integer, got \"" +
                             std::string(step) + "\""))
        << msg;
    EXPECT_NE(lin.weight.value.data()[0], 7.0f) << "weights overwritten by a refused file";
  }

  entries.pop_back();  // no adam.bias.exp_avg_sq
  save_safetensors(path("noadam.safetensors"), entries,
                   {{"step", "1"}, {"rng_seed", "1"}, {"rng_counter", "2"}});
  msg = error_of(
      [&] { load_training_checkpoint(path("noadam.safetensors"), lin.parameters(), adam, rs); });
  EXPECT_TRUE(contains(msg, "has no tensor adam.bias.exp_avg_sq")) << msg;
  EXPECT_EQ(adam.steps(), 0);
  EXPECT_EQ(rs.counter, 2u);  // nothing restored from a bad file
}

TEST_F(Checkpoint, AveragingThreeCheckpointsGivesTheMean) {
  std::vector<std::string> paths;
  std::vector<std::unique_ptr<TwoLayers<double>>> models;
  for (int i = 0; i < 3; ++i) {
    models.push_back(std::make_unique<TwoLayers<double>>(3, 5));
    Rng rng(static_cast<std::uint64_t>(100 + i));
    for (auto& p : models.back()->parameters()) fill_normal(p.value, rng, i, 1);
    paths.push_back(path("ck" + std::to_string(i) + ".safetensors"));
    save_model(paths.back(), *models.back());
  }
  TwoLayers<double> avg(3, 5);
  average_checkpoints(paths, avg.parameters());
  const auto pa = avg.parameters();
  for (std::size_t k = 0; k < pa.size(); ++k) {
    for (Index i = 0; i < pa[k].value.numel(); ++i) {
      double mean = 0;
      for (const auto& m : models) mean += m->parameters()[k].value.data()[i];
      EXPECT_NEAR(pa[k].value.data()[i], mean / 3, 1e-15) << pa[k].name << "[" << i << "]";
    }
  }
  // float models are accumulated in double and rounded once.
  std::vector<std::string> fpaths;
  std::vector<Tensor<float>> ws;
  for (int i = 0; i < 3; ++i) {
    Linear<float> lin(2, 2, false);
    lin.weight.value = Tensor<float>::from({2, 2}, {0.1f * i, 1e8f, 1.0f + i, -3.0f});
    lin.weight.value(0, 1) += static_cast<float>(i);
    ws.push_back(lin.weight.value.clone());
    fpaths.push_back(path("f" + std::to_string(i) + ".safetensors"));
    save_model(fpaths.back(), lin);
  }
  Linear<float> favg(2, 2, false);
  average_checkpoints(fpaths, favg.parameters());
  for (Index i = 0; i < 4; ++i) {
    const double mean =
        (static_cast<double>(ws[0].data()[i]) + ws[1].data()[i] + ws[2].data()[i]) / 3;
    EXPECT_EQ(favg.weight.value.data()[i], static_cast<float>(mean)) << i;
  }
}

TEST_F(Checkpoint, AveragingErrorsNameTheFile) {
  TwoLayers<double> a(3, 5), b(3, 4), target(3, 5);
  save_model(path("a.safetensors"), a);
  save_model(path("b.safetensors"), b);
  const Tensor<double> before = target.linear1.weight.value.clone();
  const std::string msg = error_of([&] {
    average_checkpoints({path("a.safetensors"), path("b.safetensors")}, target.parameters());
  });
  EXPECT_TRUE(contains(msg, path("b.safetensors"))) << msg;
  EXPECT_TRUE(contains(msg, "expected shape [5, 3], file has [4, 3]")) << msg;
  EXPECT_EQ(target.linear1.weight.value(0, 0), before(0, 0));
  EXPECT_TRUE(contains(error_of([&] { average_checkpoints({}, target.parameters()); }),
                       "no checkpoint paths"));
  EXPECT_THROW(average_checkpoints({path("a.safetensors"), path("zzz")}, target.parameters()),
               IOError);
}

// Checkpoints of two models whose tensors have the same shapes (another vocabulary, say) are
// refused when metadata under the given prefixes differs, is missing, or is extra; other keys
// (a step) may differ.
TEST_F(Checkpoint, AveragingRefusesCheckpointsWhoseGivenMetadataDiffers) {
  TwoLayers<double> a(3, 5), target(3, 5);
  const std::vector<std::string> prefixes{"config.", "vocab."};
  save_model(path("a.safetensors"), a,
             {{"config.d_model", "3"}, {"vocab.hash", "5f"}, {"step", "1"}});
  save_model(path("b.safetensors"), a,
             {{"config.d_model", "3"}, {"vocab.hash", "5f"}, {"step", "2"}});
  save_model(path("c.safetensors"), a, {{"config.d_model", "3"}, {"vocab.hash", "32"}});
  save_model(path("d.safetensors"), a, {{"vocab.hash", "5f"}});
  average_checkpoints({path("a.safetensors"), path("b.safetensors")}, target.parameters(), {},
                      prefixes);
  average_checkpoints({path("a.safetensors"), path("c.safetensors")}, target.parameters());
  const Tensor<double> before = target.linear1.weight.value.clone();
  std::string msg = error_of([&] {
    average_checkpoints({path("a.safetensors"), path("b.safetensors"), path("c.safetensors")},
                        target.parameters(), {}, prefixes);
  });
  EXPECT_TRUE(contains(msg, path("c.safetensors") +
                                ": metadata vocab.hash is \"32\" but \"5f\" in " +
                                path("a.safetensors")))
      << msg;
  EXPECT_EQ(target.linear1.weight.value(0, 0), before(0, 0));
  msg = error_of([&] {
    average_checkpoints({path("d.safetensors"), path("a.safetensors")}, target.parameters(), {},
                        prefixes);
  });
  EXPECT_TRUE(contains(msg, "metadata config.d_model is \"3\" but absent in")) << msg;
  msg = error_of([&] {
    average_checkpoints({path("a.safetensors"), path("d.safetensors")}, target.parameters(), {},
                        prefixes);
  });
  EXPECT_TRUE(contains(msg, "metadata config.d_model is absent but \"3\" in")) << msg;
}

TEST(EMA, UpdateApplyRestoreAndCopy) {
  Linear<double> lin(2, 1);
  lin.weight.value = Tensor<double>::from({1, 2}, {1.0, -2.0});
  lin.bias.value = Tensor<double>::from({1}, {4.0});
  ExponentialMovingAverage<double> ema(lin.parameters(), 0.9);
  lin.weight.value(0, 0) = 3.0;
  ema.update();  // 0.9 * 1 + 0.1 * 3
  lin.weight.value(0, 0) = 5.0;
  ema.update();  // 0.9 * 1.2 + 0.1 * 5
  EXPECT_EQ(ema.updates(), 2);
  const auto st = ema.state();
  EXPECT_EQ(st[0].name, "weight");
  EXPECT_NEAR(st[0].value(0, 0), 1.58, 1e-15);
  EXPECT_NEAR(st[0].value(0, 1), -2.0, 1e-15);
  EXPECT_NEAR(st[1].value(0), 4.0, 1e-15);

  ema.apply();
  EXPECT_NEAR(lin.weight.value(0, 0), 1.58, 1e-15);
  EXPECT_THROW(ema.update(), ConfigError);
  EXPECT_THROW(ema.apply(), ConfigError);
  Linear<double> other(2, 1);
  ema.copy_to(other.parameters());  // the average, also while applied
  EXPECT_NEAR(other.weight.value(0, 0), 1.58, 1e-15);
  ema.restore();
  EXPECT_EQ(lin.weight.value(0, 0), 5.0);  // exact swap back
  EXPECT_THROW(ema.restore(), ConfigError);
  Linear<double> other2(2, 1);
  ema.copy_to(other2.parameters());
  EXPECT_NEAR(other2.weight.value(0, 0), 1.58, 1e-15);
  EXPECT_EQ(other2.bias.value(0), 4.0);

  Linear<double> wrong(3, 1);
  EXPECT_TRUE(
      contains(error_of([&] { ema.copy_to(wrong.parameters()); }), "expected weight [1, 2]"));
  EXPECT_TRUE(contains(error_of([&] { ExponentialMovingAverage<double>(lin.parameters(), 1.0); }),
                       "decay must be in [0, 1), got 1"));
}

}  // namespace
}  // namespace attn
