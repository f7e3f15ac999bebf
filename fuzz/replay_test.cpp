// Runs the fuzz targets' bodies in the ordinary test suite: every committed corpus file, the seeds
// built in-process, and a few thousand deterministic mutations of them (truncations, byte flips,
// length and offset fields set to extreme values, JSON numbers replaced). Only attn::Error may
// refuse an input; anything else escapes the targets and fails the test. Built with ASan and UBSan
// when the compiler supports them, so out-of-bounds reads fail here too, not only under libFuzzer.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "mo_catalog_target.hpp"
#include "mutations.hpp"
#include "safetensors_target.hpp"
#include "seeds.hpp"

namespace attn::fuzz {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The files of the committed corpus directory of `target`.
std::vector<Seed> corpus(const std::string& target) {
  std::vector<Seed> seeds;
  const std::string dir = std::string(ATTN_FUZZ_CORPUS_DIR) + "/" + target;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return seeds;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') seeds.emplace_back(e->d_name, read_file(dir + "/" + e->d_name));
  ::closedir(d);
  std::sort(seeds.begin(), seeds.end());
  return seeds;
}

/// A fresh directory for the safetensors writer, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = ::testing::TempDir() + "attn_fuzz_replay_XXXXXX";
    if (::mkdtemp(tmpl.data()) != nullptr) path = tmpl;
  }
  ~ScratchDir() { ::rmdir(path.c_str()); }
  std::string path;
};

template <class Run, class Outcome>
std::map<Outcome, int> run_all(Run run, const std::vector<std::string>& inputs) {
  std::map<Outcome, int> tally;
  for (const auto& in : inputs) {
    // An exception other than attn::Error escapes run() and fails the test with its what().
    ++tally[run(in)];
  }
  return tally;
}

