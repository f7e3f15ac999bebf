// The built-in corpus: its sources assembled into disjoint, deterministic splits, and what it
// does when a source, or one file of one, cannot be read.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>

#include <attn/error.hpp>

#include "error_helpers.hpp"
#include "mo_writer.hpp"
#include "temp_paths.hpp"

#include "builtin_corpus.hpp"
#include "text.hpp"

namespace fs = std::filesystem;
using namespace attn::translate;
using attn::testing::error_of;
using attn::translate::testing::temp_dir;
using attn::translate::testing::write_file;

namespace {

std::vector<SourcedPair> synthetic_pairs(std::size_t n) {
  std::vector<SourcedPair> p;
  for (std::size_t i = 0; i < n; ++i) {
    const std::string k = std::to_string(i);
    const bool dict = i % 3 == 0;
    p.push_back({"Sentence number " + k + " is here.", "Satz Nummer " + k + " ist hier.",
                 dict ? CorpusSource::kDictionary : CorpusSource::kDescriptions, dict});
    p.push_back({"word " + k, "Wort " + k, CorpusSource::kDictionary, false});
  }
  return p;
}

// A dictionary of `n` full sentences.
std::string sentence_dictionary(int n) {
  std::string dict;
  for (int i = 0; i < n; ++i)
    dict +=
        "Satz " + std::to_string(i) + " ist gut. :: Sentence " + std::to_string(i) + " is good.\n";
  return dict;
}

BuiltinCorpusOptions small_options() {
  BuiltinCorpusOptions o;
  o.valid_size = 10;
  o.test_size = 12;
  o.held_out_min_words = 3;
  return o;
}

}  // namespace

