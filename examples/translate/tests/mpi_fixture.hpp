// The fixture of the `mpirun -np N attn-translate train` tests (test_mpi.cpp,
// test_mpi_agreement.cpp): a synthetic corpus in a temporary directory, the flags of a small
// quick run, and runners for one process, N ranks and MPMD lines. ATTN_MPIEXEC is
// "mpiexec --oversubscribe --allow-run-as-root ...".
#pragma once

#include <string>

#include "corpus_io.hpp"
#include "translate_fixture.hpp"

namespace attn::translate::testing {

class Mpi : public TempDirTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(TempDirTest::SetUp());
    const tr::CorpusSplit d = split();
    tr::write_lines(path("train.en"), d.train.src);
    tr::write_lines(path("train.de"), d.train.tgt);
  }
  /// Flags shared by every run: the tiny preset on the synthetic corpus, several batches of
  /// several rows per update (so both sharing and accumulation are exercised), 1 thread a rank
  /// unless `threads` says otherwise ("": the default).
  std::string common(double dropout, const std::string& threads = "--threads 1") const {
    return threads + " --src " + path("train.en") + " --tgt " + path("train.de") +
           " --preset tiny --dropout " + std::to_string(dropout) +
           " --vocab-size 60 --max-tokens 128 --tokens-per-update 300 --max-len 32 --warmup 20"
           " --valid-every 0 --checkpoint-every 0 --svg 0 --log-every 1";
  }
  CliResult run(const std::string& args) const { return run_cli(args, dir_); }
  /// `mpiexec <launch>`: "-n 2 BIN args" or an MPMD line "-n 1 BIN a : -n 1 BIN b".
  /// With `seconds` > 0, a job still running then is ended (SIGTERM, which mpirun passes on to
  /// the ranks, then SIGKILL), so that a hang fails the test instead of outlasting it.
  CliResult mpirun(const std::string& launch, int seconds = 0) const {
    const std::string limit =
        seconds > 0 ? "timeout -k 5 " + std::to_string(seconds) + " " : std::string();
    return run_command(limit + std::string(ATTN_MPIEXEC) + " " + launch, dir_);
  }
  CliResult ranks(int n, const std::string& args) const {
    return mpirun("-n " + std::to_string(n) + " " + std::string(ATTN_TRANSLATE_BIN) + " " + args);
  }
  /// `train --model-dir <model_dir> --steps <steps> <flags> common(dropout)` on n ranks, or as one
  /// process without mpiexec when n is 0; a failure of the test unless it exits 0.
  CliResult train(int n, const std::string& model_dir, int steps, const std::string& flags,
                  double dropout) const {
    const std::string args = "train --model-dir " + model_dir + " --steps " +
                             std::to_string(steps) + " " + flags + " " + common(dropout);
    CliResult r = n == 0 ? run(args) : ranks(n, args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    return r;
  }
  /// n ranks summing the gradients during backward (the default) and after it
  /// (--no-overlap-allreduce) write the same bytes. Dropout on, and several batches per update
  /// (--tokens-per-update 300, --max-tokens 128): only the last backward pass of each sums.
  void expect_overlap_changes_no_bit(int n) const;
};

// The checkpoint of `step` and the final model of two model directories are the same bytes.
inline void expect_same_checkpoints(const std::string& a, const std::string& b, int step) {
  expect_same_files(a, b,
                    {"checkpoint_" + std::to_string(step) + ".safetensors", "model.safetensors"});
}

inline void Mpi::expect_overlap_changes_no_bit(int n) const {
  const std::string during = path("during"), after = path("after");
  if (train(n, during, 3, "", 0.1).exit_code != 0) return;
  if (train(n, after, 3, "--no-overlap-allreduce", 0.1).exit_code != 0) return;
  expect_same_checkpoints(during, after, 3);
}

}  // namespace attn::translate::testing
