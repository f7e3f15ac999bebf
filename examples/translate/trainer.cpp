#include "trainer.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>

#include <attn/parallel.hpp>
#include <attn/train/checkpoint.hpp>
#include <attn/train/clip.hpp>
#include <attn/train/schedule.hpp>

#include "distributed.hpp"
#include "svg.hpp"
#include "translator.hpp"

namespace attn::translate {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string fmt_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = static_cast<long>(seconds + 0.5);
  std::ostringstream o;
  if (s >= 3600)
    o << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s / 60) % 60 << "m";
  else if (s >= 60)
    o << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  else
    o << s << "s";
  return o.str();
}

std::string str(double v) {
  std::ostringstream o;
  o.precision(17);
  o << v;
  return o.str();
}

std::string meta_get(const std::map<std::string, std::string>& m, const std::string& key,
                     const std::string& file) {
  auto it = m.find(key);
  ATTN_CHECK(it != m.end(), FormatError, file, " lacks metadata ", key,
             " (not a checkpoint written by attn-translate train?)");
  return it->second;
}

// The options that change what training computes: stored in every checkpoint and restored on
// --resume so that a resumed run continues exactly as the interrupted one would have.
void store_options(const TrainOptions& o, std::map<std::string, std::string>& m) {
  m["train.label_smoothing"] = str(o.label_smoothing);
  m["train.warmup"] = std::to_string(o.warmup);
  m["train.lr_factor"] = str(o.lr_factor);
  m["train.clip_norm"] = str(o.clip_norm);
  m["train.max_tokens"] = std::to_string(o.max_tokens);
  m["train.tokens_per_update"] = std::to_string(o.tokens_per_update);
  m["train.seed"] = std::to_string(o.seed);
  m[kMaxLenKey] = std::to_string(o.max_len);
}

void restore_options(TrainOptions& o, const std::map<std::string, std::string>& m,
                     const std::string& file) {
  auto num = [&](const std::string& key) {
    const std::string v = meta_get(m, key, file);
    try {
      return std::stod(v);
    } catch (const std::exception&) {
      ATTN_CHECK(false, FormatError, file, " metadata ", key, " = '", v, "' is not a number");
    }
    return 0.0;
  };
  o.label_smoothing = num("train.label_smoothing");
  o.warmup = static_cast<Index>(num("train.warmup"));
  o.lr_factor = num("train.lr_factor");
  // Checkpoints from before --clip-norm existed were trained without clipping.
  o.clip_norm = m.count("train.clip_norm") ? num("train.clip_norm") : 0.0;
  o.max_tokens = static_cast<Index>(num("train.max_tokens"));
  o.tokens_per_update = static_cast<Index>(num("train.tokens_per_update"));
  o.seed = std::stoull(meta_get(m, "train.seed", file));
  o.max_len = static_cast<Index>(num(kMaxLenKey));
}

std::string encode_curves(const std::vector<CurvePoint>& curves) {
  std::ostringstream o;
  o.precision(17);  // round-trips a double: a resumed run's curves equal an uninterrupted run's
  for (const auto& c : curves)
    o << c.step << ',' << c.train_loss << ',' << c.valid_loss << ',' << c.valid_bleu << ';';
  return o.str();
}

std::vector<CurvePoint> decode_curves(const std::string& text) {
  std::vector<CurvePoint> out;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ';')) {
    if (item.empty()) continue;
    CurvePoint c;
    char* p = item.data();
    c.step = std::strtoll(p, &p, 10);
    c.train_loss = std::strtod(p + 1, &p);
    c.valid_loss = std::strtod(p + 1, &p);
    c.valid_bleu = std::strtod(p + 1, &p);
    out.push_back(c);
  }
  return out;
}

std::vector<std::string> both_sides(const ParallelCorpus& c) {
  std::vector<std::string> s = c.src;
  s.insert(s.end(), c.tgt.begin(), c.tgt.end());
  return s;
}

