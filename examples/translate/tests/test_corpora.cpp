// The built-in corpus's readers on hand-made records (Debian package descriptions, the
// trans-de-en dictionary), its assembly into disjoint, deterministic splits, and the trainer's
// progress output.
#include <gtest/gtest.h>
#include <lz4frame.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>
#include <sstream>

#include <attn/error.hpp>

#include "error_helpers.hpp"
#include "temp_paths.hpp"

#include "builtin_corpus.hpp"
#include "debian_descriptions.hpp"
#include "dictionary_corpus.hpp"
#include "gettext_corpus.hpp"  // count_words
#include "progress.hpp"

namespace fs = std::filesystem;
using namespace attn::translate;
using attn::testing::error_of;
using attn::translate::testing::temp_dir;
using attn::translate::testing::unreadable_paths;
using attn::translate::testing::write_file;

namespace {

const std::string kMd5a = "0123456789abcdef0123456789abcdef";
const std::string kMd5b = "fedcba9876543210fedcba9876543210";

std::string lz4_frame(const std::string& text) {
  std::string out(LZ4F_compressFrameBound(text.size(), nullptr), '\0');
  const std::size_t n =
      LZ4F_compressFrame(out.data(), out.size(), text.data(), text.size(), nullptr);
  EXPECT_FALSE(LZ4F_isError(n));
  out.resize(n);
  return out;
}

std::string record(const std::string& md5, const std::string& lang, const std::string& text) {
  return "Package: p" + md5.substr(0, 4) + "\nDescription-md5: " + md5 + "\nDescription-" + lang +
         ": " + text + "\n\n";
}

const std::string kEnglish =
    record(kMd5a, "en",
           "Puzzle game\n The game is fun. It runs on X11.\n .\n Two players can play.") +
    record(kMd5b, "en", "Text editor\n First paragraph.\n .\n Second paragraph.");
const std::string kGerman =
    record(kMd5a, "de",
           "Puzzlespiel\n Das Spiel macht Spa\xc3\x9f. Es l\xc3\xa4uft unter X11.\n .\n Zwei "
           "Spieler k\xc3\xb6nnen spielen.") +
    record(kMd5b, "de", "Texteditor\n Nur ein Absatz.");  // paragraph counts differ

}  // namespace

// ------------------------------------------------------------------ Debian package descriptions

TEST(DebianDescriptions, ParsesRecordsParagraphsAndListItems) {
  DebianDescriptionStats st;
  const auto d = parse_translation_records(
      record(kMd5a, "en", "Short\n First line\n second line.\n .\n * item one\n * item two"), "en",
      &st);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].md5, kMd5a);
  EXPECT_EQ(d[0].short_text, "Short");
  EXPECT_EQ(d[0].paragraphs,
            (std::vector<std::string>{"First line second line.", "* item one", "* item two"}));
  EXPECT_EQ(st.records, 1u);
  EXPECT_EQ(st.malformed, 0u);
}

TEST(DebianDescriptions, MalformedRecordsAreSkippedAndCounted) {
  const std::string text =
      record("not-an-md5", "en", "Bad md5") + "Package: x\nDescription-en: no md5 field\n\n" +
      "Package: y\nthis line is no field\nDescription-md5: " + kMd5a +
      "\nDescription-en: broken\n\n" + record(kMd5b, "en", "Bad \xc3\x28 UTF-8") +
      "Package: z\nDescription-md5: " + kMd5a + "\n\n" +  // no description
      record(kMd5a, "en", "Good one");
  DebianDescriptionStats st;
  const auto d = parse_translation_records(text, "en", &st);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].short_text, "Good one");
  EXPECT_EQ(st.records, 6u);
  EXPECT_EQ(st.malformed, 5u);
  EXPECT_EQ(st.invalid_utf8, 1u);
  // The other language's field is not a description of this one.
  EXPECT_TRUE(parse_translation_records(record(kMd5a, "de", "Kurz"), "en").empty());
}

TEST(DebianDescriptions, EmptyTextGivesNothing) {
  DebianDescriptionStats st;
  EXPECT_TRUE(parse_translation_records("", "en", &st).empty());
  EXPECT_TRUE(parse_translation_records("\n\n\n", "de", &st).empty());
  EXPECT_EQ(st.records, 0u);
}

