// The bookkeeping of beam search (section 6.1), apart from the model: W hypotheses for each of B
// sentences, row b*W + w holding beam w of sentence b (W = DecodeOptions::beam_size).
//
// One step, given the next-token logits of every live row:
//   expand  scores every (beam, token) continuation of a sentence by its total log-probability
//           (the padding token by -inf: it is never output, detail::may_output);
//   prune   takes the best 2W, finishes those ending in EOS that rank within the first W (score
//           log P / lp(|Y|), |Y| counting EOS, lp GNMT's length penalty) and keeps the best W
//           others as the next beams; at the sentence's length limit the kept beams are finished
//           as they stand. A sentence is done when it has W finished hypotheses, reaches its limit
//           or has nothing left to continue.
//   finish  returns each sentence's best finished hypothesis.
// With W = 1 this is exactly greedy decoding. Ties go to the lower (beam, token) index.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "attn/decode/options.hpp"
#include "attn/tensor.hpp"

namespace attn {

/// GNMT's length penalty ((5 + length) / 6)^alpha.
inline double gnmt_length_penalty(Index length, double alpha) {
  return std::pow((5.0 + static_cast<double>(length)) / 6.0, alpha);
}

class BeamState {
 public:
  /// limits[b]: the most tokens sentence b may output (its source length + max_extra_length);
  /// pad_id: the model's padding id, which is never output.
  BeamState(std::vector<Index> limits, const DecodeOptions& opts, Index vocab, TokenId pad_id)
      : opts_(validated(opts, vocab, pad_id)),
        pad_(pad_id),
        B_(static_cast<Index>(limits.size())),
        W_(opts.beam_size),
        V_(vocab),
        limits_(std::move(limits)),
        hyps_(rows_u()),
        next_hyps_(rows_u()),
        scores_(rows_u(), kNegInf),
        next_scores_(rows_u(), kNegInf),
        origin_(rows_u()),
        cand_(static_cast<std::size_t>(W_ * V_)),
        cand_score_(static_cast<std::size_t>(W_ * V_)),
        finished_(static_cast<std::size_t>(B_)),
        done_(static_cast<std::size_t>(B_), false) {
    for (Index b = 0; b < B_; ++b) {
      const Index limit = limits_[static_cast<std::size_t>(b)];
      ATTN_CHECK(limit >= 0, ConfigError, "BeamState: the output limit of sentence ", b,
                 " must be >= 0, got ", limit);
      scores_[static_cast<std::size_t>(b * W_)] = 0.0;  // one live beam
      done_[static_cast<std::size_t>(b)] = limit == 0;  // nothing to decode: no token at all
    }
  }

  Index rows() const { return B_ * W_; }

  /// One step at output position t. logits [B * live, V] (rows contiguous, stride V): row
  /// b*live + w continues beam w of sentence b. live is 1 on the first step, where each sentence
  /// has only its empty hypothesis, and W after. Returns true when every sentence is done;
  /// otherwise the next beams are in place and origin() says where each came from.
  template <class T>
  bool step(const T* logits, Index live, Index t) {
    // The logits are a bare pointer: live is all that says how many rows they hold, and any other
    // count read rows past them.
    ATTN_CHECK(live == 1 || live == W_, ShapeError,
               "BeamState::step: expected live = 1 (the first step) or the beam width ", W_,
               " rows per sentence, got ", live);
    bool all_done = true;
    for (Index b = 0; b < B_; ++b) {
      if (!done_[static_cast<std::size_t>(b)]) {
        expand(b, logits + b * live * V_, live, t);
        prune(b, live, t);
      } else {
        keep_in_place(b, 0, live);  // rows stay where they are; their outputs are ignored
      }
      all_done = all_done && done_[static_cast<std::size_t>(b)];
    }
    if (!all_done) advance();
    return all_done;
  }

  /// Row r of the next step continues row origin()[r] of the logits the last step() was given
  /// (decoder caches follow it with reorder, or gather after the first step).
  const std::vector<Index>& origin() const { return origin_; }

  /// The next decoder input of each row, into tokens [B*W, 1] (rows of done sentences untouched).
  void next_tokens(Tensor<TokenId>& tokens) const {
    ATTN_CHECK(tokens.rank() == 2 && tokens.size(0) == rows() && tokens.size(1) == 1, ShapeError,
               "BeamState::next_tokens: expected tokens [B*W, 1] = [", rows(), ", 1], got ",
               tokens.shape());
    for (Index r = 0; r < rows(); ++r) {
      if (done_[static_cast<std::size_t>(r / W_)]) continue;
      const auto& hyp = hyps_[static_cast<std::size_t>(r)];
      tokens(r, 0) = hyp.empty() ? opts_.eos : hyp.back();
    }
  }

  /// The best finished hypothesis of each sentence, without BOS and EOS (empty when none).
  std::vector<std::vector<TokenId>> finish() const {
    std::vector<std::vector<TokenId>> out(static_cast<std::size_t>(B_));
    for (Index b = 0; b < B_; ++b) {
      const auto& f = finished_[static_cast<std::size_t>(b)];
      if (f.empty()) continue;
      const auto best =
          std::max_element(f.begin(), f.end(),
                           [](const Finished& x, const Finished& y) { return x.score < y.score; });
      out[static_cast<std::size_t>(b)] = best->tokens;
    }
    return out;
  }

 private:
  struct Finished {
    std::vector<TokenId> tokens;
    double score;  // log P / lp
  };
  static constexpr double kNegInf = -std::numeric_limits<double>::infinity();

