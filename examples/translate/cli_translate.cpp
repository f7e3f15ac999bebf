#include "cli_translate.hpp"

#include <algorithm>
#include <cerrno>
#include <iostream>
#include <string>
#include <vector>

#include <attn/error.hpp>

#include "cli_common.hpp"
#include "corpus_io.hpp"
#include "text.hpp"

namespace attn::translate {

namespace {

// stdin holds at most what one input file may: kMaxTextFileBytes of text.
std::vector<std::string> read_input(const std::string& path) {
  if (path != "-") return read_lines(path);
  std::vector<std::string> lines;
  std::size_t total = 0;
  for (std::string line;
       read_line(std::cin, line, kMaxTextFileBytes - total, "<stdin>", lines.size() + 1,
                 " (the rest of the 1 GiB an input may hold)");) {
    total = std::min(kMaxTextFileBytes, total + line.size() + 1);
    ATTN_CHECK(lines.size() < kMaxTextFileLines, FormatError, "<stdin> has more than ",
               kMaxTextFileLines, " lines, the limit of one text input");
    check_utf8_line(line, "<stdin>", lines.size() + 1);
    lines.push_back(std::move(line));
  }
  return lines;
}

// `text`: the translations, each followed by '\n'.
void write_output(const std::string& path, const std::string& text) {
  if (path != "-") return write_text(path, text);
  errno = 0;
  std::cout << text;
  check_stdout("the translations");
}

// Interactive: each line is answered as soon as it is read.
void translate_stream(const TranslateCommand& c) {
  Translator translator(c.model_dir);
  // A line is read no further than translate() takes it.
  const auto max_bytes = static_cast<std::size_t>(kMaxBytesPerToken * translator.max_len());
  const std::string why =
      detail::concat(" (", kMaxBytesPerToken, " per subword token of the model's max_len ",
                     translator.max_len(), "); it is refused unread");
  std::size_t n = 0;
  for (std::string line; read_line(std::cin, line, max_bytes, "<stdin>", n + 1, why);) {
    const std::string out = translator.translate({line}, c.decode, "<stdin>", ++n)[0];
    errno = 0;
    std::cout << out << '\n';
    check_stdout("the translation of line " + std::to_string(n));
  }
}

}  // namespace

CLI::App* add_translate(CLI::App& app, TranslateCommand& c, int& threads) {
  CLI::App* translate = app.add_subcommand("translate", "translate lines with a trained model");
  add_threads(translate, threads);
  translate->add_option("--model-dir", c.model_dir, "trained model directory")->required();
  translate->add_option("--input", c.input, "input file, - for stdin")->capture_default_str();
  translate->add_option("--output", c.output, "output file, - for stdout")->capture_default_str();
  add_decode_flags(translate, c.decode);
  return translate;
}

int run_translate(const TranslateCommand& c) {
  if (c.input == "-" && c.output == "-") {
    translate_stream(c);
    return 0;
  }
  // Input first: a bad input file is reported without waiting for the model to load.
  const std::vector<std::string> lines = read_input(c.input);
  Translator translator(c.model_dir);
  // Joined as they come, a chunk at a time (translate_each): a std::string per output line took
  // 32 bytes besides its text, and with the subword ids of every line at once, 6.6 GB for the
  // 60 MB of a file of empty lines.
  std::string text;
  translator.translate_each(lines, c.decode, c.input == "-" ? "<stdin>" : "'" + c.input + "'",
                            [&](std::string&& line) {
                              text += line;
                              text += '\n';
                            });
  write_output(c.output, text);
  return 0;
}

}  // namespace attn::translate
