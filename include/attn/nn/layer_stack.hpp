// What the encoder and the decoder stacks share (section 3.1: "a stack of N = 6 identical
// layers"): N layers named "layers.{i}" and an optional final LayerNorm named "norm", as in
// torch.nn.TransformerEncoder / TransformerDecoder. Pre-norm stacks need the final norm; the
// paper's post-norm stack has none (torch.nn.Transformer always adds one).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attn/error.hpp"
#include "attn/nn/gradient_hook.hpp"
#include "attn/nn/layer_norm.hpp"
#include "attn/nn/layer_options.hpp"
#include "attn/nn/module.hpp"

namespace attn {

template <class T, class Layer>
class LayerStack : public Module<T> {
 public:
  const LayerOptions& options() const { return options_; }
  Index num_layers() const { return static_cast<Index>(layers.size()); }

  void reset_parameters(Rng& rng) {
    for (auto& layer : layers) layer->reset_parameters(rng);
    if (norm) norm->reset_parameters(rng);
  }

  /// The stages of backward (gradient_hook.hpp), in the order it runs them: the final norm when
  /// there is one, then each layer from the last to the first. backward(dy, finished) calls
  /// finished() after each.
  std::vector<BackwardStage<T>> backward_stages() const {
    std::vector<BackwardStage<T>> stages;
    if (norm) stages.push_back({norm.get()});
    for (auto it = layers.rbegin(); it != layers.rend(); ++it) stages.push_back({it->get()});
    return stages;
  }

  std::vector<std::unique_ptr<Layer>> layers;
  std::unique_ptr<LayerNorm<T>> norm;  // null unless final_norm

 protected:
  /// `who` names the stack in the error when num_layers is not positive.
  LayerStack(const LayerOptions& options, Index num_layers, bool final_norm, const char* who)
      : options_(options) {
    options_.validate();
    ATTN_CHECK(num_layers > 0, ConfigError, who, ": num_layers must be > 0, got ", num_layers);
    for (Index i = 0; i < num_layers; ++i) {
      layers.push_back(std::make_unique<Layer>(options_));
      this->register_module("layers." + std::to_string(i), layers.back().get());
    }
    if (final_norm) {
      norm = std::make_unique<LayerNorm<T>>(options_.d_model, options_.layer_norm_eps);
      this->register_module("norm", norm.get());
    }
  }

  /// The final norm's forward when there is one, else h itself.
  const Tensor<T>& final_forward(const Tensor<T>& h) { return norm ? norm->forward(h) : h; }
  /// Backward through the final norm (when there is one) and the layers from the last to the
  /// first, calling finished() after each stage and then after_layer(layer, is_last_layer).
  template <class Finished, class AfterLayer>
  const Tensor<T>& backward_layers(const Tensor<T>& dy, Finished& finished,
                                   AfterLayer after_layer) {
    const Tensor<T>* d = &final_backward(dy, finished);
    for (auto it = layers.rbegin(); it != layers.rend(); ++it) {
      d = &(*it)->backward(*d);
      finished();
      after_layer(**it, it == layers.rbegin());
    }
    return *d;
  }

  /// The final norm's backward when there is one (then finished(): its stage is over), else dy.
  template <class Finished>
  const Tensor<T>& final_backward(const Tensor<T>& dy, Finished& finished) {
    if (!norm) return dy;
    const Tensor<T>& dh = norm->backward(dy);
    finished();
    return dh;
  }

 private:
  LayerOptions options_;
};

}  // namespace attn
