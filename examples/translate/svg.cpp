#include "svg.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include <attn/error.hpp>
#include <attn/train/atomic_file.hpp>

namespace attn::translate {
namespace {

// Matplotlib's default colour cycle: distinguishable, and familiar to readers of training plots.
constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                   "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// White (0) to #08306b (1), the ends of matplotlib's "Blues".
std::string blues(double w) {
  w = std::clamp(w, 0.0, 1.0);
  const int r = static_cast<int>(std::lround(255 - w * (255 - 8)));
  const int g = static_cast<int>(std::lround(255 - w * (255 - 48)));
  const int b = static_cast<int>(std::lround(255 - w * (255 - 107)));
  char fill[8];
  std::snprintf(fill, sizeof fill, "#%02x%02x%02x", r, g, b);
  return fill;
}

std::string tick_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", std::abs(v) < 1e-12 ? 0.0 : v);
  return buf;
}

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  // An empty or flat range still needs a non-zero span to map onto pixels.
  void finish() {
    if (!(lo <= hi)) lo = 0, hi = 1;
    if (hi - lo < 1e-12) lo -= 0.5, hi += 0.5;
  }
  // Room above and below the data, so that no curve runs along the frame.
  void pad(double fraction) {
    const double d = (hi - lo) * fraction;
    lo -= d;
    hi += d;
  }
};

// About five ticks at 1, 2 or 5 times a power of ten.
std::vector<double> nice_ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5   ? mag
                      : raw / mag < 3.5 ? 2 * mag
                      : raw / mag < 7.5 ? 5 * mag
                                        : 10 * mag;
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + 1e-9 * step; t += step) ticks.push_back(t);
  return ticks;
}

std::string text(double x, double y, std::string_view label, const char* anchor, int size = 12,
                 const std::string& extra = "") {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"" + anchor +
         "\" font-size=\"" + std::to_string(size) + "\"" + extra + ">" + xml_escape(label) +
         "</text>\n";
}

std::string header(int width, int height) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
         "width=\"" +
         std::to_string(width) + "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " +
         std::to_string(width) + " " + std::to_string(height) +
         "\" font-family=\"sans-serif\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
}

// The series' names and line styles in a white box whose top right corner is (right, y), drawn
// over the curves; about 7 pixels per character of the longest name.
std::string legend(const std::vector<PlotSeries>& series, double right, double y) {
  if (series.empty()) return "";
  std::size_t longest = 0;
  for (const PlotSeries& s : series) longest = std::max(longest, s.name.size());
  const double width = 44 + 7.0 * static_cast<double>(longest), x = right - width;
  std::string svg = "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(width) +
                    "\" height=\"" + num(8 + 18.0 * static_cast<double>(series.size())) +
                    "\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n";
  for (std::size_t k = 0; k < series.size(); ++k) {
    const double ly = y + 13 + 18.0 * static_cast<double>(k);
    svg += "<line x1=\"" + num(x + 6) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(x + 30) +
           "\" y2=\"" + num(ly) + "\" stroke=\"" +
           kColors[k % (sizeof kColors / sizeof kColors[0])] + "\" stroke-width=\"2\"" +
           (series[k].right_axis ? " stroke-dasharray=\"6 3\"" : "") + "/>\n";
    svg += text(x + 36, ly + 4, series[k].name, "start", 12);
  }
  return svg;
}

}  // namespace