Outcome run_mo(const std::string& bytes) {
  return run_mo_catalog(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
}
SafetensorsOutcome run_st(const std::string& bytes) {
  return run_safetensors(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
}

// ------------------------------------------------------------------------------------------ .mo

TEST(FuzzReplay, MoSeedsParseAndEveryTruncationIsRefused) {
  for (const auto& [name, bytes] : mo_seeds()) {
    EXPECT_EQ(run_mo(bytes), Outcome::accepted) << name;
    // The last byte of a .mo file is the NUL of its last string or part of the header.
    for (std::size_t n : truncation_lengths(bytes.size(), 48))
      EXPECT_EQ(run_mo(bytes.substr(0, n)), Outcome::rejected) << name << " cut to " << n;
  }
}

TEST(FuzzReplay, MoCommittedCorpusAndMutations) {
  std::vector<Seed> seeds = corpus("mo_catalog");
  ASSERT_GE(seeds.size(), mo_seeds().size()) << "fuzz/corpus/mo_catalog is missing seeds";
  for (const auto& s : mo_seeds()) seeds.push_back(s);
  std::vector<std::string> inputs;
  std::uint64_t salt = 1;
  for (const auto& [name, bytes] : seeds) {
    inputs.push_back(bytes);
    for (auto& m : byte_flips(bytes, salt++, 64, {-1, 0x00, 0x80, int{'['}}))
      inputs.push_back(std::move(m));
    // Every aligned 32-bit word (header fields, table lengths and offsets) set to extremes, in
    // both byte orders since a seed may be big-endian.
    for (std::size_t at = 0; at + 4 <= bytes.size(); at += 4)
      for (std::uint32_t v :
           {0xffffffffu, 0x7fffffffu, 0x80000000u, 0xfffffff0u,
            static_cast<std::uint32_t>(bytes.size()), static_cast<std::uint32_t>(bytes.size() - 1)})
        for (bool big : {false, true}) {
          std::string m = bytes;
          for (int i = 0; i < 4; ++i)
            m[at + i] = static_cast<char>(v >> (big ? 24 - 8 * i : 8 * i));
          inputs.push_back(std::move(m));
        }
  }
  const auto tally = run_all<decltype(&run_mo), Outcome>(&run_mo, inputs);
  EXPECT_GT(tally.count(Outcome::rejected) ? tally.at(Outcome::rejected) : 0, 0);
  EXPECT_GT(tally.count(Outcome::accepted) ? tally.at(Outcome::accepted) : 0, 0);
  std::cout << inputs.size() << " .mo inputs\n";
}

TEST(MoRegression, EntriesSharingOneLongStringAreRefused) {
  // 256 entries whose originals and translations all point at one 64 KB string: a 66 KB file that
  // used to be copied into 32 MB of strings (a 1 MB one into 32 GB: std::bad_alloc).
  const std::uint32_t n = 256, length = 64 * 1024, strings = 28 + 16 * n;
  std::string mo;
  auto put = [&](std::uint32_t v) {
    for (int i = 0; i < 4; ++i) mo.push_back(static_cast<char>(v >> (8 * i)));
  };
  for (std::uint32_t v : {0x950412deu, 0u, n, 28u, 28 + 8 * n, 0u, 0u}) put(v);
  for (std::uint32_t i = 0; i < 2 * n; ++i) put(length), put(strings);
  mo += std::string(length, 'x') + '\0';
  EXPECT_EQ(run_mo(mo), Outcome::rejected);
  try {
    translate::parse_mo(mo, "shared.mo");
    ADD_FAILURE() << "no exception";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("'shared.mo': the strings of entries 0 to 0 take 131074 "
                                         "bytes with their NULs, more than the file holds (69661 "
                                         "bytes): strings overlap"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------- safetensors

/// `bytes` with its JSON header replaced by `header` (length field updated, data kept).
std::string with_header(const std::string& bytes, const std::string& header) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(header.size() >> (8 * i));
  return out + header + bytes.substr(8 + n);
}
std::string header_of(const std::string& bytes) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
  return bytes.substr(8, n);
}

TEST(FuzzReplay, SafetensorsSeedsLoadAndEveryTruncationIsRefused) {
  ScratchDir dir;
  ASSERT_FALSE(dir.path.empty());
  for (const auto& [name, bytes] : safetensors_seeds(dir.path)) {
    const auto expected = name == "training.safetensors" ? SafetensorsOutcome::training_checkpoint
                                                         : SafetensorsOutcome::parsed;
    EXPECT_EQ(run_st(bytes), expected) << name;
    // The tensors must tile the data buffer exactly, so no strict prefix is a valid file.
    for (std::size_t n : truncation_lengths(bytes.size(), 48))
      EXPECT_EQ(run_st(bytes.substr(0, n)), SafetensorsOutcome::rejected)
          << name << " cut to " << n;
  }
}

TEST(FuzzReplay, SafetensorsCommittedCorpusAndMutations) {
  ScratchDir dir;
  ASSERT_FALSE(dir.path.empty());
  std::vector<Seed> seeds = corpus("safetensors");
  ASSERT_GE(seeds.size(), 4u) << "fuzz/corpus/safetensors is missing seeds";
  for (const auto& s : safetensors_seeds(dir.path)) seeds.push_back(s);
  std::vector<std::string> inputs;
  std::uint64_t salt = 1000;
  for (const auto& [name, bytes] : seeds) {
    inputs.push_back(bytes);
    for (auto& m : byte_flips(bytes, salt++, 24, {-1, 0x00, 0x80, int{'['}}))
      inputs.push_back(std::move(m));
    if (bytes.size() < 8) continue;
    // The 64-bit header length set to extremes and near misses.
    const std::uint64_t n = header_of(bytes).size(), size = bytes.size();
    for (std::uint64_t v : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{2}, n - 1, n + 1,
                            size - 8, size, std::uint64_t{100'000'000}, std::uint64_t{100'000'001},
                            std::uint64_t{1} << 63, ~std::uint64_t{0}}) {
      std::string m = bytes;
      for (int i = 0; i < 8; ++i) m[i] = static_cast<char>(v >> (8 * i));
      inputs.push_back(std::move(m));
    }
    // Each JSON number (and each digit run inside a metadata string) replaced by extremes, with
    // the length field kept consistent so that the reader gets past it.
    const std::string header = header_of(bytes);
    for (std::size_t at = 0; at < header.size();) {
      if (header[at] < '0' || header[at] > '9') {
        ++at;
        continue;
      }
      std::size_t end = at;
      while (end < header.size() && header[end] >= '0' && header[end] <= '9') ++end;
      for (const char* v : {"0", "4294967296", "9223372036854775808", "18446744073709551615",
                            "18446744073709551616", "-1", "1e400", "[]"})
        inputs.push_back(with_header(bytes, header.substr(0, at) + v + header.substr(end)));
      at = end;
    }
    // Keywords renamed or retyped.
    for (const auto& [from, to] :
         std::vector<std::pair<std::string, std::string>>{{"\"F32\"", "\"F64\""},
                                                          {"\"F32\"", "\"F99\""},
                                                          {"\"F32\"", "7"},
                                                          {"\"shape\"", "\"shap\""},
                                                          {"\"data_offsets\"", "\"data_offset\""},
                                                          {"\"__metadata__\"", "\"__metadata_\""},
                                                          {"\"step\"", "\"steps\""},
                                                          {"\"proj.bias\"", "\"proj.weight\""}}) {
      const auto at = header.find(from);
      if (at != std::string::npos)
        inputs.push_back(
            with_header(bytes, header.substr(0, at) + to + header.substr(at + from.size())));
    }
  }
  const auto tally = run_all<decltype(&run_st), SafetensorsOutcome>(&run_st, inputs);
  for (auto o : {SafetensorsOutcome::rejected, SafetensorsOutcome::parsed,
                 SafetensorsOutcome::training_checkpoint})
    EXPECT_GT(tally.count(o) ? tally.at(o) : 0, 0) << "outcome " << static_cast<int>(o);
  std::cout << inputs.size() << " safetensors inputs\n";
}

// Regressions for what the fuzz targets and their review found in the safetensors reader.

std::string safetensors_with_header(const std::string& header) {
  return with_header(std::string(8, '\0'), header);
}

TEST(SafetensorsRegression, DeepNestingIsRefusedInsteadOfOverflowingTheStack) {
  // ordered_json copied nested values recursively when a later key grew the object: 100000
  // levels of '[' used to crash with SIGSEGV. An unknown field may nest, but not without bound.
  const std::size_t depth = 100'000;
  const std::string header = R"({"a":{"dtype":"F32","shape":[0],"x":[)" + std::string(depth, '[') +
                             std::string(depth, ']') + R"(],"data_offsets":[0,0]}})";
  const std::string bytes = safetensors_with_header(header);
  EXPECT_EQ(run_st(bytes), SafetensorsOutcome::rejected);
  try {
    parse_safetensors(std::vector<unsigned char>(bytes.begin(), bytes.end()), "deep.safetensors");
    ADD_FAILURE() << "no exception";
  } catch (const FormatError& e) {
    EXPECT_NE(
        std::string(e.what()).find("deep.safetensors: header nests JSON more than 64 levels deep"),
        std::string::npos)
        << e.what();
  }
  // The format's own 3 levels, and a little more, still reach the specific checks.
  const std::string shallow =
      safetensors_with_header(R"({"a":{"dtype":"F32","shape":[[[1]]],"data_offsets":[0,0]}})");
  try {
    parse_safetensors(std::vector<unsigned char>(shallow.begin(), shallow.end()), "s");
    ADD_FAILURE() << "no exception";
  } catch (const FormatError& e) {
    EXPECT_NE(
        std::string(e.what()).find("shape entries must be non-negative integers, got an array"),
        std::string::npos)
        << e.what();
  }
}

TEST(SafetensorsRegression, ZeroExtentDoesNotHideAnOverflowingShape) {
  // Accepted before, and then tensor<float>() overflowed Index in Shape::numel (UBSan).
  const std::string bytes = safetensors_with_header(
      R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})");
  try {
    parse_safetensors(std::vector<unsigned char>(bytes.begin(), bytes.end()), "z.safetensors");
    ADD_FAILURE() << "no exception";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "z.safetensors: tensor a: shape [4294967296, 4294967296, 0] is too large"),
              std::string::npos)
        << e.what();
  }
  // Empty tensors whose other extents multiply to something representable still load.
  const std::string fine = safetensors_with_header(
      R"({"a":{"dtype":"F32","shape":[65536,0,65536],"data_offsets":[0,0]}})");
  const SafetensorsFile f =
      parse_safetensors(std::vector<unsigned char>(fine.begin(), fine.end()), "fine");
  EXPECT_EQ(f.tensor<float>("a").numel(), 0);
  EXPECT_EQ(run_st(fine), SafetensorsOutcome::parsed);
}

}  // namespace
}  // namespace attn::fuzz
