#include "batching.hpp"

#include <algorithm>
#include <numeric>

#include <attn/error.hpp>
#include <attn/random.hpp>

namespace attn::translate {
namespace {

Index len(const std::vector<TokenId>& v) { return static_cast<Index>(v.size()); }

Batch make_batch(const std::vector<TokenizedPair>& pairs, const std::vector<std::size_t>& rows,
                 Index S, Index T, const BatchingOptions& o) {
  const Index B = static_cast<Index>(rows.size());
  Batch b;
  b.src = Tensor<TokenId>::full({B, S}, o.pad_id);
  b.tgt_in = Tensor<TokenId>::full({B, T}, o.pad_id);
  b.tgt_out = Tensor<TokenId>::full({B, T}, o.pad_id);
  b.pairs = rows;
  for (Index r = 0; r < B; ++r) {
    const TokenizedPair& p = pairs[rows[static_cast<std::size_t>(r)]];
    TokenId* src = b.src.data() + r * S;
    TokenId* in = b.tgt_in.data() + r * T;
    TokenId* out = b.tgt_out.data() + r * T;
    std::copy(p.src.begin(), p.src.end(), src);
    in[0] = o.bos_id;
    std::copy(p.tgt.begin(), p.tgt.end(), in + 1);
    std::copy(p.tgt.begin(), p.tgt.end(), out);
    out[len(p.tgt)] = o.eos_id;
    b.src_tokens += len(p.src);
    b.tgt_tokens += len(p.tgt) + 1;
  }
  return b;
}

}  // namespace

Batcher::Batcher(const std::vector<TokenizedPair>& pairs, const BatchingOptions& o) {
  ATTN_CHECK(o.max_len >= 2, ConfigError, "max_len must be at least 2, got ", o.max_len);
  ATTN_CHECK(o.max_tokens >= o.max_len, ConfigError, "max_tokens (", o.max_tokens,
             ") must be at least max_len (", o.max_len,
             ") so that a pair of the longest allowed length fits in a batch");
  std::vector<std::size_t> kept;
  kept.reserve(pairs.size());
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const TokenizedPair& p = pairs[i];
    ATTN_CHECK(p.overlong || !p.src.empty(), DataError, "pair ", i, " (line ", i + 1,
               "): the source is empty");
    const bool too_long = p.longer_than(o.max_len);
    if (too_long && o.overlong == OverlongPolicy::kSkip) {
      ++skipped_;
      continue;
    }
    ATTN_CHECK(!p.overlong, DataError, "pair ", i, " (line ", i + 1, ") is longer than max_len ",
               o.max_len, ": a side has too many bytes to be encoded");
    ATTN_CHECK(!too_long, DataError, "pair ", i, " (line ", i + 1, ") is longer than max_len ",
               o.max_len, ": source ", p.src.size(), " tokens, target ", p.tgt.size(),
               " + 1 tokens");
    kept.push_back(i);
  }
  std::sort(kept.begin(), kept.end(), [&](std::size_t a, std::size_t b) {
    const TokenizedPair &x = pairs[a], &y = pairs[b];
    if (x.src.size() != y.src.size()) return x.src.size() < y.src.size();
    if (x.tgt.size() != y.tgt.size()) return x.tgt.size() < y.tgt.size();
    return a < b;
  });
  std::vector<std::size_t> rows;
  Index S = 0, T = 0;
  for (std::size_t i : kept) {
    const Index s = std::max(S, len(pairs[i].src));
    const Index t = std::max(T, len(pairs[i].tgt) + 1);
    if (!rows.empty() && static_cast<Index>(rows.size() + 1) * std::max(s, t) > o.max_tokens) {
      batches_.push_back(make_batch(pairs, rows, S, T, o));
      rows.clear();
      S = len(pairs[i].src);
      T = len(pairs[i].tgt) + 1;
    } else {
      S = s;
      T = t;
    }
    rows.push_back(i);
  }
  if (!rows.empty()) batches_.push_back(make_batch(pairs, rows, S, T, o));
}

std::vector<std::size_t> Batcher::epoch_order(std::uint64_t seed, std::uint64_t epoch) const {
  std::vector<std::size_t> order(batches_.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  Rng rng(mix64(seed) ^ mix64(epoch + 0x5bd1e995ULL));
  for (std::size_t i = order.size(); i > 1; --i)  // Fisher-Yates
    std::swap(order[i - 1], order[rng.below(i)]);
  return order;
}

std::vector<std::pair<std::size_t, std::size_t>> group_batches(const std::vector<Index>& tokens,
                                                               Index target) {
  ATTN_CHECK(target > 0, ConfigError, "group_batches: target token count must be > 0, got ",
             target);
  std::vector<std::pair<std::size_t, std::size_t>> groups;
  std::size_t begin = 0;
  Index sum = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    sum += tokens[i];
    if (sum >= target) {
      groups.emplace_back(begin, i + 1);
      begin = i + 1;
      sum = 0;
    }
  }
  if (begin < tokens.size()) groups.emplace_back(begin, tokens.size());
  return groups;
}

namespace {

void hash_ids(std::uint64_t& h, const Tensor<TokenId>& t) {
  const Index shape[2] = {t.size(0), t.size(1)};
  h = fnv1a(h, shape, sizeof shape);
  h = fnv1a(h, t.data(), static_cast<std::size_t>(t.numel()) * sizeof(TokenId));
}

}  // namespace

std::uint64_t fingerprint(const Batcher& batches) {
  std::uint64_t h = kFnv1aOffset;
  for (const Batch& b : batches.batches()) {
    hash_ids(h, b.src);
    hash_ids(h, b.tgt_out);
  }
  return h;
}

}  // namespace attn::translate
