// libFuzzer target for the gettext .mo reader (examples/translate/mo_catalog.cpp): any input must
// either parse or be refused with attn::Error; crashes, other exceptions and sanitizer reports are
// bugs. Build with -DATTN_BUILD_FUZZERS=ON and clang; run scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>

#include "input_stats.hpp"
#include "mo_catalog_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attn::fuzz::note_input_size(size);
  attn::fuzz::run_mo_catalog(data, size);
  return 0;
}
