// Transformer::set_gradient_hook (nn/gradient_hook.hpp): backward reports every parameter exactly
// once per pass, only when its gradient is final, in the order the stages run; the shared
// embedding last. A parameter the hook missed would never be summed over the ranks
// (train/data_parallel.hpp), so this is what overlapped data-parallel training rests on.
#include <gtest/gtest.h>

#include <attn/attn.hpp>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "training_task.hpp"

namespace attn {
namespace {

struct Report {
  std::size_t call = 0;  // which hook call reported it
  Tensor<double> grad;   // the gradient at that moment
};

// One backward pass with a hook that records, for each parameter index, when it was reported and
// its gradient then. Fails on a parameter reported twice.
std::map<Index, Report> run_and_record(Transformer<double>& model, std::size_t& calls,
                                       Index pass_seed = 1) {
  const auto params = model.parameters();
  std::map<Index, Report> reports;
  calls = 0;
  model.set_gradient_hook([&](const std::vector<Index>& ids) {
    for (Index id : ids) {
      EXPECT_TRUE(id >= 0 && static_cast<std::size_t>(id) < params.size()) << id;
      EXPECT_EQ(reports.count(id), 0u)
          << params[static_cast<std::size_t>(id)].name << " reported twice";
      Report& r = reports[id];
      r.call = calls;
      r.grad = params[static_cast<std::size_t>(id)].grad.clone();
    }
    ++calls;
  });
  const testing::Batch b = testing::stream_batch(3, pass_seed, 4, model.config().src_vocab);
  const Tensor<double>& logits = model.forward(b.src, b.tgt_in);
  LabelSmoothedCrossEntropy<double> loss(0.1, testing::kPad);
  loss.forward_backward(logits, b.tgt_out, 1.0, 1);
  model.backward(loss.dlogits());
  return reports;
}

TransformerConfig config_named(const std::string& variant) {
  TransformerConfig c = testing::task_config(19, 0.1);
  if (variant == "untied") c.share_embeddings = c.tie_output = false;
  if (variant == "tie_output") c.share_embeddings = false;
  if (variant == "pre_norm_learned_positions") c.norm_first = c.learned_positions = true;
  return c;
}

class GradientHook : public ::testing::TestWithParam<std::string> {};

TEST_P(GradientHook, ReportsEveryParameterOnceWithItsFinalGradient) {
  Transformer<double> model(config_named(GetParam()));
  model.zero_grad();
  std::size_t calls = 0;
  const auto reports = run_and_record(model, calls);
  const auto params = model.parameters();
  ASSERT_EQ(reports.size(), params.size());  // every index once (twice fails in the hook)
  EXPECT_EQ(calls, model.backward_stages().size());
  for (const auto& [id, r] : reports) {
    const auto& p = params[static_cast<std::size_t>(id)];
    // Final: backward did not change the gradient after reporting it. Every gradient is nonzero
    // here, so a report before the last use (the tied weight's) would show.
    EXPECT_EQ(0, std::memcmp(r.grad.data(), p.grad.data(), sizeof(double) * p.grad.numel()))
        << p.name << " changed after the hook reported it final";
  }
}

TEST_P(GradientHook, StagesRunFromTheOutputDownAndTheSharedEmbeddingComesLast) {
  const TransformerConfig c = config_named(GetParam());
  Transformer<double> model(c);
  std::size_t calls = 0;
  const auto reports = run_and_record(model, calls);
  const auto params = model.parameters();
  auto call_of = [&](const std::string& name) {
    for (std::size_t i = 0; i < params.size(); ++i)
      if (params[i].name == name) return reports.at(static_cast<Index>(i)).call;
    ADD_FAILURE() << "no parameter " << name;
    return std::size_t{0};
  };
  const std::string w = ".self_attn.in_proj_weight";
  const Index L = c.decoder_layers;
  ASSERT_GE(L, 2);
  // Decoder layers from the last to the first, then the encoder's likewise.
  EXPECT_LT(call_of("decoder.layers." + std::to_string(L - 1) + w),
            call_of("decoder.layers.0" + w));
  EXPECT_LT(call_of("decoder.layers.0" + w),
            call_of("encoder.layers." + std::to_string(c.encoder_layers - 1) + w));
  EXPECT_LT(call_of("encoder.layers." + std::to_string(c.encoder_layers - 1) + w),
            call_of("encoder.layers.0" + w));
  // The source embedding (shared with the target and the generator unless untied) is last.
  EXPECT_EQ(call_of("src_embed.weight"), calls - 1);
  if (!c.share_embeddings) {  // the target embedding is done before the encoder starts
    EXPECT_LT(call_of("tgt_embed.weight"), call_of("encoder.layers.0" + w));
  }
  if (!c.share_embeddings && !c.tie_output) {
    EXPECT_EQ(call_of("generator.weight"), 0u);
  }
  if (c.norm_first) {
    EXPECT_LT(call_of("decoder.norm.weight"),
              call_of("decoder.layers." + std::to_string(L - 1) + w));
    EXPECT_LT(call_of("encoder.norm.weight"),
              call_of("encoder.layers." + std::to_string(c.encoder_layers - 1) + w));
  }
}

TEST_P(GradientHook, FiresAgainOnEveryPassAndChangesNoGradient) {
  const TransformerConfig c = config_named(GetParam());
  Transformer<double> with_hook(c), without(c);
  std::size_t calls = 0;
  run_and_record(with_hook, calls, 1);
  const auto second = run_and_record(with_hook, calls, 2);  // accumulates onto the first pass
  EXPECT_EQ(second.size(), with_hook.parameters().size());
  LabelSmoothedCrossEntropy<double> loss(0.1, testing::kPad);
  for (Index k : {1, 2}) {
    const testing::Batch b = testing::stream_batch(3, k, 4, c.src_vocab);
    loss.forward_backward(without.forward(b.src, b.tgt_in), b.tgt_out, 1.0, 1);
    without.backward(loss.dlogits());
  }
  const auto a = with_hook.parameters(), b = without.parameters();
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(0,
              std::memcmp(a[i].grad.data(), b[i].grad.data(), sizeof(double) * a[i].grad.numel()))
        << a[i].name;
  // An empty hook turns it off.
  with_hook.set_gradient_hook({});
  const testing::Batch batch = testing::stream_batch(3, 3, 4, c.src_vocab);
  loss.forward_backward(with_hook.forward(batch.src, batch.tgt_in), batch.tgt_out, 1.0, 1);
  EXPECT_NO_THROW(with_hook.backward(loss.dlogits()));
}

INSTANTIATE_TEST_SUITE_P(Configurations, GradientHook,
                         ::testing::Values("shared", "untied", "tie_output",
                                           "pre_norm_learned_positions"));

TEST(FinalParametersByStage, NamesAParameterNoStageUses) {
  Transformer<double> model(testing::task_config(19, 0.0));
  std::vector<BackwardStage<double>> stages = model.backward_stages();
  stages.erase(stages.begin() + 1);  // the decoder's last layer
  try {
    final_parameters_by_stage<double>(model, stages);
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("decoder.layers.1.self_attn.in_proj_weight belongs to "
                                         "no stage of backward"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace attn
