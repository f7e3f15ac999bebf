// Self-contained SVG figures for the trainer's report: loss and BLEU curves over steps, and
// attention heatmaps of one sentence with one panel per (layer, head), as the paper's
// Figures 3-5. No plotting library: the output is plain SVG 1.1 text any browser renders.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <attn/tensor.hpp>

namespace attn::translate {

/// Escapes & < > " ' for XML text and attribute values, and replaces the characters XML cannot
/// hold (C0 controls but tab, LF and CR; U+FFFE, U+FFFF) with U+FFFD.
std::string xml_escape(std::string_view text);

struct PlotSeries {
  std::string name;
  std::vector<double> x;    ///< e.g. training steps
  std::vector<double> y;    ///< non-finite values leave a gap
  bool right_axis = false;  ///< plot against the right-hand axis (e.g. BLEU beside losses)
};

struct LinePlotOptions {
  std::string title;
  std::string x_label = "step";
  std::string y_label = "loss";
  std::string y2_label = "BLEU";  ///< used when a series has right_axis
  int width = 720;
  int height = 420;
};

/// A line plot with axes, ticks, grid and legend. Throws ShapeError if a series' x and y differ
/// in length.
std::string line_plot_svg(const std::vector<PlotSeries>& series, const LinePlotOptions& options);

struct AttentionPanel {
  std::string title;            ///< e.g. "layer 3, head 5"
  std::vector<double> weights;  ///< [T, S] row-major: row t is target token t's distribution
};

struct AttentionPlotOptions {
  std::string title;
  int columns = 4;  ///< panels per row (heads per layer gives one layer per row)
  int cell = 16;    ///< pixels per weight
  /// Shade each panel's weights relative to its largest one (named in its title), so that every
  /// head's alignment is visible; off: absolute weights in [0, 1].
  bool normalize = true;
};

/// Heatmaps of attention weights in [0, 1], white (0) to dark blue (1), source tokens along x,
/// target tokens along y, under a colour scale. Throws ShapeError if a panel does not hold T * S
/// weights.
std::string attention_svg(const std::vector<std::string>& src_tokens,
                          const std::vector<std::string>& tgt_tokens,
                          const std::vector<AttentionPanel>& panels,
                          const AttentionPlotOptions& options = {});

/// The panels of one layer from its attention probabilities of one sentence, [H, T, S].
template <class T>
std::vector<AttentionPanel> attention_panels(const Tensor<T>& probs, const std::string& prefix) {
  ATTN_CHECK(probs.rank() == 3, ShapeError, "attention_panels: expected [H, T, S] weights, got ",
             probs.shape());
  const Index H = probs.size(0), n = probs.size(1) * probs.size(2);
  std::vector<AttentionPanel> panels(static_cast<std::size_t>(H));
  for (Index h = 0; h < H; ++h) {
    AttentionPanel& p = panels[static_cast<std::size_t>(h)];
    p.title = prefix + "head " + std::to_string(h + 1);
    p.weights.assign(probs.data() + h * n, probs.data() + (h + 1) * n);
  }
  return panels;
}

/// Writes `svg` to `path`. Throws IOError naming the path on failure.
void write_svg(const std::string& path, const std::string& svg);

}  // namespace attn::translate
