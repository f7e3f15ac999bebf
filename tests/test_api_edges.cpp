// The library's API at the edges of its domain: the calls a read-only audit (session 42) found to
// crash, hang, overflow or answer wrongly in silence, each now an attn::Error naming what was
// expected and what came. Their neighbours that already behaved are in the topic files.
#include <attn/attn.hpp>
#include <attn/train/checkpoint.hpp>
#include <attn/train/safetensors.hpp>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "error_helpers.hpp"
#include "pch.hpp"
#include "temp_dir.hpp"

namespace attn {
namespace {

using testing::contains;
using testing::error_of;
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

TEST(ApiEdges, DecodeStepTakesOnlyTheCachesNextPosition) {
  // A huge position grew the sine table until memory ran out (1e7: 15 s, 2.5 GB), or overflowed
  // (INT64_MAX: undefined behaviour, then an Eigen assertion); any other position than the
  // cache's next one gave the token a position its key does not have.
  Transformer<float> m(TransformerConfig::tiny(10));
  m.eval();
  const auto src = Tensor<TokenId>::from({1, 3}, {4, 5, 3});
  const Tensor<float> memory = m.encode(src).clone();
  DecoderCache<float> cache = m.make_decoder_cache(1, 4);
  const auto bos = Tensor<TokenId>::full({1, 1}, 2);
  for (const Index position : {Index(1), Index(10'000'000), std::numeric_limits<Index>::max()}) {
    const std::string msg =
        error_of<IndexError>([&] { m.decode_step(bos, position, memory, cache); });
    EXPECT_TRUE(contains(
        msg, "position " + std::to_string(position) + " is not the cache's next position, 0"))
        << msg;
  }
  EXPECT_NO_THROW(m.decode_step(bos, 0, memory, cache));
  EXPECT_NO_THROW(m.decode_step(bos, 1, memory, cache));
  SinusoidalPositionalEncoding<float> pe(8);
  const Tensor<float> x({1, 2, 8});
  EXPECT_THROW(pe.forward(x, std::numeric_limits<Index>::max()), IndexError);
  EXPECT_THROW(pe.forward(x, SinusoidalPositionalEncoding<float>::kMaxLength - 1), IndexError);
  EXPECT_NO_THROW(pe.forward(x, 100));
  EXPECT_THROW(pe.table(SinusoidalPositionalEncoding<float>::kMaxLength + 1), IndexError);
}

TEST(ApiEdges, ReshapeChecksItsProductAndNamesBothShapes) {
  const auto t = Tensor<float>::full({2, 3}, 1.f);
  const Index big = Index(1) << 40;
  EXPECT_TRUE(contains(error_of<ShapeError>([&] {
                         t.reshape({-1, big, big});
                       }),
                       "reshape: cannot view shape [2, 3] (6 elements) as [-1, " +
                           std::to_string(big) + ", " + std::to_string(big) + "]"));
  EXPECT_EQ(error_of<ShapeError>([&] {
              t.reshape({-1, 4});
            }),
            "reshape: cannot view shape [2, 3] (6 elements) as [-1, 4]");
  EXPECT_THROW(t.reshape({-2, 3}), ShapeError);
  EXPECT_THROW(t.reshape({big, big, 0, -1}), ShapeError);  // no extent to infer from 0
  EXPECT_EQ(t.reshape({3, -1}).shape(), Shape({3, 2}));
}

TEST(ApiEdges, GemmRefusesSizesThatDoNotMatchAndAnOutputThatIsAnInput) {
  // Release builds checked the sizes with an assertion only: a wrong product, rows of c left
  // unwritten, or a heap overflow in the packing. An output that is an input was read while
  // written (errors up to 158).
  const Mat a = Mat::Random(64, 64), b = Mat::Random(64, 64);
  Mat c(64, 64), small(32, 64);
  EXPECT_EQ(error_of<ShapeError>([&] { kernels::gemm(c, small, b, false); }),
            "kernels::gemm: expected a [M, K], b [K, N] and c [M, N], got a [32, 64], b [64, 64] "
            "and c [64, 64]");
  const Mat wide = Mat::Random(64, 80);
  EXPECT_THROW(kernels::gemm(c, wide, b, false), ShapeError);
  Mat d = a;
  EXPECT_TRUE(contains(error_of<ShapeError>([&] { kernels::gemm(d, d, b, false); }),
                       "the output c shares memory with the input a"));
  EXPECT_TRUE(contains(error_of<ShapeError>([&] { kernels::gemm(d, a, d, true); }),
                       "the output c shares memory with the input b"));
  // Column blocks of one buffer that share no element, as Q, K and V of the fused projection:
  // c = columns [0, 64), a = columns [64, 128) and b = columns [128, 192) of the rows below.
  Mat buffer = Mat::Random(64, 192);
  const Mat want = buffer.middleCols(64, 64) * buffer.middleCols(128, 64);
  kernels::gemm(buffer.leftCols(64), buffer.middleCols(64, 64), buffer.middleCols(128, 64), false);
  EXPECT_LT((buffer.leftCols(64) - want).cwiseAbs().maxCoeff(), 1e-3f);
  // Blocks of one buffer whose rows wrap into the next row of the buffer: a [32, 24] from column
  // 48 of a row stride of 64. c [32, 16] at column 0 shares elements with it only through the wrap
  // (a's columns 16 to 23 are the next row's 0 to 7); at column 16 it shares none; one row down,
  // c starts after a.
  using Strided = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
  Mat buf = Mat::Random(64, 64);
  const Strided wraps(buf.data() + 48, 32, 24, Eigen::OuterStride<>(64));
  const Mat b24 = Mat::Random(24, 16);
  EXPECT_THROW(kernels::gemm(buf.block(0, 0, 32, 16), wraps, b24, false), ShapeError);
  const Mat want16 = wraps * b24;
  kernels::gemm(buf.block(0, 16, 32, 16), wraps, b24, false);
  EXPECT_LT((buf.block(0, 16, 32, 16) - want16).cwiseAbs().maxCoeff(), 1e-3f);
  EXPECT_THROW(kernels::gemm(buf.block(1, 0, 16, 16), wraps, b24, false), ShapeError);
  // A view with a negative stride (the rows in reverse) is taken to share elements.
  const Strided reversed(buf.data() + 63 * 64, 63, 64, Eigen::OuterStride<>(-64));
  EXPECT_THROW(kernels::gemm(buf.bottomRows(63), reversed, b, false), ShapeError);
}

TEST(ApiEdges, AKeyPaddingMaskOfZeroRowsFitsOnlyZeroRows) {
  // It was taken for the default mask, and every key of every row was attended.
  MultiHeadAttention<float> mha(4, 2);
  Rng rng(1);
  mha.reset_parameters(rng);
  Tensor<float> x({2, 3, 4});
  fill_normal(x, rng, 0, 1);
  for (const KeyPaddingMask& mask : {KeyPaddingMask::from_lengths({}, 3),
                                     KeyPaddingMask::from_tokens(Tensor<TokenId>({0, 3}), 0)}) {
    AttentionMask<float> m;
    m.key_padding = mask;
    EXPECT_FALSE(mask.empty());
    EXPECT_TRUE(contains(error_of<ShapeError>([&] { mha.forward_self(x, m); }),
                         "KeyPaddingMask: expected [B, S] = [2, 3], got [0, 3]"));
  }
  EXPECT_TRUE(KeyPaddingMask().empty());
  // A negative length escaped as std::length_error.
  EXPECT_EQ(error_of<ShapeError>([] { KeyPaddingMask::from_lengths({1}, -5); }),
            "KeyPaddingMask: max_len must be >= 0, got -5");
  EXPECT_THROW(DecoderCache<float>().allocate(-1, 1, 4, 8), ShapeError);
}

TEST(ApiEdges, DecodingOptionsAreCheckedWhereverTheyEnter) {
  // BeamState with beam_size 0 wrote through a null pointer; a BOS equal to the padding id
  // decoded with a model that forward() does not compute (logits 1.8 apart at position 0).
  DecodeOptions o;
  o.beam_size = 0;
  EXPECT_THROW(BeamState({5}, o, 10, 0), ConfigError);
  EXPECT_THROW(BeamState({-1}, DecodeOptions{}, 10, 0), ConfigError);
  // A padding id outside the vocabulary was written past the candidates; a vocabulary so large
  // that beams times vocabulary overflows escaped as std::length_error.
  EXPECT_TRUE(contains(error_of<ConfigError>([] { BeamState({5}, DecodeOptions{}, 10, 10); }),
                       "decode: the padding id (10) must be in the vocabulary [0, 10)"));
  EXPECT_TRUE(contains(error_of<ConfigError>([] { BeamState({5}, DecodeOptions{}, 10, -1); }),
                       "decode: the padding id (-1)"));
  EXPECT_TRUE(
      contains(error_of<ConfigError>([] { BeamState({5}, DecodeOptions{}, Index(1) << 61, 0); }),
               "decode: the vocabulary size must be in [1, 16777216], got 2305843009213693952"));
  Transformer<float> m(TransformerConfig::tiny(10));  // pad_id 0
  const auto src = Tensor<TokenId>::from({1, 3}, {4, 5, 3});
  o = {};
  o.bos = 0;
  for (const bool greedy : {true, false})
    EXPECT_TRUE(contains(
        error_of<ConfigError>([&] { greedy ? greedy_decode(m, src, o) : beam_search(m, src, o); }),
        "decode: bos (0) must not be the model's padding id (0)"));
}

TEST(ApiEdges, ASentenceWithAnOutputLimitOfZeroGetsNoToken) {
  // An all-padding source with no extra length decoded to nothing alone, but to one token next to
  // a longer sentence: the output depended on the batch.
  Transformer<float> m(TransformerConfig::tiny(10));
  DecodeOptions o;
  o.max_extra_length = 0;
  const auto batch = Tensor<TokenId>::from({2, 3}, {0, 0, 0, 5, 6, 3});
  for (const bool greedy : {true, false}) {
    const auto out = greedy ? greedy_decode(m, batch, o) : beam_search(m, batch, o);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_TRUE(out[0].empty()) << greedy << ": " << out[0].size() << " tokens";
    EXPECT_LE(out[1].size(), 3u);
  }
}

TEST(ApiEdges, FloatSettingsMustFitTheParametersType) {
  // Checked in double, used in float: NaN or infinite weights, gradients and outputs in silence.
  Parameter<float> p;
  p.allocate({4});
  const std::vector<NamedParameter<float>> params{{"w", p.value, p.grad}};
  AdamOptions o;
  o.eps = 1e-50;  // 0 in float
  EXPECT_THROW(Adam<float>(params, o), ConfigError);
  o = {};
  o.weight_decay = std::numeric_limits<double>::infinity();
  EXPECT_THROW(Adam<float>(params, o), ConfigError);
  Adam<float> adam(params);
  EXPECT_TRUE(contains(error_of<ConfigError>([&] { adam.step(1e39); }),
                       "beyond the range of the parameters' type"));
  EXPECT_EQ(adam.steps(), 0);  // the refused step counts for nothing
  EXPECT_THROW(LayerNorm<float>(4, 1e-50), ConfigError);
  EXPECT_NO_THROW(LayerNorm<double>(4, 1e-50));
  LabelSmoothedCrossEntropy<float> loss(0.1, 0);
  EXPECT_THROW(
      loss.forward_backward(Tensor<float>({2, 5}), Tensor<TokenId>::from({2}, {1, 2}), 1e300),
      NumericError);
  EXPECT_THROW(scale_gradients<float>(params, 1e300), NumericError);
  EXPECT_NO_THROW(scale_gradients<double>({}, 1e300));
}

// OMP_STACKSIZE=1000000G: libgomp ended the process when it started its threads ("Thread
// creation failed"), past every handler. set_num_threads reads the size as libgomp does and
// refuses stacks this machine cannot give, naming the variable.
TEST(ApiEdges, ThreadStacksBeyondTheMachinesMemoryAreRefused) {
#if !defined(_OPENMP)
  GTEST_SKIP() << "built without OpenMP";
#endif
  const int before = num_threads();
  const auto bytes = [](const char* omp, const char* gomp) {
    omp ? ::setenv("OMP_STACKSIZE", omp, 1) : ::unsetenv("OMP_STACKSIZE");
    gomp ? ::setenv("GOMP_STACKSIZE", gomp, 1) : ::unsetenv("GOMP_STACKSIZE");
    const char* name = nullptr;
    return detail::openmp_stack_bytes(name);
  };
  EXPECT_EQ(bytes("64", nullptr), 64.0 * 1024);  // kilobytes unless a unit says otherwise
  EXPECT_EQ(bytes(" 2 m ", nullptr), 2.0 * 1024 * 1024);
  EXPECT_EQ(bytes("5B", nullptr), 5.0);
  EXPECT_EQ(bytes("1g", nullptr), 1024.0 * 1024 * 1024);
  EXPECT_EQ(bytes("100T", "3M"), 3.0 * 1024 * 1024);  // libgomp skips what it cannot read
  for (const char* junk : {"", "x", "-5", "5 k b", "18446744073709551615G"})
    EXPECT_EQ(bytes(junk, nullptr), 0.0) << junk;
  bytes("1000000G", nullptr);
  const std::string what = error_of<ConfigError>([] { set_num_threads(2); });
  EXPECT_TRUE(contains(what,
                       "OMP_STACKSIZE=1000000G asks for a 1e+06 GiB stack for each of the 1 "
                       "threads OpenMP starts besides this one"))
      << what;
  EXPECT_EQ(num_threads(), before);
  EXPECT_NO_THROW(set_num_threads(1));  // no thread to start
  bytes(nullptr, "1000000G");
  EXPECT_THROW(set_num_threads(2), ConfigError);
  bytes(nullptr, nullptr);
  set_num_threads(before);
}

TEST(ApiEdges, TrainingSideCountsAndSizesAreBounded) {
  // Session 43's audit. set_num_threads handed any count to libgomp: INT_MAX ran it out of memory
  // and 100,000 out of stack, each ending the process; 0 became 1 in silence. The limit is 256, or
  // the CPUs or the starting OMP_NUM_THREADS where more, so num_threads() can be set back.
  const int before = num_threads(), limit = thread_limit();
  EXPECT_GE(limit, kMaxThreads);
  EXPECT_GE(limit, before);
  for (const int n : {0, -1, limit + 1, INT_MAX})
    EXPECT_EQ(error_of<ConfigError>([&] { set_num_threads(n); }),
              "set_num_threads: n must be in [1, " + std::to_string(limit) + "], got " +
                  std::to_string(n));
  EXPECT_EQ(num_threads(), before);
  set_num_threads(before);
  // Adam took a step count near Index's limit and overflowed at the next step.
  Parameter<float> p;
  p.allocate({4});
  Adam<float> adam({{"w", p.value, p.grad}});
  EXPECT_TRUE(contains(error_of<ConfigError>([&] {
                         adam.load_state(adam.state(), std::numeric_limits<Index>::max());
                       }),
                       "Adam::load_state: steps must be in [0, 9007199254740992]"));
  adam.load_state(adam.state(), Adam<float>::kMaxSteps);
  EXPECT_EQ(error_of<ConfigError>([&] { adam.step(0.1); }),
            "Adam: 9007199254740992 steps taken, the most it counts");
  EXPECT_EQ(adam.steps(), Adam<float>::kMaxSteps);
  // A LabelSmoothedCrossEntropy over a vocabulary of 0: Eigen's assertion on an empty matrix
  // (double), or a read past the logits.
  LabelSmoothedCrossEntropy<double> loss(0.1, 0);
  EXPECT_EQ(error_of<ShapeError>([&] {
              loss.forward_backward(Tensor<double>({2, 0}), Tensor<TokenId>({2}), 1.0);
            }),
            "LabelSmoothedCrossEntropy: expected logits [..., V] with V >= 1, got [2, 0]");
}

TEST(ApiEdges, AdamRefusesATensorListedTwiceOrOverlappingViews) {
  // It was updated twice per step. Disjoint views of one buffer are parameters of their own.
  Tensor<float> values({2, 4}), grads({2, 4});
  const Tensor<float> all = values.reshape({8}), all_grads = grads.reshape({8});
  const NamedParameter<float> a{"a", values.slice(0), grads.slice(0)},
      b{"b", values.slice(1), grads.slice(1)}, whole{"whole", all, all_grads};
  EXPECT_NO_THROW(Adam<float>({a, b}));
  EXPECT_EQ(error_of<ConfigError>([&] {
              Adam<float>({a, {"a2", a.value, a.grad}});
            }),
            "Adam: parameters a and a2 share elements");
  EXPECT_EQ(error_of<ConfigError>([&] {
              Adam<float>({b, whole});
            }),
            "Adam: parameters b and whole share elements");
  Transformer<float> model(TransformerConfig::tiny(12));  // tied weights are listed once
  EXPECT_NO_THROW(Adam<float>(model.parameters()));
}

TEST(ApiEdges, AModelItsFileReaderWouldRefuseIsNotBuilt) {
  // Session 53's audit: learned positions of 2^20 + 1 or a vocabulary of 2^24 + 1 were built and
  // saved, then refused by config_from_model_file; a vocabulary or a layer count of 2^40 ended in
  // std::bad_alloc or the OOM killer. The constructor applies the reader's limits (one list of
  // them, ConfigLimits through FieldRule) before it allocates anything.
  const auto small = [] {
    TransformerConfig c = TransformerConfig::tiny(20);
    c.d_model = 2;
    c.heads = 1;
    c.d_ff = 2;
    c.encoder_layers = c.decoder_layers = 1;
    return c;
  };
  struct Case {
    void (*set)(TransformerConfig&);
    std::string message;
  };
  const Case cases[] = {
      {[](TransformerConfig& c) { c.learned_positions = true, c.max_positions = (1 << 20) + 1; },
       "TransformerConfig: max_positions = 1048577 is outside [0, 1048576], the range a model "
       "file may hold"},
      {[](TransformerConfig& c) { c.src_vocab = c.tgt_vocab = (1 << 24) + 1; },
       "TransformerConfig: src_vocab = 16777217 is outside [0, 16777216]"},
      {[](TransformerConfig& c) { c.src_vocab = c.tgt_vocab = Index(1) << 40; },
       "TransformerConfig: src_vocab = 1099511627776 is outside [0, 16777216]"},
      {[](TransformerConfig& c) { c.encoder_layers = Index(1) << 40; },
       "TransformerConfig: encoder_layers = 1099511627776 is outside [0, 1024]"},
      {[](TransformerConfig& c) { c.max_positions = -3; },  // unused without learned positions
       "TransformerConfig: max_positions = -3 is outside [0, 1048576]"}};
  for (const Case& k : cases) {
    TransformerConfig c = small();
    k.set(c);
    EXPECT_NO_THROW(c.validate());  // the limits are the constructor's: see check_config_limits
    const std::string msg = error_of<ConfigError>([&] { Transformer<float> m(c); });
    EXPECT_TRUE(contains(msg, k.message)) << msg;
  }
  TransformerConfig at_limit = small();
  at_limit.learned_positions = true;
  at_limit.max_positions = Index(1) << 20;
  EXPECT_NO_THROW(Transformer<float>{at_limit});
}

class ApiEdgesFiles : public testing::TempDirTest {};

TEST_F(ApiEdgesFiles, SaveSafetensorsRefusesAShapeItsReaderRefuses) {
  // A shape whose element count wrapped (to 0 bytes) was written, and the reader refused it (its
  // rule: the non-zero extents' product must fit, even when a zero extent empties the tensor).
  const std::string file = path("x.safetensors");
  for (const std::vector<Index>& shape : {std::vector<Index>{Index(1) << 62, 4},
                                          std::vector<Index>{Index(1) << 32, Index(1) << 32, 0}})
    EXPECT_TRUE(contains(error_of<ShapeError>([&] {
                           save_safetensors(file, {bytes_entry("x", Dtype::F32, shape, {})});
                         }),
                         "save_safetensors: tensor x of shape"));
  EXPECT_FALSE(std::filesystem::exists(file));
  EXPECT_NO_THROW(save_safetensors(file, {bytes_entry("x", Dtype::F32, {Index(1) << 40, 0}, {})}));
  EXPECT_EQ(load_safetensors(file).info("x").shape, (std::vector<Index>{Index(1) << 40, 0}));
}

TEST_F(ApiEdgesFiles, LoadModelRefusesAParameterThatWasNeverAllocated) {
  // Its empty shape equals a scalar tensor's in the file: the copy wrote 4 bytes through a null
  // pointer.
  const std::string file = path("scalar.safetensors");
  const Tensor<float> scalar = Tensor<float>::full(Shape{}, 1.5f);
  save_safetensors(file, {tensor_entry("w", scalar)});
  Parameter<float> never_allocated;
  EXPECT_EQ(error_of<ConfigError>([&] {
              load_model<float>(file, {{"w", never_allocated.value, never_allocated.grad}});
            }),
            "checkpoint tensor w: the parameter it would be read into has no storage (it was "
            "never allocated)");
  Parameter<float> allocated;
  allocated.allocate(Shape{});
  EXPECT_NO_THROW(load_model<float>(file, {{"w", allocated.value, allocated.grad}}));
  EXPECT_EQ(allocated.value.at({}), 1.5f);
}

}  // namespace
}  // namespace attn
