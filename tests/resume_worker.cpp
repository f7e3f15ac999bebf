// A fresh process for test_training_recovery's resume test: loads a training checkpoint, takes
// `steps` more updates on the task's data stream (batch k for update k + 1, as the test's
// uninterrupted run) and saves the final parameters. Nothing is shared with the process that wrote
// the checkpoint but the file, so a bitwise match proves the checkpoint holds the whole training
// state.
//
//   resume_worker <checkpoint in> <model out> <steps> <vocab> <dropout> <stream seed> <batch>
#include <attn/train/checkpoint.hpp>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "training_task.hpp"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr,
                 "usage: %s <checkpoint in> <model out> <steps> <vocab> <dropout> <stream seed> "
                 "<batch>\n",
                 argv[0]);
    return 2;
  }
  try {
    using namespace attn;
    const Index steps = std::atol(argv[3]), vocab = std::atol(argv[4]);
    const double dropout = std::atof(argv[5]);
    const std::uint64_t seed = std::strtoull(argv[6], nullptr, 10);
    const Index B = std::atol(argv[7]);
    // A different initialisation seed: everything must come from the checkpoint.
    TransformerConfig c = testing::task_config(vocab, dropout);
    c.seed = 12345;
    testing::Trainer<float> t(c);
    load_training_checkpoint(argv[1], t.model.parameters(), t.adam, t.model.random_state());
    for (Index i = 0; i < steps; ++i)
      t.train_step(testing::stream_batch(seed, t.adam.steps(), B, vocab));
    save_model(argv[2], t.model);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resume_worker: %s\n", e.what());
    return 1;
  }
}
