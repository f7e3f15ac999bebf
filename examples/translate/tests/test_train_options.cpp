// The option table of attn-translate train (train_options.hpp) and what its readers make of it:
// validate() refuses every value outside a row's range naming the flag, a checkpoint stores and
// restores every stored row exactly, and make_config applies the model overrides.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "error_helpers.hpp"
#include "train_state.hpp"

namespace tr = attn::translate;
using attn::Index;
using attn::testing::contains;
using attn::testing::error_of;
using namespace tr::option_rows;  // the ranges' constructors

namespace {

// Options that validate() accepts, with `edit` applied.
template <class Edit>
tr::TrainOptions valid_options(Edit edit) {
  tr::TrainOptions o;
  o.model_dir = "m";
  edit(o);
  return o;
}

// The values just outside `r` that its type can hold: below lo, above hi, and NaN.
template <class T>
std::vector<T> outside(const tr::Range<T>& r) {
  std::vector<T> values;
  if (r.any) return values;
  if constexpr (std::is_floating_point_v<T>) {
    values.push_back(r.lo_open ? r.lo : std::nextafter(r.lo, -INFINITY));
    if (r.hi == std::numeric_limits<T>::max())
      values.push_back(INFINITY);
    else
      values.push_back(r.hi_open ? r.hi : std::nextafter(r.hi, INFINITY));
    values.push_back(std::numeric_limits<T>::quiet_NaN());
  } else {
    if (r.lo_open) values.push_back(r.lo);
    if (!r.lo_open && r.lo > std::numeric_limits<T>::lowest()) values.push_back(r.lo - 1);
    if (r.hi_open) values.push_back(r.hi);
    if (!r.hi_open && r.hi < std::numeric_limits<T>::max()) values.push_back(r.hi + 1);
  }
  return values;
}

// Calls f(index, name) for each numeric row of the table, by its position in the table.
template <class F>
void for_each_numeric_row(F f) {
  int row = 0;
  tr::TrainOptions{}.visit_options([&](const tr::OptionInfo& info, const auto& v, const auto&) {
    using V = std::decay_t<decltype(v)>;
    if constexpr (tr::kIsNumber<V>) f(row, info.name());
    ++row;
  });
}

}  // namespace

TEST(OptionTable, EveryValueOutsideARowsRangeIsRefusedNamingItsFlag) {
  std::set<std::string> rows, refused;
  for_each_numeric_row([&](int target, const std::string& name) {
    rows.insert(name);
    // One value outside the target row's range at a time, the other rows valid.
    for (std::size_t k = 0;; ++k) {
      std::string value;
      const tr::TrainOptions o = valid_options([&](tr::TrainOptions& opt) {
        int row = 0;
        opt.visit_options([&](const tr::OptionInfo&, auto& field, const auto& range) {
          using V = std::decay_t<decltype(field)>;
          if constexpr (tr::kIsNumber<V>) {
            const std::vector<V> bad = outside(range);
            if (row == target && k < bad.size()) {
              field = bad[k];
              value = std::to_string(bad[k]);
            }
          }
          ++row;
        });
      });
      if (value.empty()) break;
      SCOPED_TRACE(name + " = " + value);
      const std::string msg = error_of<attn::ConfigError>([&] { o.validate(); });
      EXPECT_TRUE(contains(msg, name + " must be ")) << msg;
      refused.insert(name);
    }
  });
  // Every numeric row has a bound but --seed, which takes every 64-bit value.
  rows.erase("--seed");
  EXPECT_EQ(refused, rows);
  EXPECT_TRUE(rows.count("--attention-dropout") && rows.count("train.cooldown_end"));
}

TEST(OptionTable, ANewOptionsDropoutsReachTheModelAndOnlyWhenGiven) {
  const tr::TrainOptions given = valid_options([](tr::TrainOptions& o) {
    o.dropout = 0.25;
    o.attention_dropout = 0.125;
    o.relu_dropout = 0.375;
  });
  const attn::TransformerConfig c = tr::make_config(given, 100);
  EXPECT_EQ(c.dropout, 0.25);
  EXPECT_EQ(c.attention_dropout, 0.125);
  EXPECT_EQ(c.relu_dropout, 0.375);
  const attn::TransformerConfig preset = attn::TransformerConfig::named("small", 100);
  const attn::TransformerConfig kept = tr::make_config(valid_options([](auto&) {}), 100);
  EXPECT_EQ(kept.dropout, preset.dropout);
  EXPECT_EQ(kept.attention_dropout, preset.attention_dropout);
  EXPECT_EQ(kept.relu_dropout, preset.relu_dropout);
}

