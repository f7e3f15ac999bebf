// Corpus BLEU and the 13a tokenizer against hand computations. The tokenizer expectations were
// produced by sacreBLEU's own regular expressions (tokenizers/tokenizer_re.py) run in Python.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cmath>
#include <cstdint>

#include <attn/error.hpp>

#include "bleu.hpp"

using namespace attn::translate;

TEST(Tokenize13a, MatchesSacreBleuRegexes) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"Hello, world!", "Hello , world !"},
      {"It costs $3.50, ok.", "It costs $ 3.50 , ok ."},
      {"1990-2000 well-known", "1990 - 2000 well-known"},
      {"&quot;Yes&quot; &amp; &lt;b&gt;", "\" Yes \" & < b >"},
      {"<skipped>end-\nof line\nnext", "endof line next"},
      {"don't stop", "don't stop"},
      {"a.b,c", "a . b , c"},
      {"3.14, 2,000.", "3.14 , 2,000 ."},
      {"5..5,,x", "5 . . 5 , , x"},
      {"Gr\xc3\xb6\xc3\x9f"
       "e: 3-4 m.",
       "Gr\xc3\xb6\xc3\x9f"
       "e : 3 - 4 m ."},
      {"a.,b.c,.d", "a . , b . c , . d"},
      {"(x)[y]{z}|~^_`@?=;:*+#%/\\", "( x ) [ y ] { z } | ~ ^ _ ` @ ? = ; : * + # % / \\"},
      {"  spaced\xc2\xa0out\t", "spaced out"},
  };
  for (const auto& [in, expected] : cases) EXPECT_EQ(tokenize_13a(in), expected) << in;
}

TEST(Bleu, Lowercase) {
  EXPECT_EQ(lowercase_utf8("\xc3\x84pfel \xc3\x9c"
                           "BER Stra\xe1\xba\x9e"
                           "E \xd0\x9c\xce\xa3 \xc5\x81\xc4\x84"),
            "\xc3\xa4pfel \xc3\xbc"
            "ber stra\xc3\x9f"
            "e \xd0\xbc\xcf\x83 \xc5\x82\xc4\x85");
}

// Bytes that start no UTF-8 sequence (0x80..0xC1, a sequence cut short) are kept as they are.
TEST(Bleu, LowercaseKeepsBytesThatAreNotUtf8) {
  EXPECT_EQ(lowercase_utf8("A\x80\xc1\xbf"
                           "B\xc3\x84\xc3"),
            "a\x80\xc1\xbf"
            "b\xc3\xa4\xc3");
}

TEST(Bleu, PerfectMatchIs100) {
  const BleuScore s = corpus_bleu({"The cat sat on the mat."}, {"The cat sat on the mat."});
  EXPECT_DOUBLE_EQ(s.score, 100.0);
  EXPECT_EQ(s.hyp_len, 7);  // "The cat sat on the mat ."
  EXPECT_EQ(s.str(),
            "BLEU = 100.00 100.0/100.0/100.0/100.0 (BP = 1.000 ratio = 1.000 hyp_len = 7 ref_len = "
            "7)");
}

TEST(Bleu, NoHigherOrderMatchUsesExpSmoothing) {
  // hyp "the cat the dog", ref "the dog the cat":
  //   1-grams 4/4; 2-grams {the cat, cat the, the dog} vs ref {the dog, dog the, the cat}: 2/3;
  //   3-grams 0/2; 4-grams 0/1.
  // exp smoothing: order 3 is the first zero -> 100 / (2 * 2) = 25; order 4 -> 100 / (4 * 1) = 25.
  // BLEU = (100 * 66.667 * 25 * 25)^(1/4) = 4166666.67^(1/4) = 45.1801...
  const BleuScore s = corpus_bleu({"the cat the dog"}, {"the dog the cat"});
  EXPECT_DOUBLE_EQ(s.counts[1], 2);
  EXPECT_DOUBLE_EQ(s.totals[1], 3);
  EXPECT_DOUBLE_EQ(s.precisions[2], 25.0);
  EXPECT_DOUBLE_EQ(s.precisions[3], 25.0);
  EXPECT_NEAR(s.score, std::pow(100.0 * 200.0 / 3.0 * 625.0, 0.25), 1e-9);
  EXPECT_NEAR(s.score, 45.18010018, 1e-7);
  // Without smoothing a zero precision floors the log at -9999999999: the score is 0.
  BleuOptions none;
  none.smooth = BleuSmoothing::kNone;
  EXPECT_EQ(corpus_bleu({"the cat the dog"}, {"the dog the cat"}, none).score, 0.0);
  // floor: 0.1 / total -> p3 = 5, p4 = 10; (100 * 66.667 * 5 * 10)^(1/4)
  BleuOptions floor;
  floor.smooth = BleuSmoothing::kFloor;
  EXPECT_NEAR(corpus_bleu({"the cat the dog"}, {"the dog the cat"}, floor).score,
              std::pow(100.0 * 200.0 / 3.0 * 50.0, 0.25), 1e-9);
}

TEST(Bleu, NothingMatchesIsZero) {
  const BleuScore s = corpus_bleu({"alpha beta"}, {"gamma delta"});
  EXPECT_EQ(s.score, 0.0);
  EXPECT_EQ(s.precisions[0], 0.0);
  EXPECT_EQ(s.bp, 1.0);
}

