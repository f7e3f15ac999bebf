// Bad input to the attn-translate binary: training data, gettext catalogs, translate's input and
// evaluate's files. Each ends the process with exit code 1, one line "attn-translate: error: ..."
// naming what was expected and what came, and nothing written. The Cli fixture is in
// translate_fixture.hpp.
#include <gtest/gtest.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "corpus_io.hpp"
#include "translate_fixture.hpp"
#include "translator.hpp"

using namespace attn::translate::testing;

// The final report translates the test set with the saved model, which refuses a line longer than
// its max_len: that used to end a finished training run with an error.
TEST_F(Cli, ATestLineLongerThanMaxLenIsNamedBeforeTraining) {
  tr::CorpusSplit d = split();
  for (int i = 0; i < 40; ++i) d.test.src[1] += " green house";
  std::string data =
      " --threads 1 --preset tiny --vocab-size 60 --max-tokens 128 --max-len 32 --steps 2 "
      "--checkpoint-every 1 --svg 0";
  for (const auto& [name, corpus] :
       {std::pair<std::string, const tr::ParallelCorpus*>{"", &d.train}, {"test-", &d.test}}) {
    tr::write_lines(path(name + "src"), corpus->src);
    tr::write_lines(path(name + "tgt"), corpus->tgt);
    data += " --" + name + "src " + path(name + "src") + " --" + name + "tgt " + path(name + "tgt");
  }
  const std::string model = path("model");
  expect_error(run("train --model-dir " + model + data),
               {"test line 2 has ", " subword tokens, more than the model's max_len 32"});
  EXPECT_FALSE(fs::exists(model + "/checkpoint_1.safetensors"));
  const CliResult r = run("train --model-dir " + path("timed") + data + " --no-eval");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(Cli, BadTrainingDataIsRefusedAndNothingIsWritten) {
  const std::string model = path("model"), good_en = path("good.en"), good_de = path("good.de");
  write_file(good_en, "one\ntwo\nthree\n");
  write_file(good_de, "eins\nzwei\ndrei\n");
  auto train = [&](const std::string& src, const std::string& tgt) {
    return run("train --threads 1 --model-dir " + model + " --src " + src + " --tgt " + tgt +
               " --steps 1");
  };

  const std::string missing = path("missing.en");
  expect_error(train(missing, good_de), {"cannot open '" + missing + "' for reading"});

  const std::string directory = path("a_directory");
  fs::create_directories(directory);
  expect_error(train(good_en, directory), {"cannot read '" + directory + "'"});

  const std::string two = path("two.de");
  write_file(two, "eins\nzwei\n");
  expect_error(train(good_en, two), {"parallel files must have the same number of lines",
                                     "'" + good_en + "' has 3", "'" + two + "' has 2"});

  const std::string empty = path("empty.de");
  write_file(empty, "eins\n \ndrei\n");
  expect_error(train(good_en, empty),
               {"'" + empty + "' line 2: expected a sentence, found an empty line"});

  const std::string bad = path("bad.en");
  write_file(bad,
             "one\ntwo\nthr\xe9"
             "e\n");  // Latin-1, not UTF-8
  expect_error(train(bad, good_de),
               {"'" + bad +
                "' line 3: expected UTF-8 text, found an invalid byte sequence at "
                "byte offset 3 of the line (byte 0xe9)"});

  expect_error(run("train --threads 1 --model-dir " + model + " --src " + good_en),
               {"--src and --tgt go together"});
  // Validation or test sets given but empty: refused, not skipped.
  const std::string nothing = path("nothing.txt");
  write_file(nothing, "");
  for (const std::string set : {"valid", "test"})
    expect_error(
        run("train --threads 1 --model-dir " + model + " --src " + good_en + " --tgt " + good_de +
            " --steps 1 --" + set + "-src " + nothing + " --" + set + "-tgt " + nothing),
        {"--" + set + "-src/--" + set + "-tgt '" + nothing + "' and '" + nothing +
         "' hold no sentence pair: nothing to score"});
  EXPECT_FALSE(fs::exists(model));
}

TEST_F(Cli, CorruptGettextCatalogIsNamed) {
  const std::string model = path("model"), mo = path("mo");
  // The built-in corpus's other sources absent, so that the catalogs are all there is.
  const std::string no_other_sources = " --mix gettext --apt-lists-dir " + path("no_lists") +
                                       " --dictionary " + path("no_dictionary");
  fs::create_directories(mo);
  auto train = [&] {
    return run("train --threads 1 --model-dir " + model + no_other_sources + " --gettext-dir " +
               mo + " --steps 1");
  };
  const std::string file = mo + "/broken.mo";
  write_file(file, "0123456789");
  expect_error(train(), {"'" + file + "': expected a .mo header of 28 bytes, the file has 10"});
  write_file(file, std::string(28, 'X'));
  expect_error(train(),
               {"'" + file + "': not a .mo file: expected magic 0x950412de", "found 0x58585858"});
  // A valid header announcing 5 strings in a file that ends after the header.
  std::string header(28, '\0');
  const unsigned char fields[] = {0xde, 0x12, 0x04, 0x95, 0, 0, 0, 0, 5, 0, 0,  0, 28, 0,
                                  0,    0,    68,   0,    0, 0, 0, 0, 0, 0, 28, 0, 0,  0};
  for (std::size_t i = 0; i < header.size(); ++i) header[i] = static_cast<char>(fields[i]);
  write_file(file, header);
  expect_error(train(), {"'" + file +
                         "': the original table of 5 entries at offset 28 ends at "
                         "byte 68, beyond the end of the file (28 bytes)"});
  EXPECT_FALSE(fs::exists(model));
  expect_error(run("train --threads 1 --model-dir " + model + no_other_sources + " --gettext-dir " +
                   path("none")),
               {"no source of the built-in corpus could be read: ",
                "trans-de-en dictionary: cannot open the dictionary",
                "gettext catalogs: cannot list the gettext catalogs in '" + path("none") + "'"});
}

TEST_F(Cli, BadTranslateInputIsRefusedAndTheOutputKept) {
  const std::string out = path("out.txt");
  write_file(out, "previous results\n");
  auto translate = [&](const std::string& args, const std::string& in = "/dev/null") {
    return run(
        "translate --threads 1 --greedy --model-dir " + model() + " --output " + out + " " + args,
        in);
  };
  const std::string missing = path("missing.txt");
  expect_error(translate("--input " + missing), {"cannot open '" + missing + "' for reading"});

  const std::string bad = path("bad.txt");
  write_file(bad, "the cat\nred \xc3\x28 dog\n");
  expect_error(translate("", bad),
               {"<stdin> line 2: expected UTF-8 text, found an invalid byte sequence at byte "
                "offset 4"});
  expect_error(translate("--input " + bad),
               {"'" + bad +
                "' line 2: expected UTF-8 text, found an invalid byte sequence at "
                "byte offset 4"});

  std::string long_line;
  for (int i = 0; i < 40; ++i) long_line += "house ";
  const std::string too_long = path("long.txt");
  write_file(too_long, "the cat\n\n" + long_line + "\n");
  const std::size_t tokens = tr::Translator(model()).vocab().encode(long_line).size();
  expect_error(translate("--input " + too_long),
               {"'" + too_long + "' line 3 has " + std::to_string(tokens) +
                " subword tokens, more than the model's max_len 32"});
  expect_error(translate("", too_long), {"<stdin> line 3 has " + std::to_string(tokens)});

  // A line of more bytes than max_len tokens can hold is refused unencoded; from an endless pipe
  // the stream mode stops reading it at that length.
  const std::string huge = path("huge.txt");
  write_file(huge, "the cat\n" + std::string(1 << 20, 'a') + "\n");
  expect_error(translate("--input " + huge),
               {"'" + huge +
                "' line 2 has 1048576 bytes, more than the 64 per subword token of "
                "the model's max_len 32"});
  expect_error(run("translate --threads 1 --greedy --model-dir " + model(), "/dev/zero"),
               {"<stdin> line 1 is longer than 2048 bytes (64 per subword token of the model's "
                "max_len 32); it is refused unread"});

  const std::string no_model = path("no_model");
  expect_error(run("translate --model-dir " + no_model),
               {"cannot open " + no_model + "/spm.model: No such file or directory"});
  EXPECT_EQ(read_file(out), "previous results\n");
}

TEST_F(Cli, EvaluateRefusesMisalignedFiles) {
  const std::string src = path("test.en"), ref = path("test.de"), hyp = path("hyp.de");
  write_file(src, "the cat\na dog\nred\n");
  write_file(ref, "die Katze\nein Hund\n");
  write_file(hyp, "Katze\n\nrot\n");  // an empty hypothesis is allowed
  expect_error(run("evaluate --model-dir " + model() + " --src " + src + " --ref " + ref),
               {"'" + src + "' has 3", "'" + ref + "' has 2"});
  expect_error(
      run("evaluate --hyp " + hyp + " --ref " + ref),
      {"expected one reference per hypothesis: '" + hyp + "' has 3 lines, '" + ref + "' has 2"});
  expect_error(run("evaluate --ref " + ref), {"evaluate: give --model-dir and --src (or --hyp)"});
  expect_error(run("evaluate --hyp " + hyp + " --src " + src + " --ref " + ref),
               {"--hyp scores existing translations; it excludes --model-dir and --src"});
}
