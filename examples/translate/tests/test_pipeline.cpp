// End-to-end pipeline of attn-translate through its C++ entry points (Trainer, Translator) on a
// tiny synthetic corpus: bit-exact resume, gradient clipping, the cooldown, pre-norm models,
// translation (greedy and beam), BLEU and averaging. The bad input the trainer and translator
// refuse: test_pipeline_bad_input.cpp; the same through the binary: test_cli.cpp and
// test_cli_input.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <attn/train/clip.hpp>
#include <attn/train/safetensors.hpp>
#include <attn/train/schedule.hpp>

#include "corpus_io.hpp"
#include "model_average.hpp"
#include "pipeline_fixture.hpp"
#include "trainer.hpp"
#include "translate_fixture.hpp"
#include "translator.hpp"

using attn::Index;
using namespace attn::translate::testing;

TEST_F(Pipeline, ResumeContinuesBitExactly) {
  const std::string a = path("a"), b = path("b");
  tr::TrainOptions o = tiny_options(a);
  o.log_every = 1;  // every update's loss goes into the curves and so into the comparison
  {
    tr::Trainer first(o, split());
    first.train(3);
    EXPECT_EQ(first.step(), 3);
    first.save_checkpoint();
  }
  tr::TrainOptions resume = o;
  resume.resume = true;
  resume.warmup = 999;  // ignored: the checkpoint's training options win on --resume
  tr::Trainer resumed(resume, split());
  EXPECT_EQ(resumed.step(), 3);
  EXPECT_EQ(resumed.options().warmup, o.warmup);
  resumed.train(3);
  o.model_dir = b;
  tr::Trainer straight(o, split());
  straight.train(6);
  ASSERT_EQ(resumed.step(), 6);
  ASSERT_EQ(straight.step(), 6);
  EXPECT_EQ(resumed.vocab().fingerprint(), straight.vocab().fingerprint());
  // The loss of every update, restored ones included, is the same double.
  ASSERT_EQ(resumed.curves().size(), 6u);
  ASSERT_EQ(straight.curves().size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(resumed.curves()[i].step, straight.curves()[i].step);
    EXPECT_EQ(resumed.curves()[i].train_loss, straight.curves()[i].train_loss) << "update " << i;
  }
  expect_same_parameters(resumed.model(), straight.model());
  EXPECT_EQ(resumed.model().random_state().counter, straight.model().random_state().counter);
  // Adam's moments, the data position and the metadata too: both checkpoints are identical.
  expect_same_checkpoint(resumed.save_checkpoint(), straight.save_checkpoint());
  // A step further the weights have moved: the comparison above compares something that changes.
  const float before = straight.model().parameters()[0].value.data()[0];
  straight.train(1);
  EXPECT_NE(before, straight.model().parameters()[0].value.data()[0]);
}

TEST_F(Pipeline, ClipNormBoundsTheGradientAndSurvivesResume) {
  tr::TrainOptions plain = tiny_options(path("plain"));
  tr::Trainer unclipped(plain, split());
  unclipped.train(1);
  const double norm = unclipped.last_grad_norm();
  ASSERT_TRUE(std::isfinite(norm));
  EXPECT_NEAR(attn::grad_norm(unclipped.model().parameters()), norm, 1e-6 * norm);

  // A tenth of the first update's norm: every update is clipped.
  tr::TrainOptions o = tiny_options(path("clipped"));
  o.clip_norm = norm / 10;
  {  // ends before the resume: one trainer per directory at a time (the lock)
    tr::Trainer clipped(o, split());
    clipped.train(1);
    EXPECT_EQ(clipped.last_grad_norm(), norm);  // reported before clipping
    EXPECT_LE(attn::grad_norm(clipped.model().parameters()), o.clip_norm * (1 + 1e-5));
    EXPECT_GT(attn::grad_norm(clipped.model().parameters()), o.clip_norm * (1 - 1e-4));
    clipped.train(1);
    clipped.save_checkpoint();
  }

  tr::TrainOptions r = o;
  r.resume = true;
  r.clip_norm = 0;  // ignored: the checkpoint's --clip-norm wins
  tr::Trainer resumed(r, split());
  EXPECT_EQ(resumed.options().clip_norm, o.clip_norm);
  resumed.train(2);
  o.model_dir = path("straight");
  tr::Trainer straight(o, split());
  straight.train(4);
  expect_same_parameters(resumed.model(), straight.model());
  // Clipping changed the result, so the resumed run really kept it.
  unclipped.train(3);
  EXPECT_FALSE(same_parameters(unclipped.model(), straight.model()));

  tr::TrainOptions bad = tiny_options(path("bad"));
  bad.clip_norm = -1;
  const std::string msg = error_of<attn::ConfigError>([&] { tr::Trainer t(bad, split()); });
  EXPECT_TRUE(contains(msg, "--clip-norm must be finite and >= 0 (0: off), got -1")) << msg;
}