SubwordVocab open_vocab(const TrainOptions& o, const CorpusSplit& data, Replicas& replicas) {
  ATTN_CHECK(!o.model_dir.empty(), ConfigError, "train: --model-dir is required");
  ATTN_CHECK(!data.train.empty(), DataError, "train: the training corpus is empty");
  if (o.resume) return SubwordVocab::load(o.model_dir);
  if (replicas.rank() > 0) {  // rank 0 checks the directory and trains the vocabulary
    replicas.barrier();
    return SubwordVocab::load(o.model_dir);
  }
  ATTN_CHECK(list_checkpoints(o.model_dir).empty(), ConfigError, "model directory '", o.model_dir,
             "' already holds checkpoints; pass --resume to continue, or use another directory");
  // A trained model without checkpoints (e.g. after averaging them away) would lose its
  // vocabulary to a fresh one, and its weights with it.
  for (const char* name : {"model.safetensors", "spm.model", "vocab.txt"})
    ATTN_CHECK(!fs::exists(fs::path(o.model_dir) / name), ConfigError, "model directory '",
               o.model_dir, "' already holds a model (", name,
               "); pass --resume to continue, or use another directory");
  fs::create_directories(o.model_dir);
  BpeTrainOptions bpe;
  bpe.vocab_size = o.vocab_size;
  bpe.num_threads = o.threads;
  SubwordVocab vocab = SubwordVocab::train(both_sides(data.train), o.model_dir, bpe);
  replicas.barrier();
  return vocab;
}

}  // namespace

TransformerConfig make_config(const TrainOptions& o, Index vocab) {
  TransformerConfig c;
  if (o.preset == "tiny")
    c = TransformerConfig::tiny(vocab);
  else if (o.preset == "small")
    c = TransformerConfig::small(vocab);
  else if (o.preset == "base")
    c = TransformerConfig::base(vocab);
  else if (o.preset == "big")
    c = TransformerConfig::big(vocab);
  else
    ATTN_CHECK(false, ConfigError, "unknown preset '", o.preset,
               "', expected tiny, small, base or big");
  if (o.d_model > 0) c.d_model = o.d_model;
  if (o.layers > 0) c.encoder_layers = c.decoder_layers = o.layers;
  if (o.heads > 0) c.heads = o.heads;
  if (o.d_ff > 0) c.d_ff = o.d_ff;
  if (o.dropout >= 0) c.dropout = o.dropout;
  c.seed = o.seed;
  c.validate();
  return c;
}

std::vector<TokenizedPair> tokenize_pairs(const SubwordVocab& vocab, const ParallelCorpus& c) {
  std::vector<TokenizedPair> pairs(c.size());
  for (std::size_t i = 0; i < c.size(); ++i) {
    pairs[i].src = vocab.encode(c.src[i]);
    pairs[i].tgt = vocab.encode(c.tgt[i]);
  }
  return pairs;
}

Trainer::Trainer(const TrainOptions& options, CorpusSplit data, std::shared_ptr<Replicas> replicas)
    : opt_(options),
      data_(std::move(data)),
      replicas_(replicas ? std::move(replicas) : std::make_shared<Replicas>()),
      vocab_(open_vocab(opt_, data_, *replicas_)) {
  set_num_threads(opt_.threads);
  std::string resume_path;
  std::map<std::string, std::string> meta;
  if (opt_.resume) {
    vocab_.check_directory(opt_.model_dir);
    const auto ckpts = list_checkpoints(opt_.model_dir);
    ATTN_CHECK(!ckpts.empty(), IOError, "--resume: model directory '", opt_.model_dir,
               "' has no checkpoint_<step>.safetensors");
    resume_path = ckpts.back().second;
    meta = load_safetensors(resume_path).metadata();
    check_vocab_metadata(meta, vocab_, resume_path);
    restore_options(opt_, meta, resume_path);
  }
  ATTN_CHECK(opt_.tokens_per_update >= 0, ConfigError, "--tokens-per-update must be >= 0, got ",
             opt_.tokens_per_update);
  ATTN_CHECK(std::isfinite(opt_.clip_norm) && opt_.clip_norm >= 0, ConfigError,
             "--clip-norm must be finite and >= 0 (0: off), got ", opt_.clip_norm);
  BatchingOptions b;
  b.max_tokens = opt_.max_tokens;
  b.max_len = opt_.max_len;
  b.overlong = OverlongPolicy::kSkip;
  train_batches_ = std::make_unique<Batcher>(tokenize_pairs(vocab_, data_.train), b);
  ATTN_CHECK(train_batches_->size() > 0, DataError, "train: every one of the ", data_.train.size(),
             " training pairs is longer than max_len ", opt_.max_len, " subword tokens");
  if (train_batches_->skipped() > 0 && !opt_.quiet)
    std::cerr << "train: left out " << train_batches_->skipped() << " of " << data_.train.size()
              << " training pairs longer than max_len " << opt_.max_len << " subword tokens\n";
  if (!data_.valid.empty()) {
    valid_batches_ = std::make_unique<Batcher>(tokenize_pairs(vocab_, data_.valid), b);
    std::size_t n = data_.valid.size();
    if (opt_.bleu_sentences > 0) n = std::min<std::size_t>(n, opt_.bleu_sentences);
    for (std::size_t i = 0; i < n; ++i) valid_src_ids_.push_back(vocab_.encode(data_.valid.src[i]));
  }
  const TransformerConfig config =
      opt_.resume ? TransformerConfig::from_metadata(meta) : make_config(opt_, vocab_.size());
  model_ = std::make_unique<Transformer<float>>(config);
  adam_ = std::make_unique<Adam<float>>(model_->parameters());
  loss_ = std::make_unique<LabelSmoothedCrossEntropy<float>>(opt_.label_smoothing, config.pad_id);
  if (opt_.resume) {
    load_training_checkpoint(resume_path, model_->parameters(), *adam_, model_->random_state());
    epoch_ = std::stoull(meta_get(meta, "data.epoch", resume_path));
    batch_index_ = std::stoull(meta_get(meta, "data.batch", resume_path));
    auto it = meta.find("curves");
    if (it != meta.end()) curves_ = decode_curves(it->second);
  }
  replicas_->start(*model_, *train_batches_, metadata(), opt_);
  order_ = train_batches_->epoch_order(opt_.seed, epoch_);
}