std::string xml_escape(std::string_view s) {
  // XML 1.0 has no way to write the C0 controls but tab, LF and CR, nor U+FFFE and U+FFFF, even as
  // character references: one in a sentence made the whole file ill-formed, and browsers refused
  // to draw it. Each becomes U+FFFD, the replacement character.
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 && c != '\t' && c != '\n' && c != '\r') {
      out += kReplacement;
      continue;
    }
    if (s.compare(i, 3, "\xEF\xBF\xBE") == 0 || s.compare(i, 3, "\xEF\xBF\xBF") == 0) {
      out += kReplacement;
      i += 2;
      continue;
    }
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string line_plot_svg(const std::vector<PlotSeries>& series, const LinePlotOptions& o) {
  Range xr, yr, y2r;
  bool any_right = false;
  for (const PlotSeries& s : series) {
    ATTN_CHECK(s.x.size() == s.y.size(), ShapeError, "line_plot_svg: series '", s.name, "' has ",
               s.x.size(), " x values and ", s.y.size(), " y values");
    any_right = any_right || s.right_axis;
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      xr.add(s.x[i]);
      (s.right_axis ? y2r : yr).add(s.y[i]);
    }
  }
  xr.finish();
  yr.finish();
  y2r.finish();
  yr.pad(0.04);
  y2r.pad(0.04);
  const double left = 70, right = any_right ? 70 : 20, top = o.title.empty() ? 20 : 40, bottom = 50;
  const double pw = o.width - left - right, ph = o.height - top - bottom;
  auto px = [&](double x) { return left + (x - xr.lo) / (xr.hi - xr.lo) * pw; };
  auto py = [&](const Range& r, double y) { return top + ph - (y - r.lo) / (r.hi - r.lo) * ph; };

  std::string svg = header(o.width, o.height);
  if (!o.title.empty()) svg += text(o.width / 2.0, 24, o.title, "middle", 15);
  svg += "<g stroke=\"#ddd\" stroke-width=\"1\">\n";
  for (double t : nice_ticks(xr.lo, xr.hi))
    svg += "<line x1=\"" + num(px(t)) + "\" y1=\"" + num(top) + "\" x2=\"" + num(px(t)) +
           "\" y2=\"" + num(top + ph) + "\"/>\n";
  for (double t : nice_ticks(yr.lo, yr.hi))
    svg += "<line x1=\"" + num(left) + "\" y1=\"" + num(py(yr, t)) + "\" x2=\"" + num(left + pw) +
           "\" y2=\"" + num(py(yr, t)) + "\"/>\n";
  svg += "</g>\n<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(pw) +
         "\" height=\"" + num(ph) + "\" fill=\"none\" stroke=\"black\"/>\n";
  for (double t : nice_ticks(xr.lo, xr.hi))
    svg += text(px(t), top + ph + 16, tick_label(t), "middle", 11);
  for (double t : nice_ticks(yr.lo, yr.hi))
    svg += text(left - 6, py(yr, t) + 4, tick_label(t), "end", 11);
  if (any_right)
    for (double t : nice_ticks(y2r.lo, y2r.hi))
      svg += text(left + pw + 6, py(y2r, t) + 4, tick_label(t), "start", 11);
  svg += text(left + pw / 2, o.height - 12.0, o.x_label, "middle", 13);
  const std::string ymid = num(top + ph / 2);
  svg +=
      text(18, top + ph / 2, o.y_label, "middle", 13, " transform=\"rotate(-90 18 " + ymid + ")\"");
  if (any_right) {
    const std::string x2 = num(o.width - 14.0);
    svg += text(o.width - 14.0, top + ph / 2, o.y2_label, "middle", 13,
                " transform=\"rotate(90 " + x2 + " " + ymid + ")\"");
  }

  for (std::size_t k = 0; k < series.size(); ++k) {
    const PlotSeries& s = series[k];
    const Range& r = s.right_axis ? y2r : yr;
    const std::string color = kColors[k % (sizeof kColors / sizeof kColors[0])];
    std::string points;
    auto flush = [&] {
      if (!points.empty())
        svg += "<polyline fill=\"none\" stroke=\"" + color + "\" stroke-width=\"1.5\"" +
               (s.right_axis ? " stroke-dasharray=\"6 3\"" : "") + " points=\"" + points + "\"/>\n";
      points.clear();
    };
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
        flush();
        continue;
      }
      points += (points.empty() ? "" : " ") + num(px(s.x[i])) + "," + num(py(r, s.y[i]));
    }
    flush();
  }
  return svg + legend(series, left + pw - 6, top + 6) + "</svg>\n";
}

namespace {

// The colour scale of the heatmaps: kScaleSteps swatches from 0 to 1 and what 1 means.
constexpr double kScaleHeight = 34;
constexpr int kScaleSteps = 11;

std::string colour_scale(double x0, double y0, bool normalized) {
  std::string svg = "<g>\n";
  const double w = 18, h = 12;
  for (int i = 0; i < kScaleSteps; ++i)
    svg += "<rect x=\"" + num(x0 + w * i) + "\" y=\"" + num(y0 + 4) + "\" width=\"" + num(w) +
           "\" height=\"" + num(h) + "\" fill=\"" + blues(i / double(kScaleSteps - 1)) +
           "\" stroke=\"#ccc\"/>\n";
  svg += text(x0, y0 + 30, "0", "start", 11);
  svg += text(x0 + w * kScaleSteps, y0 + 30, "1", "end", 11);
  svg += text(x0 + w * kScaleSteps + 8, y0 + 14,
              normalized ? "attention weight / the panel's largest weight (its max in the title)"
                         : "attention weight",
              "start", 11);
  return svg + "</g>\n";
}

}  // namespace

