// A consumer of the checkpoint headers, linked to attn::checkpoint alone: saves a tiny model,
// loads it into a second one and checks that the two give the same logits. Exits non-zero
// otherwise, so the packaging test fails.
#include <attn/attn.hpp>
#include <attn/train/checkpoint.hpp>
#include <cstdio>
#include <iostream>
#include <string>

int main() {
  attn::TransformerConfig config = attn::TransformerConfig::tiny(20);
  attn::Transformer<float> saved(config);
  const std::string path = "checkpoint_consumer.safetensors";
  attn::save_model(path, saved, config.to_metadata());

  attn::TransformerConfig other = config;
  other.seed = config.seed + 1;  // different initial weights until loaded
  attn::Transformer<float> loaded(other);
  const auto metadata = attn::load_model(path, loaded);
  std::remove(path.c_str());

  auto src = attn::Tensor<attn::TokenId>::from({1, 3}, {5, 6, 7});
  auto tgt = attn::Tensor<attn::TokenId>::from({1, 2}, {2, 8});
  saved.eval();
  loaded.eval();
  const attn::Tensor<float> a = saved.forward(src, tgt).clone();
  const attn::Tensor<float>& b = loaded.forward(src, tgt);
  for (attn::Index i = 0; i < a.numel(); ++i) {
    if (a.data()[i] != b.data()[i]) {
      std::cerr << "logit " << i << " differs after save/load: " << a.data()[i] << " vs "
                << b.data()[i] << "\n";
      return 1;
    }
  }
  if (attn::TransformerConfig::from_metadata(metadata).to_metadata() != config.to_metadata()) {
    std::cerr << "the config did not round-trip through the checkpoint metadata\n";
    return 1;
  }
  std::cout << "checkpoint round trip: " << a.numel() << " logits identical\n";
  return 0;
}