Trainer::~Trainer() = default;

Index Trainer::step() const { return adam_->steps(); }

std::size_t Trainer::skipped_pairs() const { return train_batches_->skipped(); }

std::map<std::string, std::string> Trainer::metadata() const {
  std::map<std::string, std::string> m = model_->config().to_metadata();
  const VocabFingerprint fp = vocab_.fingerprint();
  m[kVocabSizeKey] = std::to_string(fp.size);
  m[kVocabHashKey] = std::to_string(fp.hash);
  store_options(opt_, m);
  return m;
}

const Batch& Trainer::next_batch() {
  if (batch_index_ >= order_.size()) {
    ++epoch_;
    batch_index_ = 0;
    order_ = train_batches_->epoch_order(opt_.seed, epoch_);
  }
  return train_batches_->batches()[order_[batch_index_++]];
}

double Trainer::update() {
  const Index step = adam_->steps() + 1;
  model_->train();
  adam_->zero_grad();
  LossStats stats;          // this rank's share
  Index update_tokens = 0;  // every rank's: the whole batches' target tokens
  std::string error;        // this rank's failure, for every rank to stop on (distributed.hpp)
  // Gradients of several batches add up in Parameter::grad; dividing by the token count at the
  // end makes the update the per-token mean over everything seen, as one large batch would.
  do {
    const Batch& whole = next_batch();
    update_tokens += whole.tgt_tokens;
    const Batch& b = replicas_->share(whole);
    if (!error.empty() || b.rows() == 0) continue;
    try {
      const Tensor<float>& logits = model_->forward(b.src, b.tgt_in);
      const LossStats s = loss_->forward_backward(logits, b.tgt_out, 1.0, dlogits_, step);
      check_finite(s, step);
      model_->backward(dlogits_);
      stats += s;
    } catch (const Error& e) {
      if (replicas_->size() == 1) throw;
      error = e.what();
    }
  } while (update_tokens < opt_.tokens_per_update);
  stats = replicas_->finish_update(stats, error, *model_);  // sums gradients over the ranks
  train_tokens_ += stats.tokens;
  scale_gradients(adam_->parameters(), 1.0 / static_cast<double>(stats.tokens));
  // A finite loss can still have a NaN or Inf gradient; Adam would spread it into every weight.
  last_grad_norm_ = grad_norm(adam_->parameters());
  ATTN_CHECK(std::isfinite(last_grad_norm_), NumericError, "step ", step, ": the gradient norm is ",
             last_grad_norm_, " (try a lower --lr-factor, a longer --warmup or --clip-norm)");
  if (opt_.clip_norm > 0) clip_grad_norm(adam_->parameters(), opt_.clip_norm);
  adam_->step(noam_lr(step, model_->config().d_model, opt_.warmup, opt_.lr_factor));
  return stats.mean_loss();
}

BleuOptions Trainer::bleu_options() const {
  BleuOptions o;
  o.tokenize = opt_.tokenize_none ? BleuTokenizer::kNone : BleuTokenizer::k13a;
  return o;
}

Trainer::Validation Trainer::validate() {
  Validation v;
  if (!valid_batches_) return v;
  detail::EvalGuard<float> guard(*model_);
  for (const Batch& b : valid_batches_->batches())
    v.loss += loss_->evaluate(model_->forward(b.src, b.tgt_in), b.tgt_out, step());
  TranslateOptions t;
  t.greedy = true;
  t.batch_size = 64;
  const auto out = translate_ids(*model_, valid_src_ids_, t);
  std::vector<std::string> hyps(out.size()), refs(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    hyps[i] = vocab_.decode(out[i]);
    refs[i] = data_.valid.tgt[i];
  }
  v.bleu = corpus_bleu(hyps, refs, bleu_options());
  return v;
}

