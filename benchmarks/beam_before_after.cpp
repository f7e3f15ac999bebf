// Beam-4 decoding of the base model timed against any version of attn's headers, to compare two
// commits (docs/performance.md, "Beam search, before and after the encoder was shared by the
// beams"). Not built by CMake; build it once per tree:
//   git archive f014df9^ include | tar -x -C /tmp/before
//   g++ -O3 -DNDEBUG -fopenmp -march=native -I/tmp/before/include -isystem /usr/include/eigen3 \
//     benchmarks/beam_before_after.cpp -o /tmp/bb_before      (and -Iinclude for the current tree)
//   /tmp/bb_before 1; /tmp/bb_after 1; ... alternately
#include <algorithm>
#include <attn/attn.hpp>
#include <attn/decode/beam_search.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
int main(int argc, char** argv) {
  const attn::Index B = argc > 1 ? std::atol(argv[1]) : 1;  // batch (sources)
  if (B < 1) return 2;
  attn::set_num_threads(2);
  attn::Transformer<float> model(attn::TransformerConfig::base(8000));
  attn::Tensor<attn::TokenId> src({B, 30});
  attn::Rng rng(4);
  for (auto& v : src) v = static_cast<attn::TokenId>(4 + rng.below(8000 - 4));
  attn::DecodeOptions o;
  o.eos = 3;
  o.max_extra_length = 0;
  o.beam_size = 4;
  std::vector<double> ms;
  for (int r = 0; r < 9; ++r) {
    const auto t = std::chrono::steady_clock::now();
    const auto hyps = attn::beam_search(model, src, o);
    const double d =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
    if (r >= 2) ms.push_back(d);
    if (hyps.empty()) return 1;
  }
  std::sort(ms.begin(), ms.end());
  std::printf("batch %ld: median %.1f ms (best %.1f) per beam-4 decode\n", static_cast<long>(B),
              ms[ms.size() / 2], ms[0]);
}
