// libFuzzer target: model_file (see model_file_target.hpp). Build with -DATTN_BUILD_FUZZERS=ON and
// clang; run scripts/fuzz.sh model_file.
#include <cstddef>
#include <cstdint>

#include "input_stats.hpp"
#include "model_file_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attn::fuzz::note_input_size(size);
  attn::fuzz::run_model_file(data, size);
  return 0;
}