BleuScore Trainer::test_bleu(std::vector<std::string>* hyps) {
  if (data_.test.empty()) return {};
  std::vector<std::vector<TokenId>> ids;
  for (const auto& s : data_.test.src) ids.push_back(vocab_.encode(s));
  TranslateOptions t;  // the paper's beam 4, alpha 0.6
  const auto out = translate_ids(*model_, ids, t);
  std::vector<std::string> text(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) text[i] = vocab_.decode(out[i]);
  BleuScore score = corpus_bleu(text, data_.test.tgt, bleu_options());
  if (hyps) *hyps = std::move(text);
  return score;
}

std::string Trainer::save_checkpoint() {
  if (replicas_->rank() != 0) return {};  // one writer; the ranks' states are the same
  auto meta = metadata();
  meta["data.epoch"] = std::to_string(epoch_);
  meta["data.batch"] = std::to_string(batch_index_);
  meta["curves"] = encode_curves(curves_);
  const std::string path =
      (fs::path(opt_.model_dir) / ("checkpoint_" + std::to_string(step()) + ".safetensors"))
          .string();
  save_training_checkpoint(path, model_->parameters(), *adam_, model_->random_state(), meta);
  const auto ckpts = list_checkpoints(opt_.model_dir);
  const std::size_t keep = static_cast<std::size_t>(std::max(opt_.keep, 1));
  for (std::size_t i = 0; i + keep < ckpts.size(); ++i) fs::remove(ckpts[i].second);
  return path;
}

void Trainer::train(Index max_updates) {
  const auto start = Clock::now();
  const Index first = step();
  const bool tty = !opt_.quiet && isatty(fileno(stderr));
  double window_loss = 0;  // sum of per-update mean losses since the last log point
  Index window_steps = 0;
  train_tokens_ = 0;
  auto window_start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  for (;;) {
    if (opt_.steps > 0 && step() >= opt_.steps) break;
    if (max_updates > 0 && step() - first >= max_updates) break;
    // Clocks differ between ranks; rank 0's decides, or one rank would wait for the others.
    if (opt_.minutes > 0 && replicas_->rank0_decides(elapsed() >= opt_.minutes * 60)) break;
    const double loss = update();
    window_loss += loss;
    ++window_steps;
    const Index s = step();
    const bool log_point = opt_.log_every > 0 && s % opt_.log_every == 0;
    if (log_point || tty) {
      const double mean = window_loss / static_cast<double>(window_steps);
      const double secs = elapsed();
      const double per_step = secs / static_cast<double>(s - first);
      double eta = kNaN;
      if (opt_.steps > 0) eta = per_step * static_cast<double>(opt_.steps - s);
      if (opt_.minutes > 0)
        eta =
            std::isfinite(eta) ? std::min(eta, opt_.minutes * 60 - secs) : opt_.minutes * 60 - secs;
      const double lr = noam_lr(s, model_->config().d_model, opt_.warmup, opt_.lr_factor);
      const double tok_s = static_cast<double>(train_tokens_) /
                           std::chrono::duration<double>(Clock::now() - window_start).count();
      if (!opt_.quiet) {
        std::ostringstream line;
        line << "step " << s << " | loss " << std::fixed << std::setprecision(3) << mean
             << " | ppl " << std::setprecision(1) << std::exp(mean) << " | lr " << std::scientific
             << std::setprecision(2) << lr << " | " << std::fixed << std::setprecision(0) << tok_s
             << " tok/s | " << fmt_duration(secs) << " | ETA " << fmt_duration(eta);
        if (tty)
          std::cerr << '\r' << line.str() << "\033[K" << (log_point ? "\n" : "") << std::flush;
        else
          std::cerr << line.str() << '\n';
      }
      if (log_point) {
        curves_.push_back({s, mean, kNaN, kNaN});
        window_loss = 0;
        window_steps = 0;
        train_tokens_ = 0;
        window_start = Clock::now();
      }
    }
    if (opt_.valid_every > 0 && s % opt_.valid_every == 0) run_validation();
    if (opt_.checkpoint_every > 0 && s % opt_.checkpoint_every == 0) save_checkpoint();
  }
  if (tty) std::cerr << '\n';
}

