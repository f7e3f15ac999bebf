// libFuzzer target: vocab (see text_targets.hpp). Build with -DATTN_BUILD_FUZZERS=ON and clang; run
// scripts/fuzz.sh vocab.
#include <cstddef>
#include <cstdint>

#include "input_stats.hpp"
#include "text_targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attn::fuzz::note_input_size(size);
  attn::fuzz::run_vocab(data, size);
  return 0;
}