TEST(Bleu, BrevityPenalty) {
  // c = 5, r = 6, every n-gram matches: BLEU = 100 * exp(1 - 6/5) = 81.8730753...
  const BleuScore s = corpus_bleu({"the cat sat on the"}, {"the cat sat on the mat"});
  EXPECT_NEAR(s.bp, std::exp(-0.2), 1e-15);
  EXPECT_NEAR(s.score, 81.87307530779819, 1e-9);
  EXPECT_NEAR(s.ratio, 5.0 / 6.0, 1e-15);
  // A 2-token hypothesis has no 3-grams: the loop stops, orders 3 and 4 keep precision 0.
  const BleuScore short_hyp = corpus_bleu({"the cat"}, {"the cat sat"});
  EXPECT_NEAR(short_hyp.score, 0.0, 1e-12);
  EXPECT_NEAR(short_hyp.bp, std::exp(1.0 - 3.0 / 2.0), 1e-15);
}

TEST(Bleu, TwoSentenceCorpus) {
  // Sentence 1 as in NoHigherOrderMatch: correct (4, 2, 0, 0), totals (4, 3, 2, 1), c = r = 4.
  // Sentence 2 "a b c d e" vs "a b c d e f g": correct = totals = (5, 4, 3, 2), c = 5, r = 7.
  // Corpus: correct (9, 6, 3, 2), totals (9, 7, 5, 3), c = 9, r = 11 -> no order is zero:
  //   p = (100, 85.714, 60, 66.667), BP = exp(1 - 11/9) = 0.800737,
  //   BLEU = 0.800737 * (100 * 85.714 * 60 * 66.667)^(1/4) = 61.2729
  const BleuScore s =
      corpus_bleu({"the cat the dog", "a b c d e"}, {"the dog the cat", "a b c d e f g"});
  EXPECT_EQ(s.hyp_len, 9);
  EXPECT_EQ(s.ref_len, 11);
  EXPECT_DOUBLE_EQ(s.counts[2], 3);
  EXPECT_DOUBLE_EQ(s.totals[2], 5);
  EXPECT_NEAR(s.precisions[1], 600.0 / 7.0, 1e-12);
  const double expected =
      std::exp(1.0 - 11.0 / 9.0) * std::pow(100.0 * (600.0 / 7.0) * 60.0 * (200.0 / 3.0), 0.25);
  EXPECT_NEAR(s.score, expected, 1e-9);
  EXPECT_NEAR(s.score, 61.27289716548227, 1e-9);
  EXPECT_EQ(
      s.str(),
      "BLEU = 61.27 100.0/85.7/60.0/66.7 (BP = 0.801 ratio = 0.818 hyp_len = 9 ref_len = 11)");
}

TEST(Bleu, ClippedCountsAndTokenizerChoice) {
  // "the the the" vs "the cat": unigram matches clip to 1 of 3.
  const BleuScore s = corpus_bleu({"the the the"}, {"the cat"});
  EXPECT_DOUBLE_EQ(s.counts[0], 1);
  EXPECT_DOUBLE_EQ(s.totals[0], 3);
  // 13a splits "mat." into two tokens, 'none' does not.
  BleuOptions none;
  none.tokenize = BleuTokenizer::kNone;
  EXPECT_DOUBLE_EQ(corpus_bleu({"on the mat."}, {"on the mat ."}).score, 100.0);
  EXPECT_LT(corpus_bleu({"on the mat."}, {"on the mat ."}, none).score, 100.0);
  BleuOptions lc;
  lc.lowercase = true;
  EXPECT_DOUBLE_EQ(corpus_bleu({"The Cat sat down"}, {"the cat sat down"}, lc).score, 100.0);
  EXPECT_LT(corpus_bleu({"The Cat sat down"}, {"the cat sat down"}).score, 100.0);
}

TEST(Bleu, MismatchedCountsThrow) {
  try {
    corpus_bleu({"a", "b"}, {"a"});
    FAIL() << "expected DataError";
  } catch (const attn::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("got 2 hypotheses and 1 references"), std::string::npos)
        << e.what();
  }
}

// Sanitizers own the allocator and add shadow memory: the memory test skips under them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define BLEU_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define BLEU_TEST_SANITIZED 1
#endif
#endif

namespace {

// Peak resident memory of this process so far, in bytes (Linux reports ru_maxrss in KiB).
std::int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::int64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace

TEST(Bleu, LongLineOfSymbolsTakesMemoryInProportion) {
#if !defined(__linux__) || defined(BLEU_TEST_SANITIZED)
  GTEST_SKIP() << "needs Linux's ru_maxrss and the plain allocator";
#endif
  // A 4 MiB hypothesis of '|' is 4 Mi tokens after 13a. Four growing copies of the line and a
  // std::string per token and per n-gram once took 57 times the line (2.87 GB for 50 MB).
  const std::int64_t kBytes = std::int64_t{4} << 20;
  const std::string line(static_cast<std::size_t>(kBytes), '|');
  const std::int64_t before = peak_rss_bytes();
  const BleuScore s = corpus_bleu({line}, {"a | b"});
  const std::int64_t growth = peak_rss_bytes() - before;
  EXPECT_EQ(s.hyp_len, kBytes);
  EXPECT_EQ(s.ref_len, 3);
  EXPECT_DOUBLE_EQ(s.counts[0], 1);  // clipped to the reference's one '|'
  EXPECT_DOUBLE_EQ(s.counts[1], 0);
  EXPECT_DOUBLE_EQ(s.totals[3], static_cast<double>(kBytes - 3));
  EXPECT_LT(growth, 16 * kBytes) << "scoring a " << kBytes << "-byte line took " << growth
                                 << " bytes more than the peak before it";
}
