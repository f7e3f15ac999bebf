// The body of the safetensors fuzz target, shared by the libFuzzer entry point
// (fuzz_safetensors.cpp) and the replay test that runs the same inputs in the ordinary test suite.
//
// parse_safetensors reads from memory, so every input goes through it directly. Inputs it accepts
// then take the checkpoint load paths, which only read files: they are written to a per-process
// temporary file and loaded with load_model and load_training_checkpoint into fuzz_parameters().
#pragma once

#include <attn/train/checkpoint.hpp>
#include <attn/train/safetensors.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace attn::fuzz {

enum class SafetensorsOutcome {
  rejected,            ///< parse_safetensors threw attn::Error
  parsed,              ///< a valid file, but not a training checkpoint of fuzz_parameters()
  training_checkpoint  ///< load_training_checkpoint restored fuzz_parameters() from it
};

/// The model the checkpoint seeds were saved from: names as torch.nn.Linear(2, 3) would have them.
inline std::vector<NamedParameter<float>> fuzz_parameters() {
  std::vector<NamedParameter<float>> params = {
      {"proj.weight", Tensor<float>(Shape{3, 2}), Tensor<float>(Shape{3, 2})},
      {"proj.bias", Tensor<float>(Shape{3}), Tensor<float>(Shape{3})}};
  for (Index i = 0; i < params[0].value.numel(); ++i) params[0].value.data()[i] = 0.25f * i;
  return params;
}

namespace impl {

/// A temporary file for this process, removed at exit.
struct ScratchFile {
  std::string path;
  ScratchFile() {
    const char* tmp = std::getenv("TMPDIR");
    path = std::string(tmp && *tmp ? tmp : "/tmp") + "/attn_fuzz_XXXXXX";
    const int fd = ::mkstemp(path.data());
    if (fd >= 0) ::close(fd);
  }
  ~ScratchFile() { ::unlink(path.c_str()); }
};
inline const std::string& fuzz_scratch_path() {
  static const ScratchFile file;
  return file.path;
}

inline void write_scratch(const std::uint8_t* data, std::size_t size) {
  const int fd = ::open(fuzz_scratch_path().c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  ATTN_CHECK(fd >= 0, IOError, "cannot open ", fuzz_scratch_path());
  std::size_t written = 0;
  const bool ok = ::attn::detail::write_all(fd, data, size, written);
  ::close(fd);
  ATTN_CHECK(ok, IOError, "cannot write ", fuzz_scratch_path());
}

template <class T>
void read_as(const SafetensorsFile& file, const std::string& name) {
  try {
    const Tensor<T> t = file.tensor<T>(name);
    volatile T sink{};
    for (Index i = 0; i < t.numel(); ++i) sink = t.data()[i];
    (void)sink;
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
    // rank above Shape::kMaxRank: refused with FormatError, as documented
  }
}

}  // namespace impl

/// Parses `data` as a safetensors file and, if it is one, reads every tensor and loads it as a
/// model and as a training checkpoint. attn::Error is the expected refusal; anything else escapes.
inline SafetensorsOutcome run_safetensors(const std::uint8_t* data, std::size_t size) {
  SafetensorsFile file;
  try {
    file = parse_safetensors(std::vector<unsigned char>(data, data + size), "fuzz.safetensors");
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
    return SafetensorsOutcome::rejected;
  }
  // Every accepted tensor's bytes must lie inside the input: read them all (ASan checks).
  unsigned checksum = 0;
  for (const auto& name : file.names()) {
    const TensorInfo& ti = file.info(name);
    const unsigned char* p = file.bytes(name);
    for (std::size_t i = 0; i < ti.end - ti.begin; ++i) checksum += p[i];
    switch (ti.dtype) {
      case Dtype::F32:
        impl::read_as<float>(file, name);
        break;
      case Dtype::F64:
        impl::read_as<double>(file, name);
        break;
      case Dtype::I32:
        impl::read_as<std::int32_t>(file, name);
        break;
      case Dtype::I64:
        impl::read_as<std::int64_t>(file, name);
        break;
      case Dtype::U8:
        impl::read_as<std::uint8_t>(file, name);
        break;
      default:
        break;
    }
  }
  volatile unsigned sink = checksum;
  (void)sink;

  impl::write_scratch(data, size);
  auto params = fuzz_parameters();
  try {
    load_model(impl::fuzz_scratch_path(), params, LoadOptions{kTrainingStatePrefixes, false});
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
  }
  try {
    Adam<float> adam(params);
    RandomState rng;
    const TrainingCheckpoint ckpt =
        load_training_checkpoint(impl::fuzz_scratch_path(), params, adam, rng);
    return ckpt.step >= 0 ? SafetensorsOutcome::training_checkpoint : SafetensorsOutcome::parsed;
  } catch (const InternalError&) {
    throw;
  } catch (const Error&) {
    return SafetensorsOutcome::parsed;
  }
}

}  // namespace attn::fuzz
