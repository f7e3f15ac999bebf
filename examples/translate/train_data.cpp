#include "train_data.hpp"

#include <iostream>

#include <attn/error.hpp>

namespace attn::translate {

namespace {

BuiltinCorpus load_builtin(const BuiltinCorpusOptions& b, bool report) {
  BuiltinCorpusStats stats;
  BuiltinCorpus corpus = load_builtin_corpus(b, &stats);
  if (!report) return corpus;
  for (const auto& m : stats.missing) std::cerr << "built-in corpus: left out " << m << '\n';
  const auto& s = corpus.split;
  std::cerr << "built-in corpus (English -> German): " << s.train.size() << " training pairs ("
            << stats.train_by_source[0] << " from package descriptions, "
            << stats.train_by_source[1] << " from the dictionary, " << stats.train_by_source[2]
            << " from gettext), " << s.valid.size() << " validation and " << s.test.size()
            << " test sentences held out; " << stats.duplicates << " repeated sources and "
            << stats.removed_overlap << " pairs overlapping the held-out sets removed\n";
  return corpus;
}

}  // namespace

void apply_mix(const std::string& mix, BuiltinCorpusOptions& b) {
  b.descriptions = b.dictionary_sentences = b.dictionary_phrases = b.dictionary_words = false;
  b.gettext = false;
  std::size_t start = 0;
  while (start <= mix.size()) {
    std::size_t end = mix.find(',', start);
    if (end == std::string::npos) end = mix.size();
    const std::string item = mix.substr(start, end - start);
    bool* flag = item == "descriptions" ? &b.descriptions
                 : item == "sentences"  ? &b.dictionary_sentences
                 : item == "phrases"    ? &b.dictionary_phrases
                 : item == "words"      ? &b.dictionary_words
                 : item == "gettext"    ? &b.gettext
                                        : nullptr;
    ATTN_CHECK(flag != nullptr, ConfigError, "--mix: unknown source '", item,
               "', expected a comma-separated list of descriptions, sentences, phrases, words, "
               "gettext");
    *flag = true;
    start = end + 1;
  }
}

BuiltinCorpus load_train_data(const TrainDataFlags& f, bool report) {
  ATTN_CHECK(f.src.empty() == f.tgt.empty(), ConfigError,
             "train: --src and --tgt go together (got --src '", f.src, "', --tgt '", f.tgt, "')");
  ATTN_CHECK(f.valid_src.empty() == f.valid_tgt.empty() && f.test_src.empty() == f.test_tgt.empty(),
             ConfigError, "train: --valid-src/--valid-tgt and --test-src/--test-tgt go in pairs");
  BuiltinCorpus corpus;
  CorpusSplit& data = corpus.split;
  // Given files that hold nothing would train nothing, or skip validation and the test BLEU without
  // a word.
  const auto check_not_empty = [](const ParallelCorpus& c, const char* flags,
                                  const std::string& src, const std::string& tgt, const char* why) {
    ATTN_CHECK(c.size() > 0, DataError, flags, " '", src, "' and '", tgt,
               "' hold no sentence pair: nothing to ", why);
  };
  if (f.src.empty()) {
    corpus = load_builtin(f.builtin, report);
  } else {
    data.train = read_parallel(f.src, f.tgt);
    check_not_empty(data.train, "--src/--tgt", f.src, f.tgt, "train on");
  }
  if (!f.valid_src.empty()) {
    data.valid = read_parallel(f.valid_src, f.valid_tgt);
    check_not_empty(data.valid, "--valid-src/--valid-tgt", f.valid_src, f.valid_tgt, "score");
  }
  if (!f.test_src.empty()) {
    data.test = read_parallel(f.test_src, f.test_tgt);
    check_not_empty(data.test, "--test-src/--test-tgt", f.test_src, f.test_tgt, "score");
    corpus.showcase.clear();
  }
  return corpus;
}

}  // namespace attn::translate
