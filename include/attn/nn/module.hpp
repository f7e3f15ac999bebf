// Module<T>: the base of every layer that owns parameters, children or caches.
//
// Contract shared by all modules (the way dlib's layers_abstract.h states its layer contracts):
//   forward(inputs...)   requires: inputs of the documented shapes (ShapeError otherwise).
//                        ensures:  returns the module's output buffer, valid until the next
//                                  forward; keeps exactly what backward needs (documented per
//                                  member) as handles, not copies.
//   backward(dy)         requires: the last call was forward on the same module; dy has the
//                                  output's shape.
//                        ensures:  parameter gradients ACCUMULATE (+=) into Parameter::grad, so
//                                  several backward passes sum (gradient accumulation);
//                                  returns the gradient of the input(s), overwritten each call.
//   zero_grad()          sets every parameter gradient to zero.
//   train(bool)/eval()   switches dropout on or off in this module and all its children.
//
// Modules register parameters and children by name in their constructor, so parameters() can
// enumerate (name, value, grad) with torch.nn.Transformer's state_dict names, and one Adam, one
// checkpoint writer and one gradient checker serve every module. Registration stores pointers to
// members, so modules are neither copyable nor movable; hold layers in std::unique_ptr.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "attn/parallel.hpp"
#include "attn/random.hpp"
#include "attn/tensor.hpp"

namespace attn {

/// A learnable tensor and the gradient that backward accumulates into it (same shape).
template <class T>
struct Parameter {
  Tensor<T> value;
  Tensor<T> grad;

  void allocate(const Shape& shape) {
    value = Tensor<T>(shape);
    grad = Tensor<T>(shape);
  }
  /// Shares `other`'s value and gradient storage (weight tying): updates to one are the other's.
  void tie_to(const Parameter& other) {
    value = other.value;
    grad = other.grad;
  }
};

/// One entry of Module::parameters(): handles to the value and gradient storage.
template <class T>
struct NamedParameter {
  std::string name;
  Tensor<T> value;
  Tensor<T> grad;
};

template <class T>
class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = delete;
  Module& operator=(Module&&) = delete;
  virtual ~Module() = default;

  /// Every parameter once, in registration order, with dotted PyTorch-style names. A tied
  /// parameter (shared storage) appears once, under the first name it was registered with.
  std::vector<NamedParameter<T>> parameters() const {
    std::vector<NamedParameter<T>> out;
    std::unordered_set<const T*> seen;
    collect("", out, seen);
    return out;
  }

  /// The number of distinct learnable scalars.
  Index num_parameters() const {
    Index n = 0;
    for (const auto& p : parameters()) n += p.value.numel();
    return n;
  }

  /// Zeroes every gradient (a tied one once per name it has), allocating nothing: unlike
  /// parameters(), it builds no names.
  void zero_grad() {
    for (auto& entry : params_)
      parallel_zero(entry.second->grad.data(), entry.second->grad.numel());
    for (auto& child : children_) child.second->zero_grad();
  }

  void train(bool on = true) {
    training_ = on;
    for (auto& child : children_) child.second->train(on);
  }
  void eval() { train(false); }
  bool is_training() const { return training_; }

  /// Makes this module and its children draw dropout masks from `state`.
  void set_random_state(const std::shared_ptr<RandomState>& state) {
    on_random_state(state);
    for (auto& child : children_) child.second->set_random_state(state);
  }

 protected:
  void register_parameter(std::string name, Parameter<T>* p) {
    params_.emplace_back(std::move(name), p);
  }
  /// An empty name flattens: the child's parameters appear under this module's own prefix (how
  /// FeedForward's linear1/linear2 sit directly in a Transformer layer, as in PyTorch).
  void register_module(std::string name, Module* m) { children_.emplace_back(std::move(name), m); }
  /// Modules that draw random numbers (Dropout) keep the state they are given here.
  virtual void on_random_state(const std::shared_ptr<RandomState>& /*state*/) {}

  /// Gives every parameter a zero gradient in one buffer, in parameters() order, each starting on
  /// a detail::kAlignment boundary (the padding between them stays zero); a tied gradient stays
  /// shared. A run of consecutive parameters then has its gradients in one contiguous range, which
  /// a data-parallel sum reduces in place instead of packing (train/data_parallel.hpp). Call it at
  /// the end of a model's constructor, before any backward: a handle to a gradient taken before
  /// (parameters(), an optimiser) would keep the old storage. The buffer is not written here, so
  /// it takes no memory until backward writes it (detail::Storage).
  void gather_gradients() {
    std::vector<Parameter<T>*> slots;
    collect_slots(slots);
    constexpr Index kPad = static_cast<Index>(detail::kAlignment / sizeof(T));
    static_assert(kPad >= 1 && detail::kAlignment % sizeof(T) == 0);
    std::unordered_map<const T*, Index> offset_of;  // each distinct gradient, first seen first
    Index total = 0;
    for (const Parameter<T>* p : slots)
      if (!p->grad.empty() && offset_of.emplace(p->grad.data(), total).second)
        total += (p->grad.numel() + kPad - 1) / kPad * kPad;
    Tensor<T> buffer(Shape{total});
    for (Parameter<T>* p : slots) {  // a tied gradient's slots all find its one offset
      if (p->grad.empty()) continue;
      const Index at = offset_of.at(p->grad.data());
      const Shape& shape = p->grad.shape();
      p->grad = buffer.slice(at, at + p->grad.numel())
                    .reshape(std::vector<Index>(shape.begin(), shape.end()));
    }
  }

 private:
  void collect_slots(std::vector<Parameter<T>*>& out) const {
    for (const auto& entry : params_) out.push_back(entry.second);
    for (const auto& child : children_) child.second->collect_slots(out);
  }

  void collect(const std::string& prefix, std::vector<NamedParameter<T>>& out,
               std::unordered_set<const T*>& seen) const {
    for (const auto& [name, p] : params_) {
      if (!seen.insert(p->value.data()).second) continue;
      out.push_back({prefix + name, p->value, p->grad});
    }
    for (const auto& [name, child] : children_)
      child->collect(name.empty() ? prefix : prefix + name + ".", out, seen);
  }

  std::vector<std::pair<std::string, Parameter<T>*>> params_;
  std::vector<std::pair<std::string, Module*>> children_;
  bool training_ = true;
};

namespace detail {

/// Throws ShapeError unless x is a layer activation [B, L, D], and B == batch when batch >= 0
/// (the batch of `batch_of`).
template <class T>
void check_activation(const Tensor<T>& x, Index d_model, const char* who, const char* what,
                      Index batch = -1, const char* batch_of = "the target") {
  const bool ok = x.rank() == 3 && x.size(2) == d_model && (batch < 0 || x.size(0) == batch);
  if (batch < 0)
    ATTN_CHECK(ok, ShapeError, who, ": expected ", what, " [B, L, ", d_model, "], got ", x.shape());
  else
    ATTN_CHECK(ok, ShapeError, who, ": expected ", what, " [", batch, ", S, ", d_model, "] (B of ",
               batch_of, "), got ", x.shape());
}

/// Throws ShapeError for a default-constructed tensor (no storage), which element-wise modules
/// would otherwise turn into a one-element scalar.
template <class T>
void check_has_storage(const Tensor<T>& x, const char* who) {
  ATTN_CHECK(x.has_storage(), ShapeError, who,
             ": expected a tensor with storage, got a default-constructed one");
}

}  // namespace detail

}  // namespace attn
