// The built-in corpus's readers on hand-made records: Debian package descriptions and the
// trans-de-en dictionary. Their assembly into one corpus is tested in test_builtin_corpus.cpp.
#include <gtest/gtest.h>
#include <lz4frame.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include <attn/error.hpp>

#include "error_helpers.hpp"
#include "temp_paths.hpp"

#include "debian_descriptions.hpp"
#include "dictionary_corpus.hpp"
#include "text.hpp"

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
      // A lead byte before a space, in the short and in the long text: normalize_spaces took
      // "\xc2 " for U+00A0 and dropped it, and the ill-formed record passed.
      record(kMd5b, "en", "Lead \xc2 byte") + record(kMd5b, "en", "Short\n Long \xc2 line") +
      record(kMd5a, "en", "Good one");
  DebianDescriptionStats st;
  const auto d = parse_translation_records(text, "en", &st);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].short_text, "Good one");
  EXPECT_EQ(st.records, 8u);
  EXPECT_EQ(st.malformed, 7u);
  EXPECT_EQ(st.invalid_utf8, 3u);
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
  // Read as any untrusted file (train/regular_file.hpp): its size was taken from the path and the
  // file opened after, so a FIFO put there in between would have hung the reader.
  const fs::path de = dir / "host_debian_dists_x_main_i18n_Translation-de";
  fs::remove(de);
  ASSERT_EQ(::mkfifo(de.c_str(), 0644), 0);
  EXPECT_NE(error_of<attn::IOError>([&] {
              load_debian_descriptions(o);
            }).find("cannot read " + de.string() + ": expected a regular file, found a FIFO"),
            std::string::npos);
  fs::remove(de);
  o.max_file_bytes = kEnglish.size() + 100;  // the English file inflates within it
  write_file(de, kGerman + std::string(o.max_file_bytes, '\n'));
  EXPECT_NE(error_of<attn::IOError>([&] {
              load_debian_descriptions(o);
            }).find("more than the " + std::to_string(o.max_file_bytes) + " this reader accepts"),
            std::string::npos);
  // Many files, each within its limit, are held to one limit together: the English file and
  // copies of the German one, with room for two and a half of them.
  write_file(de, kGerman);
  o.max_file_bytes = std::size_t{1} << 30;
  o.max_total_bytes = kEnglish.size() + 2 * kGerman.size() + kGerman.size() / 2;
  for (const char* copy : {"a", "b", "c"})
    write_file(dir / (std::string("host_debian_dists_") + copy + "_main_i18n_Translation-de"),
               kGerman);
  const std::string message = error_of<attn::FormatError>([&] { load_debian_descriptions(o); });
  EXPECT_NE(message.find("hold more than " + std::to_string(o.max_total_bytes) +
                         " bytes together, the most that are read"),
            std::string::npos)
      << message;
  o.max_total_bytes = kEnglish.size() + 4 * kGerman.size();  // room for all four, exactly
  EXPECT_EQ(load_debian_descriptions(o).size(), 5u);
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
