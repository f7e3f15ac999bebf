// Model and training checkpoints (bit-exact round trips, resuming bitwise, errors that name the
// tensor or the file), checkpoint averaging and the exponential moving average. The safetensors
// format under them is tested in test_safetensors_file.cpp.
#include <attn/train/averaging.hpp>
#include <attn/train/checkpoint.hpp>
#include <attn/train/schedule.hpp>

#include "error_helpers.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"
#include "temp_dir.hpp"

namespace attn {
namespace {

using testing::contains;
using testing::error_of;

/// A fresh empty directory per test, removed (with its files) afterwards.
using Checkpoint = testing::TempDirTest;

template <class T>
struct TwoLayers : Module<T> {
  TwoLayers(Index d, Index f, bool bias2 = true) : linear1(d, f), linear2(f, d, bias2) {
    this->register_module("encoder.layers.0.linear1", &linear1);
    this->register_module("encoder.layers.0.linear2", &linear2);
    Rng rng(static_cast<std::uint64_t>(d * 131 + f));
    linear1.reset_parameters(rng);
    linear2.reset_parameters(rng);
    fill_normal(linear1.bias.value, rng, 0, 1);
  }
  Linear<T> linear1, linear2;
};

template <class T>
bool same_bits(const std::vector<NamedParameter<T>>& a, const std::vector<NamedParameter<T>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t k = 0; k < a.size(); ++k)
    if (a[k].name != b[k].name || a[k].value.shape() != b[k].value.shape() ||
        std::memcmp(a[k].value.data(), b[k].value.data(), a[k].value.numel() * sizeof(T)) != 0)
      return false;
  return true;
}

TEST_F(Checkpoint, ModelRoundTripIsBitExact) {
  TwoLayers<float> a(4, 8);
  save_model(path("m.safetensors"), a, {{"config", "{}"}});
  TwoLayers<float> b(4, 8);
  b.linear1.weight.value.fill(0);
  EXPECT_FALSE(same_bits(a.parameters(), b.parameters()));
  const auto meta = load_model(path("m.safetensors"), b);
  EXPECT_TRUE(same_bits(a.parameters(), b.parameters()));
  EXPECT_EQ(meta.at("config"), "{}");
  const auto names = load_safetensors(path("m.safetensors")).names();
  EXPECT_EQ(names.front(), "encoder.layers.0.linear1.weight");
}

TEST_F(Checkpoint, LoadModelNamesTheTensorThatDoesNotFit) {
  TwoLayers<float> model(4, 8);
  const Tensor<float> before = model.linear1.weight.value.clone();
  auto unchanged = [&] {
    return std::memcmp(before.data(), model.linear1.weight.value.data(), before.numel() * 4) == 0;
  };
  TwoLayers<float> wrong_shape(4, 6);
  save_model(path("shape.safetensors"), wrong_shape);
  std::string msg = error_of([&] { load_model(path("shape.safetensors"), model); });
  EXPECT_TRUE(contains(msg,
                       "checkpoint tensor encoder.layers.0.linear1.weight: expected shape [8, 4], "
                       "file has [6, 4]"))
      << msg;
  EXPECT_THROW(load_model(path("shape.safetensors"), model), FormatError);

  TwoLayers<float> no_bias(4, 8, false);
  save_model(path("nobias.safetensors"), no_bias);
  msg = error_of([&] { load_model(path("nobias.safetensors"), model); });
  EXPECT_TRUE(contains(msg, "has no tensor encoder.layers.0.linear2.bias (expected shape [4])"))
      << msg;
  EXPECT_TRUE(unchanged());  // checked before anything is copied

  save_model(path("full.safetensors"), model);
  msg = error_of([&] { load_model(path("full.safetensors"), no_bias); });
  EXPECT_TRUE(contains(msg, "unexpected tensor encoder.layers.0.linear2.bias [4]")) << msg;
  EXPECT_NO_THROW(load_model(path("full.safetensors"), no_bias, LoadOptions{{}, true}));
  EXPECT_NO_THROW(
      load_model(path("full.safetensors"), no_bias, LoadOptions{{"encoder.layers.0.linear2.b"}}));

  TwoLayers<double> dbl(4, 8);
  save_model(path("double.safetensors"), dbl);
  msg = error_of([&] { load_model(path("double.safetensors"), model); });
  EXPECT_TRUE(contains(msg,
                       "checkpoint tensor encoder.layers.0.linear1.weight: expected dtype F32, "
                       "file has F64"))
      << msg;
  EXPECT_TRUE(unchanged());
}

/// One deterministic training step of a Linear: loss sum(y * r) for inputs drawn from `step`,
/// a dropout-like key draw from `rs`, Noam learning rate.
void train_step(Linear<float>& lin, Adam<float>& adam, RandomState& rs, Index step) {
  Rng data(1000 + static_cast<std::uint64_t>(step));
  Tensor<float> x({3, 4}), r({3, 2});
  fill_normal(x, data, 0, 1);
  fill_normal(r, data, 0, 1);
  const std::uint64_t key = rs.next_key();
  for (Index i = 0; i < x.numel(); ++i)
    x.data()[i] *= uniform_at(key, static_cast<std::uint64_t>(i)) < 0.1 ? 0.0f : 1.0f;
  adam.zero_grad();
  lin.forward(x);
  lin.backward(r);
  adam.step(noam_lr(step, 4, 2, 10.0));
}

TEST_F(Checkpoint, TrainingCheckpointResumesBitwise) {
  Rng init(5);
  Linear<float> a(4, 2);
  a.reset_parameters(init);
  Linear<float> b(4, 2);
  std::copy(a.weight.value.begin(), a.weight.value.end(), b.weight.value.begin());
  Adam<float> adam_a(a.parameters()), adam_b(b.parameters());
  RandomState rs_a{42, 0}, rs_b{42, 0};
  ExponentialMovingAverage<float> ema_b(b.parameters(), 0.9);

  for (Index s = 1; s <= 6; ++s) train_step(a, adam_a, rs_a, s);  // uninterrupted
  for (Index s = 1; s <= 3; ++s) {
    train_step(b, adam_b, rs_b, s);
    ema_b.update();
  }
  save_training_checkpoint(path("train.safetensors"), b.parameters(), adam_b, rs_b,
                           {{"config", "{\"d_model\":4}"}}, ema_b.entries("ema."));

  // A fresh process: other values, zero moments, another stream.
  Linear<float> c(4, 2);
  Adam<float> adam_c(c.parameters());
  RandomState rs_c{1, 1};
  ExponentialMovingAverage<float> ema_c(c.parameters(), 0.9);
  const TrainingCheckpoint ck =
      load_training_checkpoint(path("train.safetensors"), c.parameters(), adam_c, rs_c);
  ema_c.load_state(ck.file, "extra.ema.");
  EXPECT_EQ(ck.step, 3);
  EXPECT_EQ(adam_c.steps(), 3);
  EXPECT_EQ(rs_c.seed, 42u);
  EXPECT_EQ(rs_c.counter, rs_b.counter);
  EXPECT_EQ(ck.metadata.at("config"), "{\"d_model\":4}");
  EXPECT_EQ(ck.metadata.at("rng_counter"), "3");
  EXPECT_TRUE(same_bits(b.parameters(), c.parameters()));
  const auto sb = adam_b.state(), sc = adam_c.state();
  for (std::size_t k = 0; k < sb.size(); ++k)
    EXPECT_EQ(std::memcmp(sb[k].value.data(), sc[k].value.data(), sb[k].value.numel() * 4), 0)
        << sb[k].name;
  for (std::size_t k = 0; k < 2; ++k)
    EXPECT_EQ(std::memcmp(ema_b.state()[k].value.data(), ema_c.state()[k].value.data(),
                          ema_b.state()[k].value.numel() * 4),
              0);

  for (Index s = 4; s <= 6; ++s) train_step(c, adam_c, rs_c, s);
  EXPECT_TRUE(same_bits(a.parameters(), c.parameters()));
  EXPECT_EQ(rs_c.counter, rs_a.counter);
  const auto sa = adam_a.state(), sc2 = adam_c.state();
  for (std::size_t k = 0; k < sa.size(); ++k)
    EXPECT_EQ(std::memcmp(sa[k].value.data(), sc2[k].value.data(), sa[k].value.numel() * 4), 0)
        << sa[k].name;

  // A training checkpoint is also a model checkpoint once its training state is ignored.
  Linear<float> d(4, 2);
  EXPECT_TRUE(contains(error_of([&] { load_model(path("train.safetensors"), d); }),
                       "unexpected tensor adam.weight.exp_avg"));
  load_model(path("train.safetensors"), d, LoadOptions{kTrainingStatePrefixes});
  EXPECT_TRUE(same_bits(b.parameters(), d.parameters()));
}

TEST_F(Checkpoint, TrainingCheckpointErrors) {
  Linear<float> lin(4, 2);
  Adam<float> adam(lin.parameters());
  RandomState rs{1, 2};
  EXPECT_TRUE(
      contains(error_of([&] {
                 save_training_checkpoint(path("t"), lin.parameters(), adam, rs, {{"step", "9"}});
               }),
               "metadata key \"step\" is reserved"));
  save_model(path("model.safetensors"), lin);
  std::string msg = error_of(
      [&] { load_training_checkpoint(path("model.safetensors"), lin.parameters(), adam, rs); });
  EXPECT_TRUE(contains(msg, "has no metadata \"step\"")) << msg;

  std::vector<TensorEntry> entries;
  for (const auto& p : lin.parameters()) entries.push_back(tensor_entry(p.name, p.value));
  for (const auto& s : adam.state()) entries.push_back(tensor_entry("adam." + s.name, s.value));
  save_safetensors(path("badstep.safetensors"), entries,
                   {{"step", "12x"}, {"rng_seed", "1"}, {"rng_counter", "2"}});
  msg = error_of(
      [&] { load_training_checkpoint(path("badstep.safetensors"), lin.parameters(), adam, rs); });
  EXPECT_TRUE(
      contains(msg, "metadata \"step\" must be a non-negative decimal integer, got \"12x\""))
      << msg;

  // A step beyond Index used to be cast to a negative count that Adam refused only after the
  // weights had been overwritten: every check now comes before the first change.
  Linear<float> other(4, 2);
  other.weight.value.fill(7.0f);
  std::vector<TensorEntry> other_entries;
  for (const auto& p : other.parameters()) other_entries.push_back(tensor_entry(p.name, p.value));
  for (const auto& s : adam.state())
    other_entries.push_back(tensor_entry("adam." + s.name, s.value));
  for (const char* step : {"9223372036854775808", "18446744073709551616", "-1", " 1", "1 "}) {
    save_safetensors(path("hugestep.safetensors"), other_entries,
                     {{"step", step}, {"rng_seed", "1"}, {"rng_counter", "2"}});
    msg = error_of([&] {
      load_training_checkpoint(path("hugestep.safetensors"), lin.parameters(), adam, rs);
    });
    EXPECT_TRUE(contains(msg,
                         "hugestep.safetensors: metadata \"step\" must be a non-negative "
                         "decimal integer, got \"" +
                             std::string(step) + "\""))
        << msg;
    EXPECT_NE(lin.weight.value.data()[0], 7.0f) << "weights overwritten by a refused file";
  }

  entries.pop_back();  // no adam.bias.exp_avg_sq
  save_safetensors(path("noadam.safetensors"), entries,
                   {{"step", "1"}, {"rng_seed", "1"}, {"rng_counter", "2"}});
  msg = error_of(
      [&] { load_training_checkpoint(path("noadam.safetensors"), lin.parameters(), adam, rs); });
  EXPECT_TRUE(contains(msg, "has no tensor adam.bias.exp_avg_sq")) << msg;
  EXPECT_EQ(adam.steps(), 0);
  EXPECT_EQ(rs.counter, 2u);  // nothing restored from a bad file
}

// Session 41: a step count of INT64_MAX was accepted and overflowed at the next update (undefined
// behaviour, then "noam_lr: step counts from 1, got -9223372036854775808"), and a NaN first moment
// or a negative second moment resumed, so that the first update wrote NaN weights into the next
// checkpoint. Both are refused, naming the file, before anything changes.
TEST_F(Checkpoint, TrainingCheckpointStepsAndMomentsAreBounded) {
  Linear<float> lin(4, 2), saved(4, 2);
  saved.weight.value.fill(7.0f);
  Adam<float> adam(lin.parameters());
  RandomState rs{1, 2};
  const auto save = [&](const std::string& step, const char* poisoned, float value) {
    std::vector<TensorEntry> entries;
    for (const auto& p : saved.parameters()) entries.push_back(tensor_entry(p.name, p.value));
    for (const auto& st : adam.state()) {
      Tensor<float> moment = st.value.clone();
      if (st.name == std::string(poisoned)) moment.data()[1] = value;
      entries.push_back(tensor_entry("adam." + st.name, moment));
    }
    save_safetensors(path("ck.safetensors"), entries,
                     {{"step", step}, {"rng_seed", "1"}, {"rng_counter", "2"}});
  };
  const auto load_error = [&] {
    return error_of(
        [&] { load_training_checkpoint(path("ck.safetensors"), lin.parameters(), adam, rs); });
  };
  for (const char* step : {"9223372036854775807", "9007199254740993"}) {
    save(step, "", 0);
    EXPECT_TRUE(contains(load_error(),
                         "metadata \"step\" must be a non-negative decimal integer, "
                         "got \"" +
                             std::string(step) + "\" (at most 9007199254740992)"));
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const struct {
    const char* moment;
    float value;
    const char* expected;
  } poisons[] = {
      {"weight.exp_avg", nan,
       "Adam's weight.exp_avg holds nan at element 1, expected a finite number"},
      {"bias.exp_avg", -std::numeric_limits<float>::infinity(), "Adam's bias.exp_avg holds -inf"},
      {"weight.exp_avg_sq", -1.0f,
       "Adam's weight.exp_avg_sq holds -1 at element 1, expected a finite number >= 0"},
      {"bias.exp_avg_sq", nan, "Adam's bias.exp_avg_sq holds nan"}};
  for (const auto& p : poisons) {
    save("5", p.moment, p.value);
    const std::string msg = load_error();
    EXPECT_TRUE(contains(msg, "ck.safetensors: " + std::string(p.expected))) << msg;
    EXPECT_NE(lin.weight.value.data()[0], 7.0f) << "weights overwritten by a refused file";
    EXPECT_EQ(adam.steps(), 0);
  }
  save("9007199254740992", "weight.exp_avg", -1.0f);  // a negative first moment is a moment
  EXPECT_EQ(load_training_checkpoint(path("ck.safetensors"), lin.parameters(), adam, rs).step,
            Index{1} << 53);
  EXPECT_EQ(lin.weight.value.data()[0], 7.0f);
}

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