TEST(DebianDescriptions, SentenceSplitKeepsAbbreviations) {
  EXPECT_EQ(split_sentences("It is fast. It is small! Is it? Yes."),
            (std::vector<std::string>{"It is fast.", "It is small!", "Is it?", "Yes."}));
  EXPECT_EQ(split_sentences("Tools, e.g. Vim. Editors etc. Are here."),
            (std::vector<std::string>{"Tools, e.g. Vim.", "Editors etc. Are here."}));
  EXPECT_EQ(split_sentences("Programme, z. B. Vim. \xc3\x9c"
                            "ber 3 Dinge."),
            (std::vector<std::string>{"Programme, z. B. Vim.",
                                      "\xc3\x9c"
                                      "ber 3 Dinge."}));
  EXPECT_EQ(split_sentences("version 1.2 is out. lower case follows."),
            (std::vector<std::string>{"version 1.2 is out. lower case follows."}));
}

TEST(DebianDescriptions, PairsByMd5ThenParagraphThenSentence) {
  DebianDescriptionStats st;
  const auto en = parse_translation_records(kEnglish, "en", &st);
  const auto de = parse_translation_records(
      kGerman + record("00000000000000000000000000000000", "de", "Ohne Original"), "de", &st);
  const ParallelCorpus c = pair_descriptions(en, de, {}, &st);
  const std::vector<std::string> src = {"Puzzle game", "The game is fun.", "It runs on X11.",
                                        "Two players can play.", "Text editor"};
  EXPECT_EQ(c.src, src);
  EXPECT_EQ(c.tgt[1], "Das Spiel macht Spa\xc3\x9f.");
  EXPECT_EQ(c.tgt[3], "Zwei Spieler k\xc3\xb6nnen spielen.");
  EXPECT_EQ(c.tgt[4], "Texteditor");
  EXPECT_EQ(st.matched, 2u);
  EXPECT_EQ(st.unmatched, 1u);
  EXPECT_EQ(st.paragraphs_misaligned, 1u);
}

TEST(DebianDescriptions, MisalignedSentencesKeepTheShortParagraphWhole) {
  const auto en = parse_translation_records(record(kMd5a, "en", "S\n One. Two."), "en");
  const auto de = parse_translation_records(record(kMd5a, "de", "K\n Eins und zwei."), "de");
  DebianDescriptionStats st;
  DebianDescriptionOptions o;
  ParallelCorpus c = pair_descriptions(en, de, o, &st);
  EXPECT_EQ(st.sentences_misaligned, 1u);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c.src[1], "One. Two.");
  EXPECT_EQ(c.tgt[1], "Eins und zwei.");
  o.max_chars = 8;  // the paragraph is too long to keep whole
  c = pair_descriptions(en, de, o);
  EXPECT_EQ(c.size(), 1u);
}

TEST(DebianDescriptions, EqualSentenceCountsWithDisagreeingLengthsAreMisaligned) {
  // Both sides have two sentences, but the German joined the English first two and added one.
  const auto en = parse_translation_records(
      record(kMd5a, "en", "S\n It is a compiler. It uses the gcc backend to generate code."), "en");
  const auto de = parse_translation_records(
      record(kMd5a, "de",
             "K\n Dies ist ein Compiler, der das gcc-Backend verwendet, um Code zu erzeugen. "
             "Er ist frei."),
      "de");
  DebianDescriptionStats st;
  const ParallelCorpus c = pair_descriptions(en, de, {}, &st);
  EXPECT_EQ(st.sentences_misaligned, 1u);
  // Kept whole (short enough, and the paragraphs' lengths agree), never sentence by sentence.
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c.src[1], "It is a compiler. It uses the gcc backend to generate code.");
}

TEST(DebianDescriptions, ListMarkersUrlsAndDisagreeingLengths) {
  const auto en = parse_translation_records(
      record(kMd5a, "en",
             "data files for karchive\n * fast startup\n .\n See http://example.org/ for more.\n "
             ".\n - small"),
      "en");
  const auto de = parse_translation_records(
      record(kMd5a, "de",
             "Qt-5-Addon f\xc3\xbcr den Zugriff auf zahlreiche Arten von Archiven - Datendateien\n "
             "* schneller Start\n .\n Siehe http://example.org/ f\xc3\xbcr mehr.\n .\n - klein"),
      "de");
  DebianDescriptionStats st;
  const ParallelCorpus c = pair_descriptions(en, de, {}, &st);
  EXPECT_EQ(c.src, (std::vector<std::string>{"fast startup", "small"}));
  EXPECT_EQ(c.tgt, (std::vector<std::string>{"schneller Start", "klein"}));
  EXPECT_EQ(st.dropped_ratio, 1u);  // the short description: 23 against 72 code points
  EXPECT_EQ(st.dropped_urls, 1u);
  DebianDescriptionOptions o;
  o.max_length_ratio = 4;  // loose enough for the short description
  EXPECT_EQ(pair_descriptions(en, de, o).src.front(), "data files for karchive");
}

