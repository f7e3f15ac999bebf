// SVG figures: structure, escaping, and well-formedness checked by xmllint when installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <attn/error.hpp>

#include "svg.hpp"

namespace fs = std::filesystem;
using namespace attn::translate;

namespace {

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1))
    ++n;
  return n;
}

// xmllint is in Debian's libxml2-utils; without it the structural checks below still run.
void expect_well_formed(const std::string& svg, const std::string& name) {
  EXPECT_EQ(svg.rfind("</svg>\n"), svg.size() - 7);
  EXPECT_EQ(count(svg, "<g"), count(svg, "</g>"));
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  if (std::system("command -v xmllint >/dev/null 2>&1") != 0) return;
  const fs::path path =
      fs::temp_directory_path() / ("attn_translate_" + std::to_string(::getpid()) + name);
  write_svg(path.string(), svg);
  EXPECT_EQ(std::system(("xmllint --noout '" + path.string() + "'").c_str()), 0) << svg;
  fs::remove(path);
}

}  // namespace

TEST(Svg, Escape) {
  EXPECT_EQ(xml_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&apos;");
  EXPECT_EQ(xml_escape("\xc3\xa4rger"), "\xc3\xa4rger");
  // What XML 1.0 cannot hold, even as a character reference, becomes U+FFFD; tab, LF, CR stay.
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(xml_escape(std::string("a\x01"
                                   "b\x1f"
                                   "\0"
                                   "c",
                                   6)),
            "a" + fffd + "b" + fffd + fffd + "c");
  EXPECT_EQ(xml_escape("\t\n\r\x7f"), "\t\n\r\x7f");
  EXPECT_EQ(xml_escape("x\xEF\xBF\xBEy\xEF\xBF\xBF"), "x" + fffd + "y" + fffd);
  EXPECT_EQ(xml_escape("\xEF\xBF\xBD\xEF\xBF"), "\xEF\xBF\xBD\xEF\xBF");
}

TEST(Svg, LinePlot) {
  PlotSeries train{"train loss", {0, 100, 200, 300}, {9.1, 6.5, NAN, 4.0}};
  PlotSeries valid{"valid <loss> & co", {100, 300}, {7.0, 5.2}};
  PlotSeries bleu{"valid BLEU", {100, 300}, {3.5, 12.25}, true};
  LinePlotOptions o;
  o.title = "run \"base\"";
  const std::string svg = line_plot_svg({train, valid, bleu}, o);
  expect_well_formed(svg, "plot.svg");
  // The NaN splits the training curve into two polylines.
  EXPECT_EQ(count(svg, "<polyline"), 4u);
  // BLEU on the right axis: its curve and its legend sample are dashed.
  EXPECT_EQ(count(svg, "stroke-dasharray"), 2u);
  // The legend is drawn after every curve, in a box over them.
  EXPECT_GT(svg.find("fill-opacity"), svg.rfind("<polyline"));
  // The y ranges have room above the data: the highest point (9.1, at x 0) is below the frame's
  // top edge at y 40.
  EXPECT_EQ(svg.find(",40\""), std::string::npos);
  EXPECT_EQ(svg.find(",40 "), std::string::npos);
  EXPECT_NE(svg.find(">valid &lt;loss&gt; &amp; co</text>"), std::string::npos);
  EXPECT_NE(svg.find(">run &quot;base&quot;</text>"), std::string::npos);
  EXPECT_NE(svg.find(">BLEU</text>"), std::string::npos);
  EXPECT_NE(svg.find(">300</text>"), std::string::npos);  // an x tick at a round step
  EXPECT_NE(svg.find(">10</text>"), std::string::npos);   // a right-axis tick
  const std::string m = [&] {
    try {
      line_plot_svg({PlotSeries{"bad", {1, 2}, {1}}}, o);
    } catch (const attn::ShapeError& e) {
      return std::string(e.what());
    }
    return std::string();
  }();
  EXPECT_NE(m.find("series 'bad' has 2 x values and 1 y values"), std::string::npos) << m;
  expect_well_formed(line_plot_svg({}, LinePlotOptions{}), "empty.svg");
}

TEST(Svg, AttentionGrid) {
  const std::vector<std::string> src{"the", "<cat>", "sat", "</s>"};
  const std::vector<std::string> tgt{"die", "Katze&", "</s>"};
  // Two layers of two heads, [H, T, S] each, as the model's attention buffers hold them.
  std::vector<AttentionPanel> panels;
  for (int layer = 0; layer < 2; ++layer) {
    attn::Tensor<float> probs({2, 3, 4});
    for (attn::Index i = 0; i < probs.numel(); ++i) probs.data()[i] = (i % 4 == layer) ? 1.f : 0.f;
    auto layer_panels = attention_panels(probs, "layer " + std::to_string(layer + 1) + ", ");
    panels.insert(panels.end(), layer_panels.begin(), layer_panels.end());
  }
  AttentionPlotOptions o;
  o.columns = 2;
  o.title = "encoder-decoder attention";
  const std::string svg = attention_svg(src, tgt, panels, o);
  expect_well_formed(svg, "attention.svg");
  EXPECT_EQ(count(svg, "<g>"), 1u + 4u);  // colour scale, panels
  // background, colour scale, cells, frames
  EXPECT_EQ(count(svg, "<rect"), 1u + 11u + 4u * (3u * 4u + 1u));
  EXPECT_EQ(count(svg, "fill=\"#08306b\""), 1u + 4u * 3u);  // one weight of 1 per row
  EXPECT_EQ(count(svg, "fill=\"#ffffff\""), 1u + 4u * 3u * 3u);
  EXPECT_NE(svg.find(">0</text>"), std::string::npos);
  EXPECT_NE(svg.find(">1</text>"), std::string::npos);
  EXPECT_NE(svg.find("the panel&apos;s largest weight"), std::string::npos);

  // Each panel is shaded relative to its own largest weight: a head whose weights are at most
  // 0.25 still shows its alignment in the darkest shade, and its title names the maximum.
  std::vector<AttentionPanel> pale{{"pale", std::vector<double>(12, 0.0)}};
  for (std::size_t t = 0; t < 3; ++t) pale[0].weights[t * 4 + t] = 0.25;
  std::string shaded = attention_svg(src, tgt, pale, o);
  EXPECT_EQ(count(shaded, "fill=\"#08306b\""), 1u + 3u);
  EXPECT_NE(shaded.find(">pale (max 0.25)</text>"), std::string::npos);
  o.normalize = false;
  shaded = attention_svg(src, tgt, pale, o);
  EXPECT_EQ(count(shaded, "fill=\"#08306b\""), 1u);  // only the scale's swatch
  EXPECT_NE(shaded.find(">pale</text>"), std::string::npos);
  o.normalize = true;
  EXPECT_NE(svg.find(">layer 2, head 2 (max 1.00)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">&lt;cat&gt;</text>"), std::string::npos);
  EXPECT_NE(svg.find(">Katze&amp;</text>"), std::string::npos);
  EXPECT_EQ(svg.find("<cat>"), std::string::npos);

  panels[1].weights.pop_back();
  try {
    attention_svg(src, tgt, panels, o);
    FAIL() << "expected ShapeError";
  } catch (const attn::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("'layer 1, head 2' holds 11 weights, expected T * S = 3 "
                                         "* 4 = 12"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(attention_panels(attn::Tensor<double>({3, 4}), ""), attn::ShapeError);
}

TEST(Svg, WriteFailsWithPath) {
  try {
    write_svg("/nonexistent/dir/x.svg", "<svg/>");
    FAIL() << "expected IOError";
  } catch (const attn::IOError& e) {
    EXPECT_NE(std::string(e.what()).find("to write /nonexistent/dir/x.svg"), std::string::npos);
  }
}