TEST_F(Pipeline, CooldownTakesTheRateToZeroAtStepsAndResumesExactly) {
  tr::TrainOptions o = tiny_options(path("cool"));
  o.steps = 6;
  o.cooldown = 3;
  {
    tr::Trainer first(o, split());
    EXPECT_EQ(first.options().cooldown_end, 6);
    auto noam = [&](Index s) {
      return attn::noam_lr(s, first.model().config().d_model, o.warmup, o.lr_factor);
    };
    for (Index s = 1; s <= 3; ++s) EXPECT_EQ(first.learning_rate(s), noam(s)) << s;
    // (7 - s) / 4: 3/4, 2/4 and 1/4 of the Noam rate.
    for (Index s = 4; s <= 6; ++s)
      EXPECT_DOUBLE_EQ(first.learning_rate(s), noam(s) * static_cast<double>(7 - s) / 4.0) << s;
    first.train(4);  // into the cooldown
    first.save_checkpoint();
  }
  // Resumed without --steps and with another --cooldown: the checkpoint's cooldown wins and ends
  // the run at step 6, where the rate would reach zero.
  tr::TrainOptions r = tiny_options(path("cool"));
  r.resume = true;
  r.cooldown = 0;
  o.model_dir = path("straight");
  tr::Trainer straight(o, split());
  straight.train();
  EXPECT_EQ(straight.step(), 6);
  {  // ends before the next resume: one trainer per directory at a time (the lock)
    tr::Trainer resumed(r, split());
    EXPECT_EQ(resumed.options().cooldown, 3);
    EXPECT_EQ(resumed.options().cooldown_end, 6);
    resumed.train(10);  // bounded: a lost cooldown fails here instead of training on for ever
    EXPECT_EQ(resumed.step(), 6);
    expect_same_parameters(resumed.model(), straight.model());
  }
  tr::TrainOptions plain = tiny_options(path("plain"));
  tr::Trainer uncooled(plain, split());
  uncooled.train(6);
  EXPECT_FALSE(same_parameters(uncooled.model(), straight.model()));

  // A longer run than the cooldown was planned for is refused.
  r.steps = 7;
  EXPECT_TRUE(contains(error_of<attn::ConfigError>([&] { tr::Trainer t(r, split()); }),
                       "--steps 7 goes past step 6, where this run's --cooldown 3 ends its "
                       "learning rate at zero"));
  tr::TrainOptions no_steps = tiny_options(path("no_steps"));
  no_steps.cooldown = 2;
  EXPECT_TRUE(contains(error_of<attn::ConfigError>([&] { tr::Trainer t(no_steps, split()); }),
                       "--cooldown 2 needs --steps of at least as many updates"));
}

TEST_F(Pipeline, NormFirstBuildsAPreNormModelThatResumesAsOne) {
  tr::TrainOptions o = tiny_options(path("pre"));
  EXPECT_FALSE(tr::make_config(o, 100).norm_first);  // the paper's post-norm by default
  o.norm_first = true;
  EXPECT_TRUE(tr::make_config(o, 100).norm_first);
  train_one_step(o);
  tr::TrainOptions r = tiny_options(path("pre"));  // norm_first off: the checkpoint's model wins
  r.resume = true;
  tr::Trainer resumed(r, split());
  EXPECT_TRUE(resumed.model().config().norm_first);
  resumed.train(1);
  EXPECT_EQ(resumed.step(), 2);
}

