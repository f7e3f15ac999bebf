// A model directory of attn-translate, and the trainer's policy for it.
//
// Files: spm.model + vocab.txt (the shared subword vocabulary), training checkpoints
// checkpoint_<step>.safetensors, and model.safetensors (the final or averaged weights). Every
// weight file carries the model's configuration in its metadata, so a directory describes itself.
//
// Policy: a trainer starts only in a directory without weights (or continues one with --resume),
// keeps the newest --keep checkpoints, and holds an advisory lock while it writes, so that a
// second trainer on the same directory is refused (each would prune the other's checkpoints), and
// so is `select` (model_select.hpp), which holds it while it scores the checkpoints. Temporary
// files that killed writers left behind are removed when a trainer takes the lock.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace attn::translate {

/// dir/model.safetensors.
std::string final_model_path(const std::string& dir);
/// dir/checkpoint_<step>.safetensors.
std::string checkpoint_path(const std::string& dir, std::int64_t step);

/// checkpoint_<step>.safetensors files of `dir`, sorted by step (oldest first). Files whose step
/// is not a non-negative decimal int64 are not checkpoints of this program and are ignored.
std::vector<std::pair<std::int64_t, std::string>> list_checkpoints(const std::string& dir);

/// The file a translator loads: model.safetensors if there is an entry of that name (a dangling
/// link included: its reader then says what is wrong), else the newest checkpoint.
/// Throws IOError naming the directory if it has neither.
std::string model_file(const std::string& dir);

/// ConfigError naming `dir` if it holds checkpoints or a model.safetensors: training afresh would
/// replace their vocabulary, and so lose them. A vocabulary without weights (a run killed before
/// its first checkpoint) is nothing to lose, and passes.
void check_fresh_model_dir(const std::string& dir);

/// Removes all but the newest max(keep, 1) checkpoints of `dir`, not counting the one of step
/// `resume_step` (written when a signal stopped the run, there to resume from; -1: none): it never
/// takes the place of one the run saves on schedule, so that a resumed run keeps, and averages,
/// the checkpoints an uninterrupted one would have.
void prune_checkpoints(const std::string& dir, int keep, std::int64_t resume_step = -1);

/// Renames a checkpoint that does not load to `<path>.unloadable` and returns the new name, so
/// that it no longer counts as a checkpoint: pruning would otherwise keep it as the newest and
/// remove the ones that load, and averaging would read it. IOError if the rename fails.
std::string set_aside_checkpoint(const std::string& path);

/// An exclusive flock(2) on the directory `dir` (created if missing), held for the object's
/// lifetime and released by the kernel if the process dies. ConfigError naming the directory if
/// another process holds it.
class ModelDirLock {
 public:
  explicit ModelDirLock(const std::string& dir);
  ~ModelDirLock();
  ModelDirLock(const ModelDirLock&) = delete;
  ModelDirLock& operator=(const ModelDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace attn::translate