  static const DecodeOptions& validated(const DecodeOptions& opts, Index vocab, TokenId pad_id) {
    opts.validate(vocab, pad_id);  // before beam_size and vocab size the buffers below
    return opts;
  }

  std::size_t rows_u() const { return static_cast<std::size_t>(B_ * W_); }
  std::size_t at(Index b, Index w) const { return static_cast<std::size_t>(b * W_ + w); }

  /// cand_score[w*V + v] <- log P(beam w of sentence b, then token v), from its `live` logits rows
  /// [live, V] at step t (NumericError unless finite); beams without a row (the first step) and
  /// the padding token score -inf.
  template <class T>
  void expand(Index b, const T* logits, Index live, Index t) {
    for (Index w = 0; w < W_; ++w) {
      double* out = cand_score_.data() + w * V_;
      if (w >= live) {
        std::fill(out, out + V_, kNegInf);
        continue;
      }
      const T* row = logits + w * V_;
      detail::check_finite_logits(row, V_, b, t);
      const double mx = *std::max_element(row, row + V_);
      double sum = 0;
      for (Index v = 0; v < V_; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
      const double lse = mx + std::log(sum);
      const double prefix = scores_[at(b, w)];
      for (Index v = 0; v < V_; ++v) out[v] = prefix + static_cast<double>(row[v]) - lse;
      if (!detail::may_output(pad_, pad_, opts_)) out[pad_] = kNegInf;
    }
  }

  /// Picks sentence b's next beams from cand_score (see the top of this file).
  void prune(Index b, Index live, Index t) {
    std::iota(cand_.begin(), cand_.end(), Index(0));
    const Index top = std::min<Index>(2 * W_, W_ * V_);
    std::partial_sort(cand_.begin(), cand_.begin() + top, cand_.end(), [&](Index x, Index y) {
      const double sx = cand_score_[static_cast<std::size_t>(x)],
                   sy = cand_score_[static_cast<std::size_t>(y)];
      return sx > sy || (sx == sy && x < y);
    });
    auto& finished = finished_[static_cast<std::size_t>(b)];
    Index kept = 0;
    for (Index i = 0; i < top && kept < W_; ++i) {
      const Index c = cand_[static_cast<std::size_t>(i)];
      const double score = cand_score_[static_cast<std::size_t>(c)];
      if (score == kNegInf) break;
      const Index w = c / V_;
      const TokenId token = static_cast<TokenId>(c % V_);
      const auto& hyp = hyps_[at(b, w)];
      if (token == opts_.eos) {
        if (i < W_) finish_one(finished, hyp, score, static_cast<Index>(hyp.size()) + 1);
        continue;
      }
      next_hyps_[at(b, kept)] = hyp;
      next_hyps_[at(b, kept)].push_back(token);
      next_scores_[at(b, kept)] = score;
      origin_[at(b, kept)] = b * live + w;
      ++kept;
    }
    keep_in_place(b, kept, live);  // fewer live continuations than beams
    const bool at_limit = t + 1 >= limits_[static_cast<std::size_t>(b)];
    if (at_limit) {  // finish the live beams as they stand
      for (Index w = 0; w < kept; ++w) {
        const auto& hyp = next_hyps_[at(b, w)];
        finish_one(finished, hyp, next_scores_[at(b, w)], static_cast<Index>(hyp.size()));
      }
    }
    if (static_cast<Index>(finished.size()) >= W_ || at_limit || kept == 0)
      done_[static_cast<std::size_t>(b)] = true;
  }

  void finish_one(std::vector<Finished>& finished, const std::vector<TokenId>& hyp, double log_p,
                  Index length) const {
    finished.push_back({hyp, log_p / gnmt_length_penalty(length, opts_.length_penalty)});
  }

  /// Beams [from, W) of sentence b become dead rows that continue from a row of their own
  /// sentence (any row would do: a dead row's logits are never read).
  void keep_in_place(Index b, Index from, Index live) {
    for (Index w = from; w < W_; ++w) {
      origin_[at(b, w)] = b * live + std::min(w, live - 1);
      next_scores_[at(b, w)] = kNegInf;
      next_hyps_[at(b, w)].clear();
    }
  }

  /// The pruned beams become the live ones (sentences done before this step keep theirs).
  void advance() {
    for (Index r = 0; r < rows(); ++r) {
      if (done_[static_cast<std::size_t>(r / W_)]) continue;
      hyps_[static_cast<std::size_t>(r)].swap(next_hyps_[static_cast<std::size_t>(r)]);
      scores_[static_cast<std::size_t>(r)] = next_scores_[static_cast<std::size_t>(r)];
    }
  }

  DecodeOptions opts_;
  TokenId pad_;
  Index B_, W_, V_;
  std::vector<Index> limits_;                           // [B] output length limits
  std::vector<std::vector<TokenId>> hyps_, next_hyps_;  // [B*W] live beam tokens
  std::vector<double> scores_, next_scores_;            // [B*W] live log P (-inf: dead row)
  std::vector<Index> origin_;                           // [B*W] row of the last logits continued
  std::vector<Index> cand_;                             // [W*V] candidate order of one sentence
  std::vector<double> cand_score_;                      // [W*V] candidate log P
  std::vector<std::vector<Finished>> finished_;         // [B] finished hypotheses
  std::vector<bool> done_;                              // [B]
};

}  // namespace attn
