// Corpus BLEU exactly as sacreBLEU 2.x computes it by default (BLEU(), corpus_score with one
// reference): 4-gram precisions with clipped counts, uniform weights, brevity penalty
// exp(1 - r / c) when c < r with r and c the total reference and hypothesis lengths, 'exp'
// smoothing (mteval-v13a's: the k-th order without a match gets precision 100 / (2^k * total)),
// score 0 when no n-gram of any order matches, and the '13a' tokenizer.
//
// The score string is sacreBLEU's: "BLEU = 34.28 65.2/41.7/28.6/20.0 (BP = 1.000 ratio = 1.000
// hyp_len = 12 ref_len = 12)".
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace attn::translate {

enum class BleuTokenizer {
  k13a,   ///< mteval-v13a, sacreBLEU's default
  kNone,  ///< split on whitespace only (for already tokenised text)
};

enum class BleuSmoothing {
  kExp,    ///< sacreBLEU's default
  kNone,   ///< a zero precision makes the score 0
  kFloor,  ///< zero counts become smooth_value (default 0.1)
  kAddK,   ///< add smooth_value (default 1) to counts and totals of orders >= 2
};

struct BleuOptions {
  BleuTokenizer tokenize = BleuTokenizer::k13a;
  bool lowercase = false;
  BleuSmoothing smooth = BleuSmoothing::kExp;
  double smooth_value = -1;  ///< < 0: sacreBLEU's default for the method
};

struct BleuScore {
  static constexpr int kOrder = 4;
  double score = 0;                         ///< 0..100
  std::array<double, kOrder> precisions{};  ///< percent, after smoothing
  std::array<double, kOrder> counts{};      ///< matched n-grams (after add-k)
  std::array<double, kOrder> totals{};      ///< hypothesis n-grams (after add-k)
  double bp = 0;
  double ratio = 0;  ///< hyp_len / ref_len, 0 when ref_len is 0
  std::int64_t hyp_len = 0;
  std::int64_t ref_len = 0;

  /// sacreBLEU's line: "BLEU = 34.28 65.2/41.7/28.6/20.0 (BP = ... ref_len = 12)".
  std::string str() const;
};

/// The mteval-v13a tokenisation, as sacreBLEU's Tokenizer13a: removes "<skipped>" and "-\n",
/// turns '\n' into a space, unescapes &quot; &amp; &lt; &gt;, splits off the ASCII punctuation
/// and symbols except ' - . , ; splits '.' and ',' off a preceding non-digit (first pass) and off
/// a following non-digit (second pass), so "3.50" and "2,000" stay whole; splits '-' after a
/// digit; and joins the tokens with single spaces. Each pass scans left to right without
/// overlapping matches, as Python's re.sub does.
std::string tokenize_13a(std::string_view line);

/// Python's str.lower() on ASCII, Latin-1, Latin Extended-A (except U+0130), Greek, Cyrillic
/// and U+1E9E; other characters are left as they are.
std::string lowercase_utf8(std::string_view text);

/// Python's str.split(): tokens separated by runs of Unicode whitespace.
std::vector<std::string> split_whitespace(std::string_view text);

/// Corpus BLEU of hyps[i] against refs[i]. Throws DataError if the counts differ. Memory and
/// time grow linearly with the longest sentence pair (n-grams are counted as integer ids, not
/// strings), so one pathological line costs a few times its size.
BleuScore corpus_bleu(const std::vector<std::string>& hyps, const std::vector<std::string>& refs,
                      const BleuOptions& options = {});

}  // namespace attn::translate