void Trainer::run_validation() {
  if (replicas_->rank() != 0) return;  // the same weights on every rank: rank 0 reports
  const Validation v = validate();
  if (!valid_batches_) return;
  const Index s = step();
  if (!curves_.empty() && curves_.back().step == s) {
    curves_.back().valid_loss = v.loss.mean_loss();
    curves_.back().valid_bleu = v.bleu.score;
  } else {
    curves_.push_back({s, kNaN, v.loss.mean_loss(), v.bleu.score});
  }
  if (!opt_.quiet)
    std::cerr << "valid step " << s << " | loss " << std::fixed << std::setprecision(3)
              << v.loss.mean_loss() << " | ppl " << std::setprecision(2) << v.loss.perplexity()
              << " | " << v.bleu.str() << '\n';
}

void Trainer::finish() {
  if (replicas_->rank() != 0) return;
  const auto ckpts = list_checkpoints(opt_.model_dir);
  const bool validated =
      !curves_.empty() && curves_.back().step == step() && !std::isnan(curves_.back().valid_loss);
  if (!validated && valid_batches_) run_validation();
  if (ckpts.empty() || ckpts.back().first != step()) save_checkpoint();
  const std::string final_path = (fs::path(opt_.model_dir) / "model.safetensors").string();
  const int available = static_cast<int>(list_checkpoints(opt_.model_dir).size());
  if (opt_.average > 1 && available > 1) {
    const int n = std::min(opt_.average, available);
    if (n < opt_.average && !opt_.quiet)
      std::cerr << "averaging the " << n << " checkpoints on disk (asked for " << opt_.average
                << "; --keep is " << opt_.keep << ")\n";
    average_last(opt_.model_dir, n);
  } else {
    save_model(final_path, *model_, metadata());
  }
  if (opt_.svg) {
    write_curves();
    write_attention();
  }
}

void Trainer::write_curves() const {
  PlotSeries train{"train loss", {}, {}, false}, valid{"valid loss", {}, {}, false},
      bleu{"valid BLEU", {}, {}, true};
  for (const auto& c : curves_) {
    if (std::isfinite(c.train_loss)) {
      train.x.push_back(static_cast<double>(c.step));
      train.y.push_back(c.train_loss);
    }
    if (std::isfinite(c.valid_loss)) {
      valid.x.push_back(static_cast<double>(c.step));
      valid.y.push_back(c.valid_loss);
      bleu.x.push_back(static_cast<double>(c.step));
      bleu.y.push_back(c.valid_bleu);
    }
  }
  LinePlotOptions o;
  o.title = "attn-translate: loss and BLEU";
  write_svg((fs::path(opt_.model_dir) / "curves.svg").string(),
            line_plot_svg({train, valid, bleu}, o));
}

void Trainer::write_attention() {
  if (valid_src_ids_.empty() || valid_src_ids_[0].empty()) return;
  detail::EvalGuard<float> guard(*model_);
  TranslateOptions t;
  t.greedy = true;
  const std::vector<TokenId>& src_ids = valid_src_ids_[0];
  const std::vector<TokenId> hyp = translate_ids(*model_, {src_ids}, t)[0];
  std::vector<TokenId> tgt_ids{SubwordVocab::kBos};
  tgt_ids.insert(tgt_ids.end(), hyp.begin(), hyp.end());
  Tensor<TokenId> src({1, static_cast<Index>(src_ids.size())}),
      tgt({1, static_cast<Index>(tgt_ids.size())});
  for (std::size_t i = 0; i < src_ids.size(); ++i) src(0, static_cast<Index>(i)) = src_ids[i];
  for (std::size_t i = 0; i < tgt_ids.size(); ++i) tgt(0, static_cast<Index>(i)) = tgt_ids[i];
  model_->encoder.keep_attention_weights(true);
  model_->decoder.keep_attention_weights(true);
  model_->forward(src, tgt);
  std::vector<AttentionPanel> panels;
  for (std::size_t l = 0; l < model_->decoder.layers.size(); ++l) {
    const Tensor<float>& w = model_->decoder.layers[l]->multihead_attn.attention_weights();
    auto p = attention_panels(w.slice(0), "layer " + std::to_string(l + 1) + ", ");
    panels.insert(panels.end(), p.begin(), p.end());
  }
  model_->encoder.keep_attention_weights(false);
  model_->decoder.keep_attention_weights(false);
  AttentionPlotOptions o;
  o.title = "encoder-decoder attention: " + data_.valid.src[0];
  o.columns = static_cast<int>(model_->config().heads);
  write_svg((fs::path(opt_.model_dir) / "attention.svg").string(),
            attention_svg(vocab_.pieces(src_ids), vocab_.pieces(tgt_ids), panels, o));
}

}  // namespace attn::translate
