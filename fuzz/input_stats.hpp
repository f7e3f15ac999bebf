// What sizes of input a libFuzzer target executed: libFuzzer reports the corpus, whose inputs it
// keeps small (it replaces an input by a shorter one with the same coverage), but not the inputs it
// ran. Each entry point calls note_input_size; at exit the largest size and the number of inputs of
// at least 512 KiB are printed beside libFuzzer's own stat:: lines.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>

namespace attn::fuzz {

namespace impl {
inline std::size_t largest_input = 0;
inline std::size_t large_inputs = 0;  // at least 512 KiB
inline void print_input_stats() {
  std::fprintf(stderr, "stat::largest_input_bytes:      %zu\nstat::inputs_of_512KiB_or_more: %zu\n",
               largest_input, large_inputs);
}
}  // namespace impl

inline void note_input_size(std::size_t size) {
  static const bool registered = std::atexit(impl::print_input_stats) == 0;
  (void)registered;
  if (size > impl::largest_input) impl::largest_input = size;
  if (size >= (std::size_t{512} << 10)) ++impl::large_inputs;
}

}  // namespace attn::fuzz