std::string attention_svg(const std::vector<std::string>& src, const std::vector<std::string>& tgt,
                          const std::vector<AttentionPanel>& panels,
                          const AttentionPlotOptions& o) {
  const std::size_t S = src.size(), T = tgt.size();
  for (const AttentionPanel& p : panels)
    ATTN_CHECK(p.weights.size() == S * T, ShapeError, "attention_svg: panel '", p.title, "' holds ",
               p.weights.size(), " weights, expected T * S = ", T, " * ", S, " = ", S * T);
  ATTN_CHECK(o.columns > 0 && o.cell > 0, ConfigError,
             "attention_svg: columns and cell must be > 0, got ", o.columns, " and ", o.cell);
  const double cell = o.cell;
  std::size_t longest = 1;
  for (const auto* tokens : {&src, &tgt})
    for (const std::string& t : *tokens) longest = std::max(longest, t.size());
  // Room for the token labels: about 0.6 em per byte at font size 11.
  const double label = 7.0 * static_cast<double>(std::min<std::size_t>(longest, 24)) + 8;
  const double panel_w = label + cell * static_cast<double>(S) + 16;
  const double panel_h = 20 + label + cell * static_cast<double>(T) + 16;
  const std::size_t cols = std::min<std::size_t>(static_cast<std::size_t>(o.columns),
                                                 std::max<std::size_t>(panels.size(), 1));
  const std::size_t rows = (panels.size() + cols - 1) / cols;
  // Each panel's shades span its own range when normalised: a head whose largest weight is 0.3
  // would otherwise be too pale to show where it looks.
  std::vector<double> scale(panels.size(), 1.0);
  for (std::size_t k = 0; k < panels.size() && o.normalize; ++k) {
    double top = 0;
    for (double w : panels[k].weights) top = std::max(top, std::isfinite(w) ? w : 0.0);
    scale[k] = top > 0 ? top : 1.0;
  }
  const double title_h = (o.title.empty() ? 0 : 30) + kScaleHeight;
  // At least as wide as the colour scale and its caption.
  const int width =
      std::max(650, static_cast<int>(std::ceil(panel_w * static_cast<double>(cols))) + 10);
  const int height =
      static_cast<int>(std::ceil(title_h + panel_h * static_cast<double>(rows))) + 10;

  std::string svg = header(width, height);
  if (!o.title.empty()) svg += text(width / 2.0, 20, o.title, "middle", 15);
  svg += colour_scale(5, title_h - kScaleHeight, o.normalize);
  for (std::size_t k = 0; k < panels.size(); ++k) {
    const double x0 = 5 + panel_w * static_cast<double>(k % cols);
    const double y0 = 5 + title_h + panel_h * static_cast<double>(k / cols);
    const double gx = x0 + label, gy = y0 + 20 + label;  // top-left of the grid
    const std::string title =
        o.normalize ? panels[k].title + " (max " + num(scale[k]) + ")" : panels[k].title;
    svg += "<g>\n" + text(gx + cell * static_cast<double>(S) / 2, y0 + 14, title, "middle", 12);
    for (std::size_t s = 0; s < S; ++s) {  // source tokens along x, written upwards
      const double x = gx + cell * (static_cast<double>(s) + 0.5) + 4, y = gy - 4;
      svg += text(x, y, src[s], "start", 11,
                  " transform=\"rotate(-90 " + num(x) + " " + num(y) + ")\"");
    }
    for (std::size_t t = 0; t < T; ++t)
      svg += text(gx - 4, gy + cell * (static_cast<double>(t) + 0.5) + 4, tgt[t], "end", 11);
    for (std::size_t t = 0; t < T; ++t) {
      for (std::size_t s = 0; s < S; ++s) {
        const std::string fill = blues(panels[k].weights[t * S + s] / scale[k]);
        svg += "<rect x=\"" + num(gx + cell * static_cast<double>(s)) + "\" y=\"" +
               num(gy + cell * static_cast<double>(t)) + "\" width=\"" + num(cell) +
               "\" height=\"" + num(cell) + "\" fill=\"" + fill + "\"/>\n";
      }
    }
    svg += "<rect x=\"" + num(gx) + "\" y=\"" + num(gy) + "\" width=\"" +
           num(cell * static_cast<double>(S)) + "\" height=\"" +
           num(cell * static_cast<double>(T)) + "\" fill=\"none\" stroke=\"#444\"/>\n</g>\n";
  }
  return svg + "</svg>\n";
}

void write_svg(const std::string& path, const std::string& svg) {
  write_file_atomically(path, svg);  // never a partial plot in place of the old one
}

}  // namespace attn::translate
