#include <attn/attn.hpp>
#include <iostream>

int main() {
  // The paper's model at a size that runs anywhere: N=2, d_model=64, h=4, d_ff=128, vocab 100.
  attn::TransformerConfig config = attn::TransformerConfig::tiny(100);
  attn::Transformer<float> model(config);
  attn::Adam<float> adam(model.parameters());  // beta1 0.9, beta2 0.98, eps 1e-9
  attn::LabelSmoothedCrossEntropy<float> loss(0.1, config.pad_id);

  // One batch of 2 sentences: [B, S] source ids, [B, T] target ids (pad 0, bos 2, eos 3).
  auto src = attn::Tensor<attn::TokenId>::from({2, 4}, {5, 6, 7, 3, 8, 9, 3, 0});
  auto tgt_in = attn::Tensor<attn::TokenId>::from({2, 3}, {2, 10, 11, 2, 12, 0});
  auto tgt_out = attn::Tensor<attn::TokenId>::from({2, 3}, {10, 11, 3, 12, 3, 0});

  for (attn::Index step = 1; step <= 40; ++step) {
    adam.zero_grad();
    const attn::Tensor<float>& logits = model.forward(src, tgt_in);  // [B, T, V]
    attn::LossStats stats = loss.forward_backward(logits, tgt_out, 1.0 / 5, step);
    model.backward(loss.dlogits());
    adam.step(attn::noam_lr(step, config.d_model, /*warmup=*/10, /*factor=*/0.5));
    if (step % 10 == 0) std::cout << "step " << step << " loss " << stats.mean_loss() << "\n";
  }
  attn::DecodeOptions beam;  // beam 4, length penalty 0.6, max length = source length + 50
  for (const auto& hyp : attn::beam_search(model, src, beam)) {
    for (attn::TokenId id : hyp) std::cout << id << ' ';
    std::cout << "\n";
  }
}
