// Beam search as the paper ran it (section 6.1): beam size 4, length penalty alpha 0.6 with GNMT's
// lp(Y) = ((5 + |Y|) / 6)^alpha, outputs up to source length + 50, batched over sentences and
// incremental (the decoder's key/value caches are reordered, not recomputed, when beams swap).
//
// Each step scores every (beam, token) continuation by the sum of log-probabilities, takes the
// best 2k, finishes those ending in EOS that rank within the first k (score / lp(|Y|), |Y|
// counting EOS), and continues with the best k others. A sentence is done when it has k finished
// hypotheses (or at its length limit, where the live beams are finished as they are). With k = 1
// this is exactly greedy decoding.
#pragma once

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "attn/decode/greedy.hpp"

namespace attn {

/// GNMT's length penalty ((5 + length) / 6)^alpha.
inline double gnmt_length_penalty(Index length, double alpha) {
  return std::pow((5.0 + static_cast<double>(length)) / 6.0, alpha);
}

/// The best hypothesis of each source row of `src` [B, S], without BOS and EOS.
template <class T>
std::vector<std::vector<TokenId>> beam_search(Transformer<T>& model, const Tensor<TokenId>& src,
                                              const DecodeOptions& opts = {}) {
  const Index V = model.config().tgt_vocab;
  opts.validate(V);
  detail::EvalGuard<T> guard(model);
  const Index B = src.size(0), S = src.size(1), K = opts.beam_size;
  const std::vector<Index> src_len = detail::source_lengths(src, model.config().pad_id);
  const Index max_len = *std::max_element(src_len.begin(), src_len.end()) + opts.max_extra_length;

  // Every source row repeated K times: row b*K + k is beam k of sentence b.
  Tensor<TokenId> src_rep({B * K, S});
  for (Index r = 0; r < B * K; ++r)
    std::copy_n(src.data() + (r / K) * S, S, src_rep.data() + r * S);
  const Tensor<T>& memory = model.encode(src_rep);
  DecoderCache<T> cache = model.decoder.make_cache(B * K, std::max<Index>(max_len, 1));

  struct Finished {
    std::vector<TokenId> tokens;
    double score;  // log P / lp
  };
  const double kNegInf = -std::numeric_limits<double>::infinity();
  std::vector<std::vector<TokenId>> hyps(static_cast<std::size_t>(B * K));      // live beam tokens
  std::vector<double> scores(static_cast<std::size_t>(B * K), kNegInf);         // live log P
  for (Index b = 0; b < B; ++b) scores[static_cast<std::size_t>(b * K)] = 0.0;  // one live beam
  std::vector<std::vector<Finished>> finished(static_cast<std::size_t>(B));
  std::vector<bool> done(static_cast<std::size_t>(B), false);

  Tensor<TokenId> tokens = Tensor<TokenId>::full({B * K, 1}, opts.bos);
  std::vector<double> logp(static_cast<std::size_t>(V));
  std::vector<Index> cand(static_cast<std::size_t>(K * V));
  std::vector<double> cand_score(static_cast<std::size_t>(K * V));
  std::vector<Index> origin(static_cast<std::size_t>(B * K));
  std::vector<std::vector<TokenId>> next_hyps(static_cast<std::size_t>(B * K));
  std::vector<double> next_scores(static_cast<std::size_t>(B * K));

  for (Index t = 0; t < max_len; ++t) {
    const Tensor<T>& logits = model.decode_step(tokens, t, memory, cache);  // [B*K, 1, V]
    bool all_done = true;
    for (Index b = 0; b < B; ++b) {
      const std::size_t ub = static_cast<std::size_t>(b);
      if (done[ub]) {
        for (Index k = 0; k < K; ++k) {  // keep the rows in place; their outputs are ignored
          origin[static_cast<std::size_t>(b * K + k)] = b * K + k;
          next_scores[static_cast<std::size_t>(b * K + k)] = kNegInf;
        }
        continue;
      }
      // Total log-probability of every (beam, token) continuation.
      for (Index k = 0; k < K; ++k) {
        const Index r = b * K + k;
        const T* row = logits.data() + r * V;
        const double mx = *std::max_element(row, row + V);
        double sum = 0;
        for (Index v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
        const double lse = mx + std::log(sum);
        for (Index v = 0; v < V; ++v)
          cand_score[static_cast<std::size_t>(k * V + v)] =
              scores[static_cast<std::size_t>(r)] + static_cast<double>(row[v]) - lse;
      }
      std::iota(cand.begin(), cand.end(), Index(0));
      const Index top = std::min<Index>(2 * K, K * V);
      std::partial_sort(cand.begin(), cand.begin() + top, cand.end(), [&](Index a, Index c) {
        const double sa = cand_score[static_cast<std::size_t>(a)],
                     sc = cand_score[static_cast<std::size_t>(c)];
        return sa > sc || (sa == sc && a < c);
      });
      const bool at_limit = t + 1 >= src_len[ub] + opts.max_extra_length;
      Index kept = 0;
      for (Index i = 0; i < top && kept < K; ++i) {
        const Index c = cand[static_cast<std::size_t>(i)];
        const double sc = cand_score[static_cast<std::size_t>(c)];
        if (sc == kNegInf) break;
        const Index k = c / V;
        const TokenId tok = static_cast<TokenId>(c % V);
        const auto& hyp = hyps[static_cast<std::size_t>(b * K + k)];
        if (tok == opts.eos) {
          if (i < K) {
            const Index len = static_cast<Index>(hyp.size()) + 1;
            finished[ub].push_back({hyp, sc / gnmt_length_penalty(len, opts.length_penalty)});
          }
          continue;
        }
        const std::size_t dst = static_cast<std::size_t>(b * K + kept);
        next_hyps[dst] = hyp;
        next_hyps[dst].push_back(tok);
        next_scores[dst] = sc;
        origin[dst] = b * K + k;
        ++kept;
      }
      for (Index k = kept; k < K; ++k) {  // fewer live continuations than beams
        origin[static_cast<std::size_t>(b * K + k)] = b * K + k;
        next_scores[static_cast<std::size_t>(b * K + k)] = kNegInf;
        next_hyps[static_cast<std::size_t>(b * K + k)].clear();
      }
      if (at_limit) {  // finish the live beams as they stand
        for (Index k = 0; k < kept; ++k) {
          const auto& hyp = next_hyps[static_cast<std::size_t>(b * K + k)];
          finished[ub].push_back(
              {hyp, next_scores[static_cast<std::size_t>(b * K + k)] /
                        gnmt_length_penalty(static_cast<Index>(hyp.size()), opts.length_penalty)});
        }
      }
      if (static_cast<Index>(finished[ub].size()) >= K || at_limit || kept == 0) done[ub] = true;
      all_done = all_done && done[ub];
    }
    if (all_done) break;
    for (Index r = 0; r < B * K; ++r) {
      const std::size_t ur = static_cast<std::size_t>(r);
      if (done[static_cast<std::size_t>(r / K)]) continue;
      hyps[ur].swap(next_hyps[ur]);
      scores[ur] = next_scores[ur];
      tokens(r, 0) = hyps[ur].empty() ? opts.eos : hyps[ur].back();
    }
    cache.reorder(origin);
  }

  std::vector<std::vector<TokenId>> out(static_cast<std::size_t>(B));
  for (Index b = 0; b < B; ++b) {
    const auto& f = finished[static_cast<std::size_t>(b)];
    if (f.empty()) continue;
    const auto best = std::max_element(
        f.begin(), f.end(), [](const Finished& a, const Finished& c) { return a.score < c.score; });
    out[static_cast<std::size_t>(b)] = best->tokens;
  }
  return out;
}

}  // namespace attn
