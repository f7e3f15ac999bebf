// Checkpoint averaging (the mean, accumulated in double; errors that name the file; metadata that
// must agree) and the exponential moving average of the parameters. Saving and loading
// checkpoints: test_checkpoint.cpp.
#include <attn/train/averaging.hpp>
#include <attn/train/checkpoint.hpp>

#include "checkpoint_testing.hpp"
#include "error_helpers.hpp"
#include "pch.hpp"
#include "temp_dir.hpp"

namespace attn {
namespace {

using testing::contains;
using testing::error_of;
using testing::TwoLayers;

/// A fresh empty directory per test, removed (with its files) afterwards.
using Checkpoint = testing::TempDirTest;

TEST_F(Checkpoint, AveragingThreeCheckpointsGivesTheMean) {
  std::vector<std::string> paths;
  std::vector<std::unique_ptr<TwoLayers<double>>> models;
  for (int i = 0; i < 3; ++i) {
    models.push_back(std::make_unique<TwoLayers<double>>(3, 5));
    Rng rng(static_cast<std::uint64_t>(100 + i));
    for (auto& p : models.back()->parameters()) fill_normal(p.value, rng, i, 1);
    paths.push_back(path("ck" + std::to_string(i) + ".safetensors"));
    save_model(paths.back(), *models.back());
  }
  TwoLayers<double> avg(3, 5);
  average_checkpoints(paths, avg.parameters());
  const auto pa = avg.parameters();
  for (std::size_t k = 0; k < pa.size(); ++k) {
    for (Index i = 0; i < pa[k].value.numel(); ++i) {
      double mean = 0;
      for (const auto& m : models) mean += m->parameters()[k].value.data()[i];
      EXPECT_NEAR(pa[k].value.data()[i], mean / 3, 1e-15) << pa[k].name << "[" << i << "]";
    }
  }
  // float models are accumulated in double and rounded once.
  std::vector<std::string> fpaths;
  std::vector<Tensor<float>> ws;
  for (int i = 0; i < 3; ++i) {
    Linear<float> lin(2, 2, false);
    lin.weight.value = Tensor<float>::from({2, 2}, {0.1f * i, 1e8f, 1.0f + i, -3.0f});
    lin.weight.value(0, 1) += static_cast<float>(i);
    ws.push_back(lin.weight.value.clone());
    fpaths.push_back(path("f" + std::to_string(i) + ".safetensors"));
    save_model(fpaths.back(), lin);
  }
  Linear<float> favg(2, 2, false);
  average_checkpoints(fpaths, favg.parameters());
  for (Index i = 0; i < 4; ++i) {
    const double mean =
        (static_cast<double>(ws[0].data()[i]) + ws[1].data()[i] + ws[2].data()[i]) / 3;
    EXPECT_EQ(favg.weight.value.data()[i], static_cast<float>(mean)) << i;
  }
}

TEST_F(Checkpoint, AveragingErrorsNameTheFile) {
  TwoLayers<double> a(3, 5), b(3, 4), target(3, 5);
  save_model(path("a.safetensors"), a);
  save_model(path("b.safetensors"), b);
  const Tensor<double> before = target.linear1.weight.value.clone();
  const std::string msg = error_of([&] {
    average_checkpoints({path("a.safetensors"), path("b.safetensors")}, target.parameters());
  });
  EXPECT_TRUE(contains(msg, path("b.safetensors"))) << msg;
  EXPECT_TRUE(contains(msg, "expected shape [5, 3], file has [4, 3]")) << msg;
  EXPECT_EQ(target.linear1.weight.value(0, 0), before(0, 0));
  EXPECT_TRUE(contains(error_of([&] { average_checkpoints({}, target.parameters()); }),
                       "no checkpoint paths"));
  EXPECT_THROW(average_checkpoints({path("a.safetensors"), path("zzz")}, target.parameters()),
               IOError);
}

// Checkpoints of two models whose tensors have the same shapes (another vocabulary, say) are
// refused when metadata under the given prefixes differs, is missing, or is extra; other keys
// (a step) may differ.
TEST_F(Checkpoint, AveragingRefusesCheckpointsWhoseGivenMetadataDiffers) {
  TwoLayers<double> a(3, 5), target(3, 5);
  const std::vector<std::string> prefixes{"config.", "vocab."};
  save_model(path("a.safetensors"), a,
             {{"config.d_model", "3"}, {"vocab.hash", "5f"}, {"step", "1"}});
  save_model(path("b.safetensors"), a,
             {{"config.d_model", "3"}, {"vocab.hash", "5f"}, {"step", "2"}});
  save_model(path("c.safetensors"), a, {{"config.d_model", "3"}, {"vocab.hash", "32"}});
  save_model(path("d.safetensors"), a, {{"vocab.hash", "5f"}});
  average_checkpoints({path("a.safetensors"), path("b.safetensors")}, target.parameters(), {},
                      prefixes);
  average_checkpoints({path("a.safetensors"), path("c.safetensors")}, target.parameters());
  const Tensor<double> before = target.linear1.weight.value.clone();
  std::string msg = error_of([&] {
    average_checkpoints({path("a.safetensors"), path("b.safetensors"), path("c.safetensors")},
                        target.parameters(), {}, prefixes);
  });
  EXPECT_TRUE(contains(msg, path("c.safetensors") +
                                ": metadata vocab.hash is \"32\" but \"5f\" in " +
                                path("a.safetensors")))
      << msg;
  EXPECT_EQ(target.linear1.weight.value(0, 0), before(0, 0));
  msg = error_of([&] {
    average_checkpoints({path("d.safetensors"), path("a.safetensors")}, target.parameters(), {},
                        prefixes);
  });
  EXPECT_TRUE(contains(msg, "metadata config.d_model is \"3\" but absent in")) << msg;
  msg = error_of([&] {
    average_checkpoints({path("a.safetensors"), path("d.safetensors")}, target.parameters(), {},
                        prefixes);
  });
  EXPECT_TRUE(contains(msg, "metadata config.d_model is absent but \"3\" in")) << msg;
}

TEST(EMA, UpdateApplyRestoreAndCopy) {
  Linear<double> lin(2, 1);
  lin.weight.value = Tensor<double>::from({1, 2}, {1.0, -2.0});
  lin.bias.value = Tensor<double>::from({1}, {4.0});
  ExponentialMovingAverage<double> ema(lin.parameters(), 0.9);
  lin.weight.value(0, 0) = 3.0;
  ema.update();  // 0.9 * 1 + 0.1 * 3
  lin.weight.value(0, 0) = 5.0;
  ema.update();  // 0.9 * 1.2 + 0.1 * 5
  EXPECT_EQ(ema.updates(), 2);
  const auto st = ema.state();
  EXPECT_EQ(st[0].name, "weight");
  EXPECT_NEAR(st[0].value(0, 0), 1.58, 1e-15);
  EXPECT_NEAR(st[0].value(0, 1), -2.0, 1e-15);
  EXPECT_NEAR(st[1].value(0), 4.0, 1e-15);

  ema.apply();
  EXPECT_NEAR(lin.weight.value(0, 0), 1.58, 1e-15);
  EXPECT_THROW(ema.update(), ConfigError);
  EXPECT_THROW(ema.apply(), ConfigError);
  Linear<double> other(2, 1);
  ema.copy_to(other.parameters());  // the average, also while applied
  EXPECT_NEAR(other.weight.value(0, 0), 1.58, 1e-15);
  ema.restore();
  EXPECT_EQ(lin.weight.value(0, 0), 5.0);  // exact swap back
  EXPECT_THROW(ema.restore(), ConfigError);
  Linear<double> other2(2, 1);
  ema.copy_to(other2.parameters());
  EXPECT_NEAR(other2.weight.value(0, 0), 1.58, 1e-15);
  EXPECT_EQ(other2.bias.value(0), 4.0);

  Linear<double> wrong(3, 1);
  EXPECT_TRUE(
      contains(error_of([&] { ema.copy_to(wrong.parameters()); }), "expected weight [1, 2]"));
  EXPECT_TRUE(contains(error_of([&] { ExponentialMovingAverage<double>(lin.parameters(), 1.0); }),
                       "decay must be in [0, 1), got 1"));
}

}  // namespace
}  // namespace attn
