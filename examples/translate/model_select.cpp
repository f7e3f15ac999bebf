#include "model_select.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <attn/error.hpp>
#include <attn/train/atomic_file.hpp>

#include "model_average.hpp"
#include "model_dir.hpp"
#include "model_metadata.hpp"

namespace attn::translate {

namespace {

/// `v` sorted, without repeats.
template <class T>
std::vector<T> sorted_set(std::vector<T> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

void check_select_options(const SelectOptions& o) {
  ATTN_CHECK(!o.lasts.empty(), ConfigError, "select: expected at least one --last, got none");
  ATTN_CHECK(!o.alphas.empty(), ConfigError, "select: expected at least one --alpha, got none");
  for (const int n : o.lasts)
    ATTN_CHECK(n >= 1, ConfigError, "select: --last must be >= 1, got ", n);
  for (const double a : o.alphas)
    ATTN_CHECK(std::isfinite(a) && a >= 0, ConfigError,
               "select: --alpha must be finite and >= 0, got ", a);
}

/// IOError unless the directory that `file` is to be written into exists and is writable.
void check_writable_directory(const std::string& file) {
  std::string dir = std::filesystem::path(file).parent_path().string();
  if (dir.empty()) dir = ".";
  ATTN_CHECK(::access(dir.c_str(), W_OK) == 0, IOError, "select: cannot write '", file,
             "': its directory '", dir, "': ", std::strerror(errno));
}

/// `alphas` sorted, without repeats, -0 as 0 (so that it is written and stored as "0").
std::vector<double> alpha_set(std::vector<double> alphas) {
  for (double& a : alphas) a = a == 0 ? 0.0 : a;
  return sorted_set(std::move(alphas));
}

}  // namespace

std::string alpha_text(double alpha) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, alpha);
  ATTN_CHECK(r.ec == std::errc(), ConfigError, "select: cannot write the length penalty ", alpha);
  return std::string(buf, r.ptr);
}

Selection select_average(const std::string& dir, const ParallelCorpus& valid,
                         const SelectOptions& options, const std::string& output,
                         const std::string& valid_name,
                         const std::function<void(const SelectScore&)>& on_score) {
  check_select_options(options);
  std::error_code ec;
  ATTN_CHECK(std::filesystem::is_directory(dir, ec), ConfigError, "select: '", dir,
             "' is not a model directory");  // checked before the lock would create it
  const std::string target = output.empty() ? final_model_path(dir) : output;
  check_writable_directory(target);
  attn::detail::check_replaceable(target);  // not a directory, a FIFO or a link
  const ModelDirLock lock(dir);  // no trainer prunes the checkpoints while they are scored
  Selection s;
  const auto ckpts = list_checkpoints(dir);
  s.checkpoints = ckpts.size();
  std::vector<int> lasts;
  for (const int n : sorted_set(options.lasts))
    (static_cast<std::size_t>(n) <= ckpts.size() ? lasts : s.skipped).push_back(n);
  ATTN_CHECK(!lasts.empty(), ConfigError, "select: '", dir, "' has ", ckpts.size(),
             " checkpoints, fewer than the smallest --last, ", s.skipped.front());
  // The widest window holds every checkpoint scored: averaged once before any decoding, it refuses
  // a checkpoint of another model, or a non-finite average, now rather than after the others.
  Translator translator(dir, ckpts.back().second);
  translator.load_average(last_checkpoints(ckpts, lasts.back(), dir));
  for (const int n : lasts) {
    translator.load_average(last_checkpoints(ckpts, n, dir));
    for (const double alpha : alpha_set(options.alphas)) {
      TranslateOptions decode = options.decode;
      decode.alpha = alpha;
      decode.alpha_given = true;
      SelectScore score{
          n, ckpts[ckpts.size() - static_cast<std::size_t>(n)].first, ckpts.back().first, alpha,
          translator.evaluate(valid.src, valid.tgt, decode, options.bleu, nullptr, valid_name)};
      if (!s.scores.empty() && score.bleu.score > s.scores[s.best].bleu.score)
        s.best = s.scores.size();
      s.scores.push_back(score);
      if (on_score) on_score(score);
    }
  }
  const SelectScore& best = s.scores[s.best];
  average_files(last_checkpoints(ckpts, best.last, dir), target,
                {{kAlphaKey, alpha_text(best.alpha)}});
  return s;
}

}  // namespace attn::translate
