// How a Trainer starts: afresh (a new model directory, its vocabulary trained on the training
// data, the model built from a preset and its overrides) or with --resume from the newest
// checkpoint that loads. The loop, evaluation and checkpoints are in trainer.cpp.
#include "trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>

#include <attn/parallel.hpp>
#include <attn/strict_number.hpp>
#include <attn/train/atomic_file.hpp>
#include <attn/train/checkpoint.hpp>
#include <attn/train/model_file.hpp>

#include "batch_memory.hpp"
#include "distributed.hpp"
#include "model_metadata.hpp"
#include "train_state.hpp"

namespace attn::translate {

namespace fs = std::filesystem;

namespace {

// The step of an injected fault (InjectedFaults): 0, the default, when `variable` is unset.
Index injected_fault_step(const char* variable) {
  const char* v = std::getenv(variable);
  return v ? parse_number_or_throw<Index>(v, "environment", variable) : 0;
}

std::vector<std::string> both_sides(const ParallelCorpus& c) {
  std::vector<std::string> s = c.src;
  s.insert(s.end(), c.tgt.begin(), c.tgt.end());
  return s;
}

// The sources BLEU translates (validation, test) are encoded whole, unlike training pairs that
// can be left out: a line too long in bytes to encode (bpe.hpp) is refused before anything is
// trained, not met when the test set is translated at the end. Lines longer than max_len tokens
// are translated, the positions extended. The validation sources are encoded under --no-eval too
// (attention.svg draws one of them), and were then encoded whatever their length.
void check_bleu_sources(const TrainOptions& o, const CorpusSplit& data) {
  for (const auto& [set, lines] :
       {std::pair{"validation", &data.valid.src}, std::pair{"test", &data.test.src}}) {
    if (!o.evaluate && lines == &data.test.src) continue;  // never read
    for (std::size_t i = 0; i < lines->size(); ++i)
      ATTN_CHECK(!too_long_to_encode((*lines)[i], o.max_len), DataError, "the ", set,
                 " set's source line ", i + 1, " has ", (*lines)[i].size(),
                 " bytes, more than the ", kMaxBytesPerToken, " per subword token of --max-len ",
                 o.max_len);
  }
}

SubwordVocab open_vocab(const TrainOptions& o, const CorpusSplit& data, Replicas& replicas) {
  ATTN_CHECK(!data.train.empty(), DataError, "train: the training corpus is empty");
  check_bleu_sources(o, data);
  if (o.resume) return SubwordVocab::load(o.model_dir);
  if (replicas.rank() > 0) {  // rank 0 checks the directory and trains the vocabulary
    replicas.barrier();
    return SubwordVocab::load(o.model_dir);
  }
  check_fresh_model_dir(o.model_dir);
  fs::create_directories(o.model_dir);
  BpeTrainOptions bpe;
  bpe.vocab_size = o.vocab_size;
  bpe.num_threads = o.threads;  // SubwordVocab::train takes at most kMaxBpeThreads
  SubwordVocab vocab = SubwordVocab::train(both_sides(data.train), o.model_dir, bpe);
  replicas.barrier();
  return vocab;
}

std::unique_ptr<ModelDirLock> lock_model_dir(const TrainOptions& o) {
  auto lock = std::make_unique<ModelDirLock>(o.model_dir);
  // Holding the lock and before this process writes there: every name's leftovers of dead
  // writers (each atomic write also removes its own file's).
  for (const std::string& path : remove_stale_temporaries(o.model_dir))
    if (!o.quiet) std::cerr << "train: removed " << path << ", left by a killed writer\n";
  return lock;
}

// The options, once validate() accepted them: the Trainer's first member is initialised with them,
// so nothing is locked, read or written for options that are refused.
const TrainOptions& checked(const TrainOptions& o) {
  o.validate();
  return o;
}

}  // namespace

InjectedFaults InjectedFaults::from_environment() {
  InjectedFaults f;
  f.loss_step = injected_fault_step("ATTN_TRANSLATE_FAULT_STEP");
  f.grad_step = injected_fault_step("ATTN_TRANSLATE_FAULT_GRAD_STEP");
  f.unreadable_step = injected_fault_step("ATTN_TRANSLATE_FAULT_UNREADABLE_STEP");
  return f;
}

Trainer::Trainer(const TrainOptions& options, CorpusSplit data, std::shared_ptr<Replicas> replicas)
    : opt_(checked(options)),
      data_(std::move(data)),
      replicas_(replicas ? std::move(replicas) : std::make_shared<Replicas>()),
      lock_(replicas_->rank() == 0 ? lock_model_dir(opt_) : nullptr),
      vocab_(open_vocab(opt_, data_, *replicas_)),
      progress_(std::cerr, !opt_.quiet && ProgressLine::stderr_is_terminal()),
      faults_(InjectedFaults::from_environment()) {
  set_num_threads(opt_.threads);
  if (opt_.resume) {
    resume_newest_loadable(options);
    // After the checkpoint's --cooldown is restored, not while trying checkpoints: the flag,
    // not the checkpoint, is wrong.
    ATTN_CHECK(opt_.cooldown == 0 || opt_.steps <= opt_.cooldown_end, ConfigError, "--steps ",
               opt_.steps, " goes past step ", opt_.cooldown_end, ", where this run's --cooldown ",
               opt_.cooldown, " ends its learning rate at zero");
  } else {
    opt_.cooldown_end = opt_.cooldown > 0 ? opt_.steps : 0;
    build(make_config(opt_, vocab_.size()));
    stream_->start_epoch(0);
  }
  // Here, not in build(): on --resume, after the checkpoint's data fingerprint was matched, so
  // that other data is named as such, not as a checkpoint that does not load.
  const Index epoch_tokens = stream_->epoch_tokens();
  ATTN_CHECK(opt_.tokens_per_update <= epoch_tokens, ConfigError,
             opt_.resume ? resumed_from_ +
                               ": metadata train.tokens_per_update (its run's "
                               "--tokens-per-update) "
                         : std::string("--tokens-per-update "),
             opt_.tokens_per_update, " is more than the ", epoch_tokens,
             " target tokens of all the training data: an update may take at most one epoch");
  first_step_ = step() + 1;
  double model_bytes = 0;  // weights, gradients and Adam's two moments
  for (const auto& p : model_->parameters())
    model_bytes += 16.0 * static_cast<double>(p.value.numel());
  check_batch_memory(model_->config(), stream_->whole_batches().batches(), replicas_->size(),
                     model_bytes, opt_.max_tokens, opt_.resume);
  replicas_->start(*model_, stream_->batches_fingerprint(), metadata(),
                   [this] { return state_fingerprint(); });
  if (opt_.resume) set_aside_skipped_checkpoints();
}

void Trainer::resume_newest_loadable(const TrainOptions& given) {
  vocab_.check_directory(opt_.model_dir);
  const auto ckpts = list_checkpoints(opt_.model_dir);
  ATTN_CHECK(!ckpts.empty(), IOError, "--resume: model directory '", opt_.model_dir,
             "' has no checkpoint_<step>.safetensors (train without --resume to start afresh)");
  // A checkpoint that does not load (corrupt, truncated, tampered) is skipped for the next older
  // one; each attempt starts from the given options and builds everything anew.
  const auto reasons = [this] {
    std::string joined;
    for (const std::string& s : skipped_checkpoints()) joined += (joined.empty() ? "" : "; ") + s;
    return joined;
  };
  for (auto it = ckpts.rbegin(); it != ckpts.rend(); ++it) {
    try {
      opt_ = given;
      // (0: no fault; checkpoint_0, the untrained weights a signal can save, stays readable)
      ATTN_CHECK(faults_.unreadable_step == 0 || it->first != faults_.unreadable_step, IOError,
                 it->second, ": cannot read it (made so by ATTN_TRANSLATE_FAULT_UNREADABLE_STEP)");
      resume_from(it->second);
    } catch (const OtherDataError&) {
      throw;  // the given data, not the checkpoint: an older one would not match either
    } catch (const Error& e) {
      skipped_.push_back({it->second, e.what()});
      continue;
    }
    resumed_from_ = it->second;
    if (!skipped_.empty() && !opt_.quiet)
      std::cerr << "resume: skipped " << reasons() << "; resuming from " << it->second << '\n';
    return;
  }
  throw FormatError(
      detail::concat("--resume: no checkpoint of '", opt_.model_dir, "' loads: ", reasons()));
}

// Besides the weights, all a resumed checkpoint restores that changes what training computes.
std::uint64_t Trainer::state_fingerprint() const {
  const DataPosition at = stream_->position();
  const RandomState& random = model_->random_state();
  const std::uint64_t counts[] = {static_cast<std::uint64_t>(adam_->steps()), at.epoch,
                                  static_cast<std::uint64_t>(at.batch), random.seed,
                                  random.counter};
  std::uint64_t h = fnv1a(kFnv1aOffset, counts, sizeof counts);
  for (const auto& moment : adam_->state())
    h = fnv1a(h, moment.value.data(),
              static_cast<std::size_t>(moment.value.numel()) * sizeof(float));
  return h;
}

// Left in place, the skipped checkpoints would stay the newest, and pruning would remove the ones
// that load. Only after start(), where the ranks agreed on the weights: a checkpoint that one rank
// alone could not read (its file system, not the file) is not set aside for the others. Outside
// resume_newest_loadable's retries: a rename that fails (a read-only directory) is its own error,
// not a reason to skip the checkpoint that loaded.
void Trainer::set_aside_skipped_checkpoints() {
  if (skipped_.empty() || replicas_->rank() != 0) return;
  std::string aside;
  for (const SkippedCheckpoint& s : skipped_)
    aside += (aside.empty() ? "" : ", ") + set_aside_checkpoint(s.path);
  if (!opt_.quiet) std::cerr << "resume: set aside as " << aside << '\n';
}

std::vector<std::string> Trainer::skipped_checkpoints() const {
  std::vector<std::string> out;
  for (const SkippedCheckpoint& s : skipped_) out.push_back(s.path + " (" + s.why + ")");
  return out;
}

void Trainer::resume_from(const std::string& path) {
  // The header alone: load_training_checkpoint reads the tensors once the metadata passed.
  const SafetensorsFile file = read_safetensors_header(path);
  const auto& meta = file.metadata();
  const TransformerConfig config = model_config(file, vocab_);
  restore_options(opt_, meta, path);
  build(config);
  // Everything the metadata holds is checked before the weights are loaded.
  check_data_fingerprint(meta, path, stream_->data_fingerprint());
  // The checkpoint's epoch is started here, so that data.batch is checked against its batches.
  const DataPosition position = restore_data_position(
      meta, path, [this](std::uint64_t e) { return stream_->start_epoch(e); });
  curves_ = restore_curves(meta, path);
  const LogWindowState log_window =
      restore_log_window(meta, path, static_cast<Index>(detail::kMaxCheckpointSteps));
  load_training_checkpoint(path, model_->parameters(), *adam_, model_->random_state(),
                           /*max_extra_bytes=*/0);  // the trainer writes none
  check_finite_parameters(model_->parameters(), path);
  // Each within its range (restore_options), but also the one schedule a run could have saved.
  ATTN_CHECK(opt_.cooldown == 0 ? opt_.cooldown_end == 0
                                : opt_.cooldown <= opt_.cooldown_end && step() <= opt_.cooldown_end,
             FormatError, path, ": metadata train.cooldown ", opt_.cooldown,
             " and train.cooldown_end ", opt_.cooldown_end, " at step ", step(),
             " are not a schedule a run saves");
  stream_->seek(position);
  log_window_.restore(log_window);
  resume_step_ = is_resume_point(meta) ? step() : -1;
}

BatchingOptions Trainer::batching_options() const {
  BatchingOptions b;
  b.max_tokens = opt_.max_tokens;
  b.max_len = opt_.max_len;
  b.overlong = OverlongPolicy::kSkip;
  b.pad_id = SubwordVocab::kPad;
  b.bos_id = SubwordVocab::kBos;
  b.eos_id = SubwordVocab::kEos;
  return b;
}

void Trainer::build(const TransformerConfig& config) {
  // opt_ is within its ranges: validate() checked the given options, restore_options a
  // checkpoint's.
  const BatchingOptions b = batching_options();
  stream_ = std::make_unique<EpochStream>(vocab_, data_.train, b, opt_.bpe_dropout, opt_.seed);
  if (skipped_pairs() > 0 && !opt_.quiet)
    std::cerr << "train: left out " << skipped_pairs() << " of " << data_.train.size()
              << " training pairs longer than max_len " << opt_.max_len << " subword tokens\n";
  valid_batches_.reset();
  valid_src_ids_.clear();
  if (!data_.valid.empty()) {
    valid_batches_ = std::make_unique<Batcher>(tokenize_pairs(vocab_, data_.valid, b.max_len), b);
    std::size_t n = data_.valid.size();
    if (opt_.bleu_sentences > 0) n = std::min<std::size_t>(n, opt_.bleu_sentences);
    for (std::size_t i = 0; i < n; ++i) valid_src_ids_.push_back(vocab_.encode(data_.valid.src[i]));
  }
  model_ = std::make_unique<Transformer<float>>(config);
  adam_ = std::make_unique<Adam<float>>(model_->parameters());
  loss_ = std::make_unique<LabelSmoothedCrossEntropy<float>>(opt_.label_smoothing, config.pad_id);
}

Trainer::~Trainer() = default;

}  // namespace attn::translate