TEST_F(Pipeline, TrainTranslateEvaluateAverage) {
  const std::string a = path("a");
  tr::TrainOptions o = tiny_options(a);
  o.checkpoint_every = 50;
  o.average = 2;
  o.svg = true;
  o.warmup = 100;  // peak lr 64^-0.5 * 100^-0.5 = 0.0125
  tr::Trainer trainer(o, split());
  trainer.train(200);
  trainer.finish();
  // Training learned something: the loss fell well below its start (ln 60 = 4.1) on both sets.
  ASSERT_GE(trainer.curves().size(), 2u);
  EXPECT_GT(trainer.curves().front().train_loss, 3.0);
  EXPECT_LT(trainer.curves().back().train_loss, 2.0);
  EXPECT_LT(trainer.curves().back().valid_loss, 2.0);
  for (const char* f :
       {"spm.model", "vocab.txt", "model.safetensors", "curves.svg", "attention.svg",
        "checkpoint_200.safetensors", "checkpoint_150.safetensors"})
    EXPECT_TRUE(fs::exists(fs::path(a) / f)) << f;
  EXPECT_FALSE(fs::exists(fs::path(a) / "checkpoint_50.safetensors"));
  EXPECT_EQ(tr::list_checkpoints(a).size(), 3u);  // --keep 3 of 50, 100, 150, 200

  // model.safetensors is the mean of the last two checkpoints.
  {
    const auto f150 = attn::load_safetensors(a + "/checkpoint_150.safetensors");
    const auto f200 = attn::load_safetensors(a + "/checkpoint_200.safetensors");
    const auto avg = attn::load_safetensors(a + "/model.safetensors");
    const std::string name = trainer.model().parameters()[0].name;
    const auto x = f150.tensor<float>(name), y = f200.tensor<float>(name),
               m = avg.tensor<float>(name);
    bool differ = false;
    for (Index i = 0; i < m.numel(); ++i) {
      EXPECT_NEAR(m.data()[i], 0.5 * (double(x.data()[i]) + y.data()[i]), 1e-6);
      differ |= x.data()[i] != y.data()[i];
    }
    EXPECT_TRUE(differ);
  }

  tr::Translator translator(a);
  const std::vector<std::string> lines = {"the red cat", "", "a big dog sleeps"};
  tr::TranslateOptions greedy;
  greedy.greedy = true;
  const auto g = translator.translate(lines, greedy);
  const auto b = translator.translate(lines, tr::TranslateOptions{});
  ASSERT_EQ(g.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(g[1], "");
  EXPECT_EQ(b[1], "");
  EXPECT_FALSE(g[0].empty());
  EXPECT_FALSE(b[2].empty());

  const tr::CorpusSplit d = split();
  const tr::BleuScore score = translator.evaluate(d.test.src, d.test.tgt, greedy, {});
  EXPECT_GT(score.ref_len, 0);
  EXPECT_GT(score.hyp_len, 0);
  EXPECT_GT(score.score, 0.0);

  // Averaging by hand gives the same file as the trainer's.
  const std::string out = path("avg.safetensors");
  tr::average_files({a + "/checkpoint_150.safetensors", a + "/checkpoint_200.safetensors"}, out);
  for (const auto& p : trainer.model().parameters())
    EXPECT_EQ(attn::load_safetensors(out).tensor<float>(p.name).vector(),
              attn::load_safetensors(a + "/model.safetensors").tensor<float>(p.name).vector())
        << p.name;
  const std::string too_many = error_of<attn::ConfigError>([&] { tr::average_last(a, 9); });
  EXPECT_TRUE(contains(too_many, "asked for the last 9 checkpoints but '" + a + "' has 3"))
      << too_many;
}
