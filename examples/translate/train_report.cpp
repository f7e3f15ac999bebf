#include "train_report.hpp"

#include <cmath>

#include <attn/decode/options.hpp>

#include "svg.hpp"
#include "translator.hpp"

namespace attn::translate {

namespace {

std::size_t pick_sentence(const std::vector<std::vector<TokenId>>& sources) {
  for (std::size_t i = 0; i < sources.size(); ++i)
    if (sources[i].size() >= 8 && sources[i].size() <= 20) return i;
  return 0;
}

Tensor<TokenId> one_row(const std::vector<TokenId>& ids) {
  Tensor<TokenId> row({1, static_cast<Index>(ids.size())});
  for (std::size_t i = 0; i < ids.size(); ++i) row(0, static_cast<Index>(i)) = ids[i];
  return row;
}

// Keeps the weights of each decoder layer's encoder-decoder attention, and only those, while it
// lives: the self-attention weights would cost B H L^2 each for nothing. Off again after, also
// when the forward throws.
class KeepCrossAttentionWeights {
 public:
  explicit KeepCrossAttentionWeights(Decoder<float>& decoder) : decoder_(decoder) { keep(true); }
  ~KeepCrossAttentionWeights() { keep(false); }
  KeepCrossAttentionWeights(const KeepCrossAttentionWeights&) = delete;
  KeepCrossAttentionWeights& operator=(const KeepCrossAttentionWeights&) = delete;

 private:
  void keep(bool on) {
    for (auto& layer : decoder_.layers) layer->multihead_attn.keep_attention_weights(on);
  }
  Decoder<float>& decoder_;
};

// The model's forward pass on one pair, keeping the weights of each decoder layer's
// encoder-decoder attention: one panel per layer and head.
std::vector<AttentionPanel> cross_attention_panels(Transformer<float>& model,
                                                   const std::vector<TokenId>& src_ids,
                                                   const std::vector<TokenId>& tgt_ids) {
  const KeepCrossAttentionWeights keep(model.decoder);
  model.forward(one_row(src_ids), one_row(tgt_ids));
  std::vector<AttentionPanel> panels;
  for (std::size_t l = 0; l < model.decoder.layers.size(); ++l) {
    const Tensor<float>& w = model.decoder.layers[l]->multihead_attn.attention_weights();
    auto p = attention_panels(w.slice(0), "layer " + std::to_string(l + 1) + ", ");
    panels.insert(panels.end(), p.begin(), p.end());
  }
  return panels;
}

}  // namespace

void write_curves_svg(const std::string& path, const std::vector<CurvePoint>& curves) {
  PlotSeries train{"train loss", {}, {}, false}, valid{"valid loss", {}, {}, false},
      bleu{"valid BLEU", {}, {}, true};
  for (const auto& c : curves) {
    if (std::isfinite(c.train_loss)) {
      train.x.push_back(static_cast<double>(c.step));
      train.y.push_back(c.train_loss);
    }
    if (std::isfinite(c.valid_loss)) {
      valid.x.push_back(static_cast<double>(c.step));
      valid.y.push_back(c.valid_loss);
      bleu.x.push_back(static_cast<double>(c.step));
      bleu.y.push_back(c.valid_bleu);
    }
  }
  LinePlotOptions o;
  o.title = "attn-translate: loss and BLEU";
  write_svg(path, line_plot_svg({train, valid, bleu}, o));
}

void write_attention_svg(const std::string& path, Transformer<float>& model,
                         const SubwordVocab& vocab,
                         const std::vector<std::vector<TokenId>>& sources,
                         const std::vector<std::string>& source_text) {
  if (sources.empty() || sources[0].empty()) return;
  const std::size_t pick = pick_sentence(sources);
  detail::EvalGuard<float> guard(model);
  TranslateOptions t;
  t.greedy = true;
  const std::vector<TokenId>& src_ids = sources[pick];
  const std::vector<TokenId> hyp = translate_ids(model, {src_ids}, t)[0];
  std::vector<TokenId> tgt_ids{SubwordVocab::kBos};
  tgt_ids.insert(tgt_ids.end(), hyp.begin(), hyp.end());
  const std::vector<AttentionPanel> panels = cross_attention_panels(model, src_ids, tgt_ids);
  AttentionPlotOptions o;
  o.title = "encoder-decoder attention: " + source_text[pick];
  o.columns = static_cast<int>(model.config().heads);
  write_svg(path, attention_svg(vocab.pieces(src_ids), vocab.pieces(tgt_ids), panels, o));
}

}  // namespace attn::translate
