// Model and training checkpoints: bit-exact round trips, resuming bitwise, errors that name the
// tensor or the file, and bounds on the step and Adam's moments. Averaging and the exponential
// moving average: test_checkpoint_averaging.cpp; the safetensors format under them:
// test_safetensors_file.cpp.
#include <attn/train/averaging.hpp>
#include <attn/train/checkpoint.hpp>
#include <attn/train/schedule.hpp>

#include "checkpoint_testing.hpp"
#include "error_helpers.hpp"
#include "gradcheck.hpp"
#include "pch.hpp"
#include "temp_dir.hpp"

namespace attn {
namespace {

using testing::contains;
using testing::error_of;
using testing::TwoLayers;

/// A fresh empty directory per test, removed (with its files) afterwards.
using Checkpoint = testing::TempDirTest;

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

}  // namespace
}  // namespace attn