TEST(OptionTable, ACheckpointRestoresEveryStoredOptionExactly) {
  // Every stored field set to a value of its range that no default has.
  tr::TrainOptions given = valid_options([](auto&) {});
  std::set<std::string> keys;
  given.visit_saved([&](const char* key, auto& v, bool, const auto& range) {
    using V = std::decay_t<decltype(v)>;
    EXPECT_TRUE(keys.insert(key).second) << key << " stored twice";
    if constexpr (std::is_floating_point_v<V>)
      v = range.hi == std::numeric_limits<V>::max() ? V(0.1) + V(1) / V(3) : range.hi / V(3);
    else
      v = static_cast<V>(range.lo + (range.hi - range.lo) / 2 + 1);
    EXPECT_TRUE(range.contains(v)) << key;
  });
  // The keys are a checkpoint's format: a renamed one makes --resume refuse older checkpoints.
  const std::set<std::string> expected = {
      "train.label_smoothing", "train.warmup",      "train.lr_factor",  "train.cooldown",
      "train.cooldown_end",    "train.clip_norm",   "train.max_tokens", "train.tokens_per_update",
      "translate.max_len",     "train.bpe_dropout", "train.seed"};
  EXPECT_EQ(keys, expected);
  tr::Metadata m;
  tr::store_options(given, m);
  EXPECT_EQ(m.size(), keys.size());
  tr::TrainOptions restored = valid_options([](auto&) {});
  tr::restore_options(restored, m, "ckpt");
  given.visit_saved([&](const char* key, const auto& v, bool, const auto&) {
    bool found = false;
    restored.visit_saved([&](const char* k, const auto& r, bool, const auto&) {
      if (std::string(k) != key) return;
      found = true;
      if constexpr (std::is_same_v<decltype(v), decltype(r)>) {
        EXPECT_EQ(v, r) << key;
      } else {
        ADD_FAILURE() << key << " restored as another type";
      }
    });
    EXPECT_TRUE(found) << key;
  });
}

TEST(OptionTable, ACheckpointWithoutALaterOptionRestoresItOffAndWithoutAnOldOneIsRefused) {
  tr::TrainOptions given = valid_options([](tr::TrainOptions& o) {
    o.clip_norm = 1.5;
    o.bpe_dropout = 0.1;
    o.cooldown = 7;
  });
  tr::Metadata m;
  tr::store_options(given, m);
  m.erase("train.clip_norm");
  m.erase("train.bpe_dropout");
  m.erase("train.cooldown");
  tr::TrainOptions restored = given;
  tr::restore_options(restored, m, "ckpt");
  EXPECT_EQ(restored.clip_norm, 0.0);
  EXPECT_EQ(restored.bpe_dropout, 0.0);
  EXPECT_EQ(restored.cooldown, 0);
  m.erase("train.warmup");
  const std::string msg =
      error_of<attn::FormatError>([&] { tr::restore_options(restored, m, "ckpt"); });
  EXPECT_TRUE(contains(msg, "ckpt lacks metadata train.warmup")) << msg;
}

TEST(OptionTable, RangesDescribeThemselvesAsValidateSaysThem) {
  EXPECT_EQ(within(Index(2), Index(65536)).text(), "in [2, 65536]");
  EXPECT_EQ(at_least(Index(0)).text(), ">= 0");
  EXPECT_EQ(above(0.0).text(), "finite and > 0");
  EXPECT_EQ(at_least(0.0).text(), "finite and >= 0");
  EXPECT_FALSE(at_least(0.0).contains(INFINITY));
  EXPECT_FALSE(within(0.0, 1.0).contains(std::nan("")));
  EXPECT_FALSE(above(0.0).contains(0.0));
  EXPECT_TRUE(anything<std::string>().contains("x"));
  EXPECT_EQ(below(-1.0, 1.0).text(), "in [-1, 1)");
  EXPECT_FALSE(below(-1.0, 1.0).contains(1.0));
  EXPECT_TRUE(below(-1.0, 1.0).contains(-1.0));
}

TEST(OptionTable, EveryModelFieldARowNamesIsAFieldOfTheConfig) {
  std::set<std::string> fields, named;
  attn::TransformerConfig{}.visit_fields(
      [&](const char* name, const auto&, attn::FieldRule) { fields.insert(name); });
  tr::TrainOptions{}.visit_options([&](const tr::OptionInfo& info, const auto&, const auto&) {
    for (const char* f : info.model_fields)
      if (f) {
        EXPECT_TRUE(fields.count(f)) << info.name() << " names " << f;
        named.insert(f);
      }
  });
  // The overrides make_config applied by hand before the table: none was lost.
  for (const char* f :
       {"d_model", "encoder_layers", "decoder_layers", "heads", "d_ff", "dropout",
        "attention_dropout", "relu_dropout", "norm_first", "src_vocab", "tgt_vocab"})
    EXPECT_TRUE(named.count(f)) << f;
}

TEST(OptionTable, EveryGivenOverrideReachesTheModelAndTheVocabularyIsTheTrainersOwn) {
  const tr::TrainOptions given = valid_options([](tr::TrainOptions& o) {
    o.d_model = 96;
    o.layers = 3;
    o.heads = 3;
    o.d_ff = 160;
    o.norm_first = true;
    o.vocab_size = 5000;
  });
  const attn::TransformerConfig c = tr::make_config(given, 123);
  EXPECT_EQ(c.d_model, 96);
  EXPECT_EQ(c.encoder_layers, 3);
  EXPECT_EQ(c.decoder_layers, 3);
  EXPECT_EQ(c.heads, 3);
  EXPECT_EQ(c.d_ff, 160);
  EXPECT_TRUE(c.norm_first);
  EXPECT_EQ(c.src_vocab, 123);  // the vocabulary trained, not --vocab-size
  EXPECT_EQ(c.tgt_vocab, 123);
  EXPECT_EQ(c.seed, given.seed);
}
