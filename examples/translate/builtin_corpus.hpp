// The trainer's built-in English -> German corpus: human translations that a Debian machine gets
// through apt, read at run time from where Debian puts them (nothing is copied into the project).
//
// Sources (a missing one is named in BuiltinCorpusStats::missing and the rest are used, and so is
// a gettext catalog that cannot be read; the options choose which are trained on):
//   descriptions: Debian's translated package descriptions (debian_descriptions.hpp), technical
//                 prose paired by sentence;
//   dictionary:   the sentences of the trans-de-en dictionary (dictionary_corpus.hpp);
//                 multi-word phrases and single words are left out by default (phrases slowed
//                 learning in README's comparison; words on their own teach the model to answer
//                 "etw."), "to do sth." patterns always;
//   gettext:      the UI strings of the gettext catalogs (gettext_corpus.hpp), off by default.
//
// Assembly (assemble_builtin_corpus, a pure function of the pairs, so it is tested on its own):
//   1. Pairs whose English side repeats an earlier one are dropped (sources in the order above,
//      files in name order): one source sentence, one reference.
//   2. Held-out candidates are the full sentences of the package descriptions, whatever the
//      training mix (so every mix is scored on the same sentences): held_out_min_words..
//      held_out_max_words English words, starting with an upper-case letter or digit, ending in
//      '.', '!' or '?'. The dictionary's example sentences are mostly idioms ("The modern lamp
//      jars with the antique furniture.") that no short run learns, so they are held out only
//      when no description could be read (stats->held_out_source says which). The candidates are
//      ordered by stable_hash of the English side (FNV-1a + SplitMix, fixed across platforms);
//      the first valid_size become the validation set, the next test_size the test set.
//   3. Every pair whose English or German side equals a held-out pair's English or German side
//      is removed from training, so neither the test nor the validation sentences are trained on.
//   4. The training set is the rest of the pairs in the mix; dictionary sentences appear
//      sentence_weight times.
// `showcase` lists the first show_count test sentences (in test-set order) of show_min_words..
// show_max_words English words: short, plain sentences that the main job prints with their
// translations.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "corpus_io.hpp"

namespace attn::translate {

enum class CorpusSource { kDescriptions, kDictionary, kGettext };
const char* corpus_source_name(CorpusSource source);

struct BuiltinCorpusOptions {
  std::string apt_lists_dir = "/var/lib/apt/lists";
  std::string dictionary_path = "/usr/share/trans/de-en";
  std::string gettext_dir = "/usr/share/locale/de/LC_MESSAGES";
  bool descriptions = true;
  bool dictionary_sentences = true;
  bool dictionary_phrases = false;  ///< slowed learning in README's comparison
  bool dictionary_words = false;
  bool gettext = false;
  int sentence_weight = 2;  ///< copies of each dictionary sentence in the training set
  std::size_t valid_size = 500;
  std::size_t test_size = 500;
  std::size_t held_out_min_words = 5;
  std::size_t held_out_max_words = 20;
  std::size_t show_count = 8;      ///< showcase: the first test sentences of
  std::size_t show_min_words = 5;  ///< show_min_words..show_max_words English words
  std::size_t show_max_words = 12;
};

struct SourcedPair {
  std::string en, de;
  CorpusSource source = CorpusSource::kDescriptions;
  bool sentence = false;  ///< a dictionary sentence (weighted by sentence_weight)
  bool train = true;      ///< in the training mix; held-out candidacy does not depend on it
};

struct BuiltinCorpusStats {
  /// "source: why" for each source that could not be read ("one gettext catalog: why" for each
  /// catalog left out of a source that was read)
  std::vector<std::string> missing;
  std::size_t pairs_read[3] = {0, 0, 0};  ///< per CorpusSource, as read
  std::size_t duplicates = 0;             ///< step 1
  std::size_t candidates = 0;             ///< step 2: full sentences eligible for held-out sets
  /// Step 2: the source of the held-out sentences.
  CorpusSource held_out_source = CorpusSource::kDescriptions;
  std::size_t removed_overlap = 0;             ///< step 3
  std::size_t train_by_source[3] = {0, 0, 0};  ///< training pairs per source, with weights
};

struct BuiltinCorpus {
  CorpusSplit split;
  std::vector<std::size_t> showcase;  ///< indices into split.test
};

/// True if `en` has the shape of a full sentence (step 2).
bool is_full_sentence(const std::string& en, std::size_t min_words, std::size_t max_words);

/// Steps 1-4 above. Throws DataError if fewer than valid_size + test_size candidates remain, or
/// no training pair does.
BuiltinCorpus assemble_builtin_corpus(const std::vector<SourcedPair>& pairs,
                                      const BuiltinCorpusOptions& options,
                                      BuiltinCorpusStats* stats = nullptr);

/// Reads the enabled sources (a missing one is recorded in stats->missing, not fatal) and
/// assembles them. Throws DataError naming every missing source if none could be read.
BuiltinCorpus load_builtin_corpus(const BuiltinCorpusOptions& options = {},
                                  BuiltinCorpusStats* stats = nullptr);

}  // namespace attn::translate
