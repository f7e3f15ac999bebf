#include "builtin_corpus.hpp"

#include <algorithm>
#include <cctype>
#include <tuple>
#include <unordered_set>

#include <attn/error.hpp>

#include "debian_descriptions.hpp"
#include "dictionary_corpus.hpp"
#include "gettext_corpus.hpp"
#include "text.hpp"

namespace attn::translate {
namespace {

void add(ParallelCorpus& c, const SourcedPair& p) {
  c.src.push_back(p.en);
  c.tgt.push_back(p.de);
}

// Each source reader appends its pairs to `out`, and to `left_out` the parts it could not read
// while it read the rest ("source: why").
void read_descriptions(const BuiltinCorpusOptions& o, std::vector<SourcedPair>& out,
                       std::vector<std::string>&) {
  DebianDescriptionOptions d;
  d.directory = o.apt_lists_dir;
  const ParallelCorpus c = load_debian_descriptions(d);
  for (std::size_t i = 0; i < c.size(); ++i)
    out.push_back({c.src[i], c.tgt[i], CorpusSource::kDescriptions, false, o.descriptions});
}

void read_dictionary(const BuiltinCorpusOptions& o, std::vector<SourcedPair>& out,
                     std::vector<std::string>&) {
  for (DictPair& p : load_dictionary(o.dictionary_path)) {
    const bool sentence = p.kind == DictKind::kSentence;
    const bool train = (sentence && o.dictionary_sentences) ||
                       (p.kind == DictKind::kPhrase && o.dictionary_phrases) ||
                       (p.kind == DictKind::kWord && o.dictionary_words);
    // Sentences are read even when not trained on: without descriptions they are held out.
    if (train || sentence)
      out.push_back({std::move(p.en), std::move(p.de), CorpusSource::kDictionary, sentence, train});
  }
}

void read_gettext(const BuiltinCorpusOptions& o, std::vector<SourcedPair>& out,
                  std::vector<std::string>& left_out) {
  GettextCorpusOptions g;
  g.directory = o.gettext_dir;
  g.valid_size = g.test_size = 0;  // the split is made below, over all sources
  GettextCorpusStats stats;
  const CorpusSplit c = load_gettext_corpus(g, &stats);
  for (const std::string& why : stats.unreadable) left_out.push_back("one gettext catalog: " + why);
  for (std::size_t i = 0; i < c.train.size(); ++i)
    out.push_back({c.train.src[i], c.train.tgt[i], CorpusSource::kGettext, false, true});
}

}  // namespace

const char* corpus_source_name(CorpusSource source) {
  switch (source) {
    case CorpusSource::kDescriptions:
      return "Debian package descriptions";
    case CorpusSource::kDictionary:
      return "trans-de-en dictionary";
    case CorpusSource::kGettext:
      return "gettext catalogs";
  }
  return "?";
}

bool is_full_sentence(const std::string& en, std::size_t min_words, std::size_t max_words) {
  if (en.empty()) return false;
  const auto first = static_cast<unsigned char>(en.front());
  const char last = en.back();
  const std::size_t words = count_words(en);
  return (std::isupper(first) || std::isdigit(first)) &&
         (last == '.' || last == '!' || last == '?') && words >= min_words && words <= max_words;
}

BuiltinCorpus assemble_builtin_corpus(const std::vector<SourcedPair>& pairs,
                                      const BuiltinCorpusOptions& o, BuiltinCorpusStats* stats) {
  BuiltinCorpusStats local;
  BuiltinCorpusStats& st = stats ? *stats : local;
  // Step 1: one reference per English sentence.
  std::unordered_set<std::string> seen;
  std::vector<const SourcedPair*> unique;
  for (const SourcedPair& p : pairs) {
    if (seen.insert(p.en).second)
      unique.push_back(&p);
    else
      ++st.duplicates;
  }
  // Step 2: held-out sets by hash order of the full sentences of one source.
  const bool have_descriptions =
      std::any_of(unique.begin(), unique.end(),
                  [](const SourcedPair* p) { return p->source == CorpusSource::kDescriptions; });
  st.held_out_source = have_descriptions ? CorpusSource::kDescriptions : CorpusSource::kDictionary;
  std::vector<std::tuple<std::uint64_t, std::size_t>> candidates;
  for (std::size_t i = 0; i < unique.size(); ++i)
    if (unique[i]->source == st.held_out_source && (have_descriptions || unique[i]->sentence) &&
        is_full_sentence(unique[i]->en, o.held_out_min_words, o.held_out_max_words))
      candidates.emplace_back(stable_hash(unique[i]->en), i);
  std::sort(candidates.begin(), candidates.end());
  st.candidates = candidates.size();
  const std::size_t held_out = o.valid_size + o.test_size;
  ATTN_CHECK(candidates.size() >= held_out, DataError, "the built-in corpus has ",
             candidates.size(),
             " full sentences; expected at least valid_size + test_size = ", held_out);
  BuiltinCorpus out;
  std::vector<bool> is_held_out(unique.size(), false);
  std::unordered_set<std::string> held_text;  // both sides of every held-out pair
  for (std::size_t k = 0; k < held_out; ++k) {
    const std::size_t i = std::get<1>(candidates[k]);
    const SourcedPair& p = *unique[i];
    is_held_out[i] = true;
    held_text.insert(p.en);
    held_text.insert(p.de);
    ParallelCorpus& part = k < o.valid_size ? out.split.valid : out.split.test;
    const std::size_t words = count_words(p.en);
    if (&part == &out.split.test && out.showcase.size() < o.show_count &&
        words >= o.show_min_words && words <= o.show_max_words)
      out.showcase.push_back(part.size());
    add(part, p);
  }
  // Steps 3 and 4.
  for (std::size_t i = 0; i < unique.size(); ++i) {
    const SourcedPair& p = *unique[i];
    if (is_held_out[i] || !p.train) continue;
    if (held_text.count(p.en) || held_text.count(p.de)) {
      ++st.removed_overlap;
      continue;
    }
    const int copies =
        p.source == CorpusSource::kDictionary && p.sentence ? std::max(1, o.sentence_weight) : 1;
    for (int c = 0; c < copies; ++c) add(out.split.train, p);
    st.train_by_source[static_cast<int>(p.source)] += static_cast<std::size_t>(copies);
  }
  ATTN_CHECK(!out.split.train.empty(), DataError,
             "the built-in corpus has no training pair left after the held-out sets");
  return out;
}

BuiltinCorpus load_builtin_corpus(const BuiltinCorpusOptions& o, BuiltinCorpusStats* stats) {
  BuiltinCorpusStats local;
  BuiltinCorpusStats& st = stats ? *stats : local;
  st = BuiltinCorpusStats{};
  std::vector<SourcedPair> pairs;
  // Descriptions and the dictionary are always read: the held-out sets come from their full
  // sentences (assemble_builtin_corpus, step 2) and must not change with the training mix.
  const std::tuple<bool, CorpusSource,
                   void (*)(const BuiltinCorpusOptions&, std::vector<SourcedPair>&,
                            std::vector<std::string>&)>
      sources[] = {{true, CorpusSource::kDescriptions, read_descriptions},
                   {true, CorpusSource::kDictionary, read_dictionary},
                   {o.gettext, CorpusSource::kGettext, read_gettext}};
  for (const auto& [enabled, source, read] : sources) {
    if (!enabled) continue;
    const std::size_t before = pairs.size();
    try {
      read(o, pairs, st.missing);
    } catch (const Error& e) {  // a missing source is named, and the others still train
      st.missing.push_back(std::string(corpus_source_name(source)) + ": " + e.what());
      pairs.resize(before);
    }
    st.pairs_read[static_cast<int>(source)] = pairs.size() - before;
  }
  if (pairs.empty()) {
    std::string why;
    for (const auto& m : st.missing) why += (why.empty() ? " " : "; ") + m;
    ATTN_CHECK(false, DataError, "no source of the built-in corpus could be read:", why);
  }
  return assemble_builtin_corpus(pairs, o, &st);
}

}  // namespace attn::translate
