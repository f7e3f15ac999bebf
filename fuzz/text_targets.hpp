// Bodies of the fuzz targets for attn-translate's small text readers, shared by the libFuzzer
// entry points and the replay test:
//   train_state    a training checkpoint's metadata (options, data position, learning curves),
//                  given as "key=value" lines
//   vocab          vocab.txt, the fingerprint of a directory's spm.model
//   parallel_text  read_lines / read_parallel over plain or gzip files (the first byte chooses:
//                  even, one file; odd, the rest split in two line-aligned files)
// attn::Error is the expected refusal; anything else escapes and is a finding.
#pragma once

#include <attn/error.hpp>

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "bpe.hpp"
#include "corpus_io.hpp"
#include "train_state.hpp"

namespace attn::fuzz {

enum class TextOutcome { rejected, accepted };

namespace impl {

/// The files the targets write into the scratch directory.
inline constexpr const char* kScratchNames[] = {"vocab.txt", "one.txt", "src.txt", "tgt.txt",
                                                "seed.txt.gz"};
inline void remove_text_scratch_dir();

/// A directory for this process's scratch files, made once: under $TMPDIR if set, else in memory
/// (/dev/shm) when there is one. On a disk-backed /tmp, truncating and rewriting the scratch file
/// on every input cost about 1 ms (the filesystem flushes a file replaced by truncation), which
/// held vocab and parallel_text near 1,000 executions a second; in /dev/shm they run about 10 times
/// as fast, reading the same bytes through the same file readers.
inline const std::string& text_scratch_dir() {
  // Never destroyed: the atexit handler below runs after the destructors of later statics.
  static const std::string& dir = *new std::string([] {
    const char* tmp = std::getenv("TMPDIR");
    std::string base = tmp && *tmp ? tmp : "/tmp";
    if (!(tmp && *tmp) && ::access("/dev/shm", W_OK | X_OK) == 0) base = "/dev/shm";
    std::string d = base + "/attn_fuzz_text_XXXXXX";
    if (!::mkdtemp(d.data())) return std::string("/tmp");
    std::atexit(remove_text_scratch_dir);  // in memory, a leftover would hold up to a few MB
    return d;
  }());
  return dir;
}

inline void remove_text_scratch_dir() {
  const std::string& dir = text_scratch_dir();
  for (const char* name : kScratchNames) ::unlink((dir + "/" + name).c_str());
  ::rmdir(dir.c_str());
}

inline std::string scratch_file(const std::string& name, const std::string& bytes) {
  const std::string path = text_scratch_dir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

template <class Fn>
TextOutcome refused_or_accepted(Fn&& fn) {
  try {
    fn();
    return TextOutcome::accepted;
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
    return TextOutcome::rejected;
  }
}

}  // namespace impl

/// The training data's fingerprint the train_state target resumes with, and its seed stores.
inline constexpr std::uint64_t kSeedDataFingerprint = 0x0123456789abcdefULL;

inline TextOutcome run_train_state(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  translate::Metadata m;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(begin, end - begin);
    const std::size_t eq = line.find('=');
    if (eq != std::string::npos) m[line.substr(0, eq)] = line.substr(eq + 1);
    begin = end + 1;
  }
  return impl::refused_or_accepted([&] {
    translate::TrainOptions o;
    translate::restore_options(o, m, "fuzz.safetensors");
    translate::restore_curves(m, "fuzz.safetensors");
    translate::restore_data_position(m, "fuzz.safetensors", [](std::uint64_t) { return 1000; });
    translate::check_data_fingerprint(m, "fuzz.safetensors", kSeedDataFingerprint);
  });
}

inline TextOutcome run_vocab(const std::uint8_t* data, std::size_t size) {
  impl::scratch_file("vocab.txt", std::string(reinterpret_cast<const char*>(data), size));
  return impl::refused_or_accepted(
      [&] { translate::read_vocab_fingerprint(impl::text_scratch_dir()); });
}

inline TextOutcome run_parallel_text(const std::uint8_t* data, std::size_t size) {
  // A 1 MB input can inflate to 1 GB, the default cap, and past libFuzzer's -rss_limit_mb; the cap
  // itself is what is under test, so a smaller one keeps a gzip bomb from counting as an OOM.
  constexpr std::size_t kCap = std::size_t{64} << 20;
  if (size == 0) return TextOutcome::rejected;
  const std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  return impl::refused_or_accepted([&] {
    if (data[0] % 2 == 0) {
      translate::read_lines(impl::scratch_file("one.txt", rest), kCap);
    } else {
      const std::string a = impl::scratch_file("src.txt", rest.substr(0, rest.size() / 2));
      const std::string b = impl::scratch_file("tgt.txt", rest.substr(rest.size() / 2));
      translate::ReadParallelOptions options;
      options.max_bytes = kCap;
      translate::read_parallel(a, b, options);
    }
  });
}

/// Seeds, built here: a complete training-state text, vocab.txt as the trainer writes it, and
/// plain, CRLF, BOM and gzip text (the gzip bytes made by write_lines).
inline std::vector<std::pair<std::string, std::string>> train_state_seeds() {
  translate::Metadata m;
  translate::store_options(translate::TrainOptions{}, m);
  translate::store_data_position({3, 7}, m);
  translate::store_data_fingerprint(kSeedDataFingerprint, m);
  translate::store_curves({{100, 4.5, 4.25, 1.5}, {200, 3.5, -0.0, 0.0}}, m);
  std::string text;
  for (const auto& [k, v] : m) text += k + "=" + v + "\n";
  return {{"train_state.txt", text}};
}

inline std::vector<std::pair<std::string, std::string>> vocab_seeds() {
  return {{"vocab.txt", "attn-translate-vocab 1\nsize 8000\nhash 9c4f1e0b7d2a6e31\n"}};
}

inline std::vector<std::pair<std::string, std::string>> parallel_text_seeds() {
  const std::vector<std::string> lines = {"a small house", "", "zwei W\xc3\xb6rter", "x\r"};
  const std::string gz = impl::text_scratch_dir() + "/seed.txt.gz";
  translate::write_lines(gz, lines);
  std::ifstream in(gz, std::ios::binary);
  const std::string gz_bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  ::unlink(gz.c_str());
  return {{"plain.txt", std::string(1, '\0') + "one\ntwo\r\n\xEF\xBB\xBFthree\n"},
          {"pair.txt", std::string(1, '\1') + "one\ntwo\nuno\ndos\n"},  // halves of equal size
          {"gzip.txt", std::string(1, '\0') + gz_bytes}};
}

}  // namespace attn::fuzz
