// Gradient hooks: a backward pass that says which parameters' gradients are final as soon as they
// are, so that a data-parallel trainer can start summing them over the ranks while backward goes
// on with the layers below (train/data_parallel.hpp does).
//
// Backward runs in stages (Transformer: the generator, the decoder's layers from the last to the
// first, the target embedding, the encoder's layers, the source embedding). After each stage it
// calls the hook with the indices, into model.parameters(), of the parameters that no later stage
// touches: their gradients will not change again in this pass. Over one pass every parameter is
// reported exactly once. A weight shared by several stages (a tied embedding) is reported after
// the last of them. A stage that finishes nothing reports an empty list.
#pragma once

#include <cstddef>
#include <functional>
#include <unordered_map>
#include <vector>

#include "attn/error.hpp"
#include "attn/nn/module.hpp"

namespace attn {

/// Called during backward with indices into model.parameters() whose gradients are final.
using GradientHook = std::function<void(const std::vector<Index>& final_parameters)>;

namespace detail {

/// What Encoder/Decoder::backward call after each stage when nobody listens.
struct NoStageHook {
  void operator()() const {}
};

}  // namespace detail

/// The modules of one backward stage (null entries are skipped: an absent final norm).
template <class T>
using BackwardStage = std::vector<const Module<T>*>;

/// For each stage of `model`'s backward pass, in the order it runs, the indices into
/// model.parameters() of the parameters whose last use is in that stage. Throws Error if a
/// parameter of `model` belongs to no stage or a stage holds a parameter `model` does not list:
/// a hook would then never report it, and its gradient would never be summed.
template <class T>
std::vector<std::vector<Index>> final_parameters_by_stage(
    const Module<T>& model, const std::vector<BackwardStage<T>>& stages) {
  const auto all = model.parameters();
  std::unordered_map<const T*, std::size_t> index;
  for (std::size_t i = 0; i < all.size(); ++i) index[all[i].value.data()] = i;
  std::vector<std::ptrdiff_t> last(all.size(), -1);  // the last stage that uses each parameter
  for (std::size_t k = 0; k < stages.size(); ++k)
    for (const Module<T>* m : stages[k]) {
      if (m == nullptr) continue;
      for (const auto& p : m->parameters()) {
        const auto it = index.find(p.value.data());
        ATTN_CHECK(it != index.end(), ConfigError, "final_parameters_by_stage: stage ", k,
                   " holds ", p.name, ", which the model does not list");
        last[it->second] = static_cast<std::ptrdiff_t>(k);
      }
    }
  std::vector<std::vector<Index>> out(stages.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    ATTN_CHECK(last[i] >= 0, ConfigError, "final_parameters_by_stage: ", all[i].name,
               " belongs to no stage of backward, so no hook would report it");
    out[static_cast<std::size_t>(last[i])].push_back(static_cast<Index>(i));
  }
  return out;
}

}  // namespace attn
