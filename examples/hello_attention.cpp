// A small self-contained demo: builds a layer, runs it, prints what came out.
#include <attn/attn.hpp>
#include <iostream>

int main() {
  attn::Rng rng(42);
  attn::Linear<float> proj(512, 512);
  proj.reset_parameters(rng);
  attn::Tensor<float> x({2, 10, 512});
  attn::fill_normal(x, rng, 0.0, 1.0);
  const attn::Tensor<float>& y = proj.forward(x);
  std::cout << "attn: Linear(512, 512) on " << x.shape() << " -> " << y.shape() << "\n";
}