TEST(DebianDescriptions, Lz4FramesAndTheirCorruption) {
  const std::string text = kEnglish + kEnglish;
  const std::string frame = lz4_frame(text);
  EXPECT_EQ(lz4_decompress_if_framed(frame, "f", 1 << 20), text);
  EXPECT_EQ(lz4_decompress_if_framed(text, "plain", 1 << 20), text);  // not a frame: as is
  EXPECT_EQ(error_of<attn::FormatError>(
                [&] { lz4_decompress_if_framed(frame.substr(0, frame.size() - 5), "f", 1 << 20); }),
            "'f': truncated lz4 frame (" + std::to_string(frame.size() - 5) +
                " bytes read, the frame expects more)");
  EXPECT_NE(error_of<attn::FormatError>([&] {
              lz4_decompress_if_framed(frame, "f", 100);
            }).find("'f' inflates to more than 100 bytes"),
            std::string::npos);
  std::string bad = frame;
  bad[4] = static_cast<char>(0xFF);  // frame descriptor flags: version bits wrong
  EXPECT_NE(error_of<attn::FormatError>([&] {
              lz4_decompress_if_framed(bad, "f", 1 << 20);
            }).find("'f': corrupt lz4 frame at byte 0"),
            std::string::npos);
}

TEST(DebianDescriptions, LoadsAptListsAndNamesWhatIsMissing) {
  const fs::path dir = temp_dir("apt_lists");
  DebianDescriptionOptions o;
  o.directory = dir.string();
  EXPECT_NE(error_of<attn::IOError>([&] {
              load_debian_descriptions(o);
            }).find("apt-get update -o Acquire::Languages=de,en"),
            std::string::npos);
  write_file(dir / "host_debian_dists_x_main_i18n_Translation-en.lz4", lz4_frame(kEnglish));
  write_file(dir / "host_debian_dists_x_main_i18n_Translation-de", kGerman);  // plain text
  write_file(dir / "host_debian_dists_x_main_i18n_Translation-fr", "ignored");
  DebianDescriptionStats st;
  const ParallelCorpus c = load_debian_descriptions(o, &st);
  EXPECT_EQ(st.files, 2u);
  EXPECT_EQ(c.size(), 5u);
  write_file(dir / "host_debian_dists_x_main_i18n_Translation-de", "");  // empty file
  EXPECT_EQ(load_debian_descriptions(o).size(), 0u);
}

// ------------------------------------------------------------------------- trans-de-en dictionary

TEST(Dictionary, StripsEveryAnnotationKind) {
  std::string out;
  ASSERT_TRUE(strip_dictionary_annotations("Haus {n} [archit.] <Hause> /HS/ (alt)", out));
  EXPECT_EQ(out, "Haus");
  ASSERT_TRUE(strip_dictionary_annotations("and/or 1/2 and /x y/", out));
  EXPECT_EQ(out, "and/or 1/2 and /x y/");  // slashes that are no /ABBR/ stay
  EXPECT_FALSE(strip_dictionary_annotations("open {m", out));
  EXPECT_FALSE(strip_dictionary_annotations("closed ]", out));
}

TEST(Dictionary, KindsOfPairs) {
  EXPECT_EQ(classify_dictionary_pair("The cat sleeps.",
                                     "Die Katze schl\xc3\xa4"
                                     "ft."),
            DictKind::kSentence);
  EXPECT_EQ(classify_dictionary_pair("to knife through sth.", "etw. durchschneiden"),
            DictKind::kPattern);
  EXPECT_EQ(classify_dictionary_pair("bio…", "Bio…"), DictKind::kPattern);
  EXPECT_EQ(classify_dictionary_pair("tea trolley", "kleiner Teewagen"), DictKind::kPhrase);
  EXPECT_EQ(classify_dictionary_pair("tea trolley", "Teewagen"), DictKind::kWord);
  EXPECT_EQ(classify_dictionary_pair("something good", "etwas Gutes"), DictKind::kPhrase);
}

