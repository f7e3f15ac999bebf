// libFuzzer target for the safetensors reader (include/attn/train/safetensors.hpp) and the
// checkpoint loaders on top of it (checkpoint.hpp): any input must either load or be refused with
// attn::Error; crashes, other exceptions and sanitizer reports are bugs. Build with
// -DATTN_BUILD_FUZZERS=ON and clang; run scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>

#include "input_stats.hpp"
#include "safetensors_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attn::fuzz::note_input_size(size);
  attn::fuzz::run_safetensors(data, size);
  return 0;
}