TEST(BuiltinCorpus, SplitsAreDeterministicDisjointAndFullSentences) {
  auto pairs = synthetic_pairs(100);
  // A test sentence's German repeated under another English source, and an exact repeat.
  pairs.push_back(pairs[0]);
  BuiltinCorpusStats st;
  const BuiltinCorpus a = assemble_builtin_corpus(pairs, small_options(), &st);
  EXPECT_EQ(a.split.valid.size(), 10u);
  EXPECT_EQ(a.split.test.size(), 12u);
  EXPECT_EQ(st.duplicates, 1u);
  EXPECT_EQ(st.candidates, 66u);  // the description sentences (i % 3 != 0)
  EXPECT_EQ(st.held_out_source, CorpusSource::kDescriptions);
  std::set<std::string> held;
  for (const ParallelCorpus* c : {&a.split.valid, &a.split.test})
    for (std::size_t i = 0; i < c->size(); ++i) {
      EXPECT_TRUE(is_full_sentence(c->src[i], 3, 20)) << c->src[i];
      const std::size_t k = std::stoul(c->src[i].substr(std::string("Sentence number ").size()));
      EXPECT_NE(k % 3, 0u) << "a dictionary sentence held out: " << c->src[i];
      EXPECT_TRUE(held.insert(c->src[i]).second) << "in both held-out sets: " << c->src[i];
      held.insert(c->tgt[i]);
    }
  for (std::size_t i = 0; i < a.split.train.size(); ++i) {
    EXPECT_EQ(held.count(a.split.train.src[i]), 0u) << a.split.train.src[i];
    EXPECT_EQ(held.count(a.split.train.tgt[i]), 0u) << a.split.train.tgt[i];
  }
  // Deterministic, and the held-out sets do not depend on the order of the pairs.
  const BuiltinCorpus b = assemble_builtin_corpus(pairs, small_options());
  EXPECT_EQ(a.split.train.src, b.split.train.src);
  EXPECT_EQ(a.split.test.src, b.split.test.src);
  std::shuffle(pairs.begin(), pairs.end(), std::mt19937(7));
  const BuiltinCorpus c = assemble_builtin_corpus(pairs, small_options());
  EXPECT_EQ(a.split.valid.src, c.split.valid.src);
  EXPECT_EQ(a.split.test.src, c.split.test.src);
  // The showcase: the first 8 test sentences of 5-12 words (all of these have 5).
  EXPECT_EQ(a.showcase, (std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(BuiltinCorpus, ShowcaseIsTheFirstTestSentencesOfItsLength) {
  std::vector<SourcedPair> pairs;
  for (int i = 0; i < 60; ++i) {  // 4, 5, ..., 15 words
    std::string en = "Number", de = "Nummer";
    for (int w = 0; w < 3 + i % 12; ++w) en += " w" + std::to_string(i), de += " x";
    pairs.push_back({en + ".", de + std::to_string(i) + ".", CorpusSource::kDescriptions, false});
  }
  BuiltinCorpusOptions o = small_options();
  o.held_out_min_words = 1;
  o.show_count = 3;
  o.show_min_words = 6;
  o.show_max_words = 9;
  const BuiltinCorpus a = assemble_builtin_corpus(pairs, o);
  std::vector<std::size_t> expected;
  for (std::size_t i = 0; i < a.split.test.size() && expected.size() < 3; ++i) {
    const std::size_t words = count_words(a.split.test.src[i]);
    if (words >= 6 && words <= 9) expected.push_back(i);
  }
  EXPECT_EQ(expected.size(), 3u);  // the rule has something to pick from
  EXPECT_EQ(a.showcase, expected);
}

TEST(BuiltinCorpus, OverlapWithHeldOutSidesIsRemovedAndSentencesWeighted) {
  auto pairs = synthetic_pairs(60);
  BuiltinCorpusOptions o = small_options();
  const BuiltinCorpus a = assemble_builtin_corpus(pairs, o);
  const std::string test_de = a.split.test.tgt[0];
  // Not sentence-shaped, so never held out itself.
  pairs.push_back({"another English source", test_de, CorpusSource::kDescriptions, false});
  BuiltinCorpusStats st;
  o.sentence_weight = 3;
  const BuiltinCorpus b = assemble_builtin_corpus(pairs, o, &st);
  EXPECT_EQ(st.removed_overlap, 1u);
  EXPECT_EQ(std::count(b.split.train.tgt.begin(), b.split.train.tgt.end(), test_de), 0);
  // 60 words and the 20 dictionary sentences three times each (none is held out); the 40
  // description sentences minus the 22 held out, plus the new pair, minus the one removed.
  EXPECT_EQ(st.train_by_source[static_cast<int>(CorpusSource::kDictionary)], 60u + 3u * 20u);
  EXPECT_EQ(st.train_by_source[static_cast<int>(CorpusSource::kDescriptions)], 40u - 22u);
  for (std::size_t i = 0; i < 60; i += 3)
    EXPECT_EQ(std::count(b.split.train.src.begin(), b.split.train.src.end(), pairs[2 * i].en), 3)
        << pairs[2 * i].en;
}

TEST(BuiltinCorpus, HeldOutSetsDoNotDependOnTheTrainingMix) {
  auto pairs = synthetic_pairs(60);
  const BuiltinCorpus all = assemble_builtin_corpus(pairs, small_options());
  // Sentence-shaped gettext strings are never held out; pairs outside the mix are not trained on.
  for (int i = 0; i < 30; ++i)
    pairs.push_back({"Gettext string " + std::to_string(i) + " was saved.",
                     "Zeichenkette " + std::to_string(i), CorpusSource::kGettext, false, true});
  for (auto& p : pairs)
    if (p.source == CorpusSource::kDescriptions) p.train = false;
  BuiltinCorpusStats st;
  const BuiltinCorpus mixed = assemble_builtin_corpus(pairs, small_options(), &st);
  EXPECT_EQ(all.split.valid.src, mixed.split.valid.src);
  EXPECT_EQ(all.split.test.src, mixed.split.test.src);
  EXPECT_EQ(st.train_by_source[static_cast<int>(CorpusSource::kDescriptions)], 0u);
  EXPECT_EQ(st.train_by_source[static_cast<int>(CorpusSource::kGettext)], 30u);
}

TEST(BuiltinCorpus, TooFewSentencesIsADataError) {
  EXPECT_NE(error_of<attn::DataError>([&] {
              assemble_builtin_corpus(synthetic_pairs(5), small_options());
            }).find("has 3 full sentences; expected at least valid_size + test_size = 22"),
            std::string::npos);
}

TEST(BuiltinCorpus, MissingSourcesAreNamedAndTheRestUsed) {
  const fs::path dir = temp_dir("builtin");
  BuiltinCorpusOptions o = small_options();
  o.apt_lists_dir = (dir / "no_lists").string();
  o.gettext = true;
  o.gettext_dir = (dir / "no_locale").string();
  o.dictionary_path = (dir / "de-en").string();
  write_file(o.dictionary_path, sentence_dictionary(40));
  BuiltinCorpusStats st;
  const BuiltinCorpus c = load_builtin_corpus(o, &st);
  ASSERT_EQ(st.missing.size(), 2u);
  EXPECT_EQ(st.missing[0].rfind("Debian package descriptions: ", 0), 0u) << st.missing[0];
  EXPECT_EQ(st.missing[1].rfind("gettext catalogs: ", 0), 0u) << st.missing[1];
  // Without descriptions the dictionary's sentences are held out instead.
  EXPECT_EQ(st.held_out_source, CorpusSource::kDictionary);
  EXPECT_EQ(c.split.valid.size() + c.split.test.size(), 22u);
  EXPECT_EQ(c.split.train.size(), 2u * 18u);  // sentence_weight 2
  o.dictionary_path = (dir / "missing").string();
  EXPECT_NE(error_of<attn::DataError>([&] { load_builtin_corpus(o); })
                .find("no source of the built-in corpus could be read: Debian package "
                      "descriptions: "),
            std::string::npos);
}

namespace {

/// Options for the sources in `dir`: no package descriptions, the gettext catalogs in dir/locale
/// (made by the test) and a dictionary of 40 sentences in dir/de-en.
BuiltinCorpusOptions catalogs_and_dictionary(const fs::path& dir) {
  BuiltinCorpusOptions o = small_options();
  o.apt_lists_dir = (dir / "no_lists").string();
  o.gettext = true;
  o.gettext_dir = (dir / "locale").string();
  o.dictionary_path = (dir / "de-en").string();
  write_file(o.dictionary_path, sentence_dictionary(40));
  return o;
}

}  // namespace

TEST(BuiltinCorpus, UnreadableFilesLeaveTheirSourceOutWithANote) {
  // A directory named x.mo threw std::ios_base::failure past the catch that leaves a source out,
  // and ended the run; a directory as the dictionary was read as 0 pairs without a note.
  const fs::path dir = temp_dir("builtin_unreadable");
  BuiltinCorpusOptions o = catalogs_and_dictionary(dir);
  const std::string catalog = (dir / "locale" / "x.mo").string();
  fs::create_directories(catalog);
  BuiltinCorpusStats st;
  EXPECT_EQ(load_builtin_corpus(o, &st).split.train.size(), 2u * 18u);
  ASSERT_EQ(st.missing.size(), 2u);
  EXPECT_NE(st.missing[1].find("gettext catalogs: the gettext catalogs in '" + o.gettext_dir +
                               "' yield 0 usable pairs from 0 files"),
            std::string::npos)
      << st.missing[1];
  EXPECT_NE(st.missing[1].find("(1 could not be read, the first: cannot read " + catalog +
                               ": expected a regular file, found a directory)"),
            std::string::npos)
      << st.missing[1];
  o.dictionary_path = dir.string();
  EXPECT_NE(
      error_of<attn::DataError>([&] { load_builtin_corpus(o); })
          .find("; trans-de-en dictionary: cannot open the dictionary (Debian package "
                "trans-de-en: apt-get install trans-de-en): cannot read " +
                dir.string() + ": expected a regular file, found a directory; gettext catalogs: "),
      std::string::npos);
}

TEST(BuiltinCorpus, ACatalogThatCannotBeReadIsNamedAndTheOthersAreUsed) {
  // One package's broken catalog (here a directory named like one) ended the whole source before;
  // now it is left out, and the notes the trainer prints name it.
  const fs::path dir = temp_dir("builtin_one_catalog");
  BuiltinCorpusOptions o = catalogs_and_dictionary(dir);
  fs::create_directories(dir / "locale");
  std::vector<attn::translate::testing::RawEntry> entries{
      {"", "Content-Type: text/plain; charset=UTF-8\n"}};
  for (int i = 0; i < 40; ++i)
    entries.push_back(
        {"open file number " + std::to_string(i), "Datei nummer " + std::to_string(i)});
  write_file(dir / "locale" / "a.mo", attn::translate::testing::make_mo(entries));
  const std::string broken = (dir / "locale" / "b.mo").string();
  fs::create_directories(broken);
  BuiltinCorpusStats st;
  load_builtin_corpus(o, &st);
  EXPECT_EQ(st.pairs_read[static_cast<int>(CorpusSource::kGettext)], 40u);
  ASSERT_EQ(st.missing.size(), 2u);
  EXPECT_EQ(st.missing[0].rfind("Debian package descriptions: ", 0), 0u) << st.missing[0];
  EXPECT_EQ(st.missing[1], "one gettext catalog: cannot read " + broken +
                               ": expected a regular file, found a directory");
}
