#include <attn/attn.hpp>
#include <iostream>

int main() {
  attn::Rng rng(42);
  attn::Linear<float> proj(512, 512);  // torch.nn.Linear layout: weight [512, 512], bias [512]
  proj.reset_parameters(rng);

  attn::Tensor<float> x({2, 10, 512});  // [B, L, D]
  attn::fill_normal(x, rng, 0.0, 1.0);
  const attn::Tensor<float>& y = proj.forward(x);  // one GEMM over the [B*L, D] rows
  std::cout << "output shape " << y.shape() << "\n";
}
