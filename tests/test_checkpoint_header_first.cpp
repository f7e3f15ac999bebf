// A checkpoint's header is checked against what will be loaded before any tensor is read: a
// tensor the model does not have, or more training state than allowed, declared over a sparse hole
// so that the tensors still tile the file, was read whole before its name or size was refused.
// read_safetensors_header gives the header alone, and load_safetensors calls a caller's check of it
// before reading the rest.
#include <cstdint>
#include <string>

#include <attn/train/averaging.hpp>
#include <attn/train/checkpoint.hpp>

#include "checkpoint_testing.hpp"
#include "error_helpers.hpp"
#include "pch.hpp"
#include "safetensors_testing.hpp"
#include "temp_dir.hpp"

namespace attn {
namespace {

using testing::contains;
using testing::error_of;
using testing::TwoLayers;

using HeaderFirst = testing::TempDirTest;

// Declared 1 TiB long: reading it would end in std::bad_alloc (an IOError "do not fit"), not in
// the FormatError that names the tensor.
constexpr std::uint64_t kHole = std::uint64_t{1} << 40;

TEST_F(HeaderFirst, TheHeaderAloneHasNamesShapesAndMetadataButNoBytes) {
  TwoLayers<float> model(4, 8);
  save_model(path("m.safetensors"), model, {{"config", "{}"}});
  testing::append_sparse_tensor(path("m.safetensors"), "extra.big", kHole);
  const SafetensorsFile header = read_safetensors_header(path("m.safetensors"));
  EXPECT_FALSE(header.has_data());
  EXPECT_EQ(header.metadata().at("config"), "{}");
  ASSERT_EQ(header.size(), 5u);
  EXPECT_EQ(header.info("encoder.layers.0.linear1.weight").shape, (std::vector<Index>{8, 4}));
  EXPECT_EQ(header.info("extra.big").end - header.info("extra.big").begin, kHole);
  const std::string what =
      error_of<StateError>([&] { header.tensor<float>("encoder.layers.0.linear1.weight"); });
  EXPECT_TRUE(
      contains(what, "only the header was read, not tensor encoder.layers.0.linear1.weight"))
      << what;
  // The header is checked as a whole file's is: a file cut short is refused.
  std::filesystem::resize_file(path("m.safetensors"), kHole);
  EXPECT_THROW(read_safetensors_header(path("m.safetensors")), FormatError);
}

TEST_F(HeaderFirst, LoadModelRefusesATensorOutsideTheModelBeforeReadingIt) {
  TwoLayers<float> model(4, 8);
  save_model(path("junk.safetensors"), model);
  testing::append_sparse_tensor(path("junk.safetensors"), "junk", kHole);
  const std::string what =
      error_of<FormatError>([&] { load_model(path("junk.safetensors"), model); });
  EXPECT_TRUE(contains(what, "has unexpected tensor junk [1099511627776]")) << what;
  std::vector<NamedParameter<float>> params = model.parameters();
  EXPECT_THROW(average_checkpoints({path("junk.safetensors")}, params), FormatError);
}

TEST_F(HeaderFirst, SkippedTensorsAreBoundedByMaxIgnoredBytes) {
  TwoLayers<float> model(4, 8);
  save_model(path("m.safetensors"), model);
  testing::append_sparse_tensor(path("m.safetensors"), "extra.a", 24);
  testing::append_sparse_tensor(path("m.safetensors"), "extra.b", 16);
  LoadOptions opt{{"extra."}};
  EXPECT_NO_THROW(load_model(path("m.safetensors"), model, opt));  // no bound by default
  opt.max_ignored_bytes = 40;
  EXPECT_NO_THROW(load_model(path("m.safetensors"), model, opt));
  opt.max_ignored_bytes = 39;
  const std::string what =
      error_of<FormatError>([&] { load_model(path("m.safetensors"), model, opt); });
  EXPECT_TRUE(contains(what,
                       "its tensors outside the model, up to extra.b, hold 40 bytes, more "
                       "than the 39 allowed"))
      << what;
  // Declared 1 TiB long, refused before it is read.
  testing::append_sparse_tensor(path("m.safetensors"), "extra.huge", kHole);
  opt.max_ignored_bytes = 1 << 20;
  EXPECT_THROW(load_model(path("m.safetensors"), model, opt), FormatError);
}

TEST_F(HeaderFirst, ATrainingCheckpointsExtraTensorsAreBoundedBeforeTheyAreRead) {
  TwoLayers<float> model(4, 8);
  Adam<float> adam(model.parameters());
  RandomState rng;
  save_training_checkpoint(path("c.safetensors"), model.parameters(), adam, rng);
  testing::append_sparse_tensor(path("c.safetensors"), "extra.huge", kHole);
  const std::string what = error_of<FormatError>(
      [&] { load_training_checkpoint(path("c.safetensors"), model.parameters(), adam, rng, 0); });
  EXPECT_TRUE(contains(what, "up to extra.huge, hold 1099511627776 bytes, more than the 0 allowed"))
      << what;
  // The metadata is checked from the header too, first: a model file is no training checkpoint.
  save_model(path("m.safetensors"), model);
  const std::string model_file = error_of<FormatError>(
      [&] { load_training_checkpoint(path("m.safetensors"), model.parameters(), adam, rng); });
  EXPECT_TRUE(contains(model_file, "has no metadata \"step\" (not a training checkpoint?)"))
      << model_file;
}

}  // namespace
}  // namespace attn
