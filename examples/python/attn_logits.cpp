// attn's side of the attn <-> PyTorch comparison (attn_to_torch.py --check): loads an
// attn-translate model directory the way `attn-translate translate` does, translates one sentence
// greedily, and prints as JSON the source ids, the greedy output ids, its text, and the logits
// [T, V] of the teacher-forced forward over BOS + output (the full forward, not the incremental
// one, so that both sides compute the same thing).
//
//   attn-logits <model-dir> <sentence>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "translator.hpp"

namespace tr = attn::translate;

namespace {

void print_ids(const char* key, const std::vector<attn::TokenId>& ids) {
  std::printf("\"%s\": [", key);
  for (std::size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? ", " : "", ids[i]);
  std::printf("],\n");
}

void print_json_string(const char* key, const std::string& s) {
  std::printf("\"%s\": \"", key);
  for (unsigned char c : s) {
    if (c == '"' || c == '\\')
      std::printf("\\%c", c);
    else if (c < 0x20)
      std::printf("\\u%04x", c);
    else
      std::putchar(c);
  }
  std::printf("\",\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: attn-logits <model-dir> <sentence>\n";
    return 2;
  }
  try {
    attn::set_num_threads(1);
    tr::Translator translator(argv[1]);
    const std::vector<attn::TokenId> src_ids = translator.vocab().encode(argv[2]);
    tr::TranslateOptions greedy;
    greedy.greedy = true;
    const std::vector<attn::TokenId> out =
        tr::translate_ids(translator.model(), {src_ids}, greedy).at(0);

    const auto n = static_cast<attn::Index>(src_ids.size());
    attn::Tensor<attn::TokenId> src({1, n}), tgt_in({1, static_cast<attn::Index>(out.size()) + 1});
    for (attn::Index i = 0; i < n; ++i) src(0, i) = src_ids[static_cast<std::size_t>(i)];
    tgt_in(0, 0) = tr::SubwordVocab::kBos;
    for (std::size_t i = 0; i < out.size(); ++i)
      tgt_in(0, static_cast<attn::Index>(i) + 1) = out[i];
    attn::Transformer<float>& model = translator.model();
    model.eval();
    const attn::Tensor<float>& logits = model.forward(src, tgt_in);  // [1, T, V]

    std::printf("{\n");
    print_ids("src_ids", src_ids);
    print_ids("greedy_ids", out);
    print_json_string("greedy_text", translator.vocab().decode(out));
    std::printf("\"logits\": [");
    const attn::Index T = logits.size(1), V = logits.size(2);
    for (attn::Index t = 0; t < T; ++t) {
      std::printf("%s[", t ? ",\n  " : "");
      for (attn::Index v = 0; v < V; ++v)
        std::printf("%s%.9g", v ? ", " : "", static_cast<double>(logits(0, t, v)));
      std::printf("]");
    }
    std::printf("]\n}\n");
  } catch (const std::exception& e) {
    std::cerr << "attn-logits: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