TEST(Dictionary, AlignsSubEntriesAndCountsWhatItSkips) {
  const std::string text =
      "# comment :: line\n"
      "Teewagen {m} | Teewagen {pl} :: tea trolley | tea trolleys\n"
      "Schund {m}; Kitsch {m} :: tripe; rubbish\n"
      "scheinbar {adv} | Das ist nur scheinbar paradox. :: seemingly | This is only seemingly "
      "a paradox.\n"
      "eins | zwei :: one\n"     // misaligned
      "ohne Trenner\n"           // malformed: no " :: "
      "a :: b :: c\n"            // malformed: two
      "Haus {n :: house\n"       // malformed: open bracket
      "kaputt \xff :: broken\n"  // invalid UTF-8
      "{n} :: [Br.]\n"           // empty after stripping
      "\n";
  DictionaryStats st;
  const auto pairs = parse_dictionary(text, &st);
  ASSERT_EQ(pairs.size(), 5u);
  EXPECT_EQ(pairs[0].de, "Teewagen");
  EXPECT_EQ(pairs[0].en, "tea trolley");
  EXPECT_EQ(pairs[1].en, "tea trolleys");
  EXPECT_EQ(pairs[2].de, "Schund");  // first synonym of each side
  EXPECT_EQ(pairs[2].en, "tripe");
  EXPECT_EQ(pairs[4].en, "This is only seemingly a paradox.");
  EXPECT_EQ(pairs[4].de, "Das ist nur scheinbar paradox.");
  EXPECT_EQ(pairs[4].kind, DictKind::kSentence);
  EXPECT_EQ(st.lines, 9u);
  EXPECT_EQ(st.misaligned, 1u);
  EXPECT_EQ(st.malformed, 3u);
  EXPECT_EQ(st.invalid_utf8, 1u);
  EXPECT_EQ(st.empty, 1u);
  EXPECT_EQ(st.by_kind[static_cast<int>(DictKind::kSentence)], 1u);
  EXPECT_TRUE(parse_dictionary("").empty());
}

TEST(Dictionary, MissingFileNamesThePackage) {
  const std::string path = (temp_dir("dict") / "de-en").string();
  EXPECT_NE(error_of<attn::IOError>([&] { load_dictionary(path); }).find("trans-de-en"),
            std::string::npos);
  write_file(path, "");
  EXPECT_TRUE(load_dictionary(path).empty());
}

TEST(Dictionary, OnlyARegularFileWithinTheCapIsRead) {
  // A directory gave 0 pairs without an error (the failure was left in an unchecked stream), and
  // /dev/zero was read until std::bad_alloc, which the stream swallowed: 0 pairs again.
  for (const auto& [path, why] : unreadable_paths(temp_dir("dict_files"), kMaxDictionaryBytes)) {
    const std::string& file = path;  // C++17 lambdas cannot capture a structured binding
    const std::string error = error_of<attn::IOError>([&] { load_dictionary(file); });
    EXPECT_NE(error.find("trans-de-en): cannot read " + path + ": " + why), std::string::npos)
        << error;
  }
}

// ---------------------------------------------------------------------------- built-in corpus

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

TEST(BuiltinCorpus, UnreadableFilesLeaveTheirSourceOutWithANote) {
  // A directory named x.mo threw std::ios_base::failure past the catch that leaves a source out,
  // and ended the run; a directory as the dictionary was read as 0 pairs without a note.
  const fs::path dir = temp_dir("builtin_unreadable");
  BuiltinCorpusOptions o = small_options();
  o.apt_lists_dir = (dir / "no_lists").string();
  o.gettext = true;
  o.gettext_dir = (dir / "locale").string();
  const std::string catalog = (dir / "locale" / "x.mo").string();
  fs::create_directories(catalog);
  o.dictionary_path = (dir / "de-en").string();
  write_file(o.dictionary_path, sentence_dictionary(40));
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

// ----------------------------------------------------------------------------------- progress

TEST(Progress, PlainLinesWhenNotATerminal) {
  std::ostringstream out;
  ProgressLine p(out, false);
  p.status("step 1 | loss 9");
  p.line("step 2 | loss 8");
  p.status("step 3 | loss 7");
  p.line("valid step 3");
  p.finish();
  EXPECT_EQ(out.str(), "step 2 | loss 8\nvalid step 3\n");
  EXPECT_EQ(out.str().find_first_of("\r\033"), std::string::npos);
}

TEST(Progress, RedrawsInPlaceOnATerminal) {
  std::ostringstream out;
  ProgressLine p(out, true);
  p.status("step 1");
  p.line("valid");
  p.status("step 2");
  p.finish();
  EXPECT_EQ(out.str(), "\rstep 1\033[K\r\033[Kvalid\n\rstep 2\033[K\n");
}
