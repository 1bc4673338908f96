#include "server/observability/heads_page.h"

#include <civetweb.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/observability/status_page.h"

namespace attnserve::server {
namespace {

// The figures a grid is drawn for: name (data-statistic), caption, value.
struct Figure {
  const char* name;
  const char* caption;
  double (v1::HeadStatistic::*value)() const;
};

constexpr Figure kFigures[] = {
    {"mean_entropy", "entropy of the attention rows (nats)",
     &v1::HeadStatistic::mean_entropy},
    {"mean_max_weight", "largest weight per row", &v1::HeadStatistic::mean_max_weight},
    {"mean_distance", "mean distance looked (tokens)", &v1::HeadStatistic::mean_distance},
    {"share_first", "share on the first token ([CLS])", &v1::HeadStatistic::share_first},
    {"share_last", "share on the last token ([SEP])", &v1::HeadStatistic::share_last},
    {"share_self", "share on the token itself", &v1::HeadStatistic::share_self},
    {"share_previous", "share on the previous token", &v1::HeadStatistic::share_previous},
};

constexpr int kCell = 22;      // a grid cell, px
constexpr int kLabel = 34;     // the grid's axis labels, px
constexpr int kHeatmap = 520;  // the heatmap's side at most, px
// The most layers or heads a grid draws (a response past it is malformed).
constexpr int64_t kMaxGridSide = 4096;

// White (0) to dark blue (1).
std::string Shade(double fraction) {
  fraction = fraction >= 0.0 ? std::min(fraction, 1.0) : 0.0;  // NaN: white
  const auto channel = [fraction](int from, int to) {
    return static_cast<int>(std::lround(from + (to - from) * fraction));
  };
  return absl::StrFormat("rgb(%d,%d,%d)", channel(255, 16), channel(255, 72),
                         channel(255, 160));
}

// The link to the head view of `query`'s model and text, up to the layer and head
// (URL-encoded, then HTML-escaped): made once per page, as every grid cell links to it.
std::string HeadsLinkStem(const HeadsQuery& query) {
  // mg_url_encode writes at most 3 bytes per byte and a NUL.
  const auto encode = [](const std::string& text) {
    std::string out(3 * text.size() + 1, '\0');
    const int written = mg_url_encode(text.c_str(), out.data(), out.size());
    out.resize(written > 0 ? static_cast<size_t>(written) : 0);
    return out;
  };
  return HtmlEscape(
      absl::StrCat("/heads?model=", encode(query.model), "&text=", encode(query.text)));
}

// One statistic as a layer x head grid; each cell links to its head's heatmap.
std::string Grid(const Figure& figure, const v1::HeadStatisticsResponse& measured,
                 int64_t layers, int64_t heads, const HeadsQuery& query,
                 const std::string& link_stem) {
  double top = 0;
  for (const v1::HeadStatistic& entry : measured.heads()) {
    top = std::max(top, (entry.*figure.value)());
  }
  const int64_t width = kLabel + heads * kCell, height = kLabel + layers * kCell;
  std::string svg = absl::StrFormat(
      "<figure><figcaption>%s (darkest: %.3g)</figcaption><svg class=\"head-grid\" "
      "data-statistic=\"%s\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
      "role=\"img\">",
      figure.caption, top, figure.name, width, height, width, height);
  for (int64_t head = 0; head < heads; ++head) {
    absl::StrAppendFormat(&svg,
                          "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">h%d</text>",
                          kLabel + head * kCell + kCell / 2, kLabel - 8, head);
  }
  for (int64_t layer = 0; layer < layers; ++layer) {
    absl::StrAppendFormat(&svg, "<text x=\"2\" y=\"%d\">L%d</text>",
                          kLabel + layer * kCell + kCell / 2 + 4, layer);
  }
  for (const v1::HeadStatistic& entry : measured.heads()) {
    const double value = (entry.*figure.value)();
    const int64_t x = kLabel + entry.head() * kCell, y = kLabel + entry.layer() * kCell;
    const bool picked = entry.layer() == query.layer && entry.head() == query.head;
    absl::StrAppendFormat(
        &svg,
        "<a href=\"%s\"><rect class=\"cell%s\" data-layer=\"%d\" data-head=\"%d\" "
        "data-value=\"%.6g\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" "
        "stroke=\"%s\" stroke-width=\"%d\"><title>layer %d head %d: %s</title></rect>",
        absl::StrCat(link_stem, "&amp;layer=", entry.layer(), "&amp;head=", entry.head(),
                     "#heatmap"),
        entry.pruned() ? " pruned" : "", entry.layer(), entry.head(), value, x, y,
        kCell - 1, kCell - 1,
        entry.pruned() ? "#e4e4e4" : Shade(top > 0 ? value / top : 0),
        picked ? "#d33" : "#fff", picked ? 2 : 1, entry.layer(), entry.head(),
        entry.pruned() ? "pruned" : absl::StrFormat("%.4g", value));
    if (entry.pruned()) {  // crossed out
      absl::StrAppendFormat(
          &svg, "<path d=\"M%d %dl%d %dM%d %dl%d %d\" stroke=\"#999\"/>", x + 4, y + 4,
          kCell - 9, kCell - 9, x + kCell - 5, y + 4, 9 - kCell, kCell - 9);
    }
    svg += "</a>";
  }
  return svg + "</svg></figure>";
}

// Whether `bytes` hold `maps` float maps of length x length: the length bounded before it
// is squared, then divided, not multiplied (maps * length^2 * 4 can pass INT64_MAX).
bool HoldsMaps(int64_t bytes, int64_t maps, int64_t length) {
  if (length < 1 || length > kMaxGridSide * kMaxGridSide) return false;
  const int64_t per_map = length * length * static_cast<int64_t>(sizeof(float));
  return bytes % per_map == 0 && bytes / per_map == maps;
}

// The picked head's weights over the first text's tokens: query rows, key columns.
std::string Heatmap(const v1::HeadStatisticsResponse& measured, int64_t layers,
                    int64_t heads, const HeadsQuery& query) {
  const v1::Tensor& attention = measured.attention();
  if (attention.shape_size() != 4 || attention.shape(0) != layers ||
      attention.shape(1) != heads || attention.shape(2) != attention.shape(3)) {
    return "<p class=\"error\">the server returned no attention weights</p>";
  }
  const int64_t length = attention.shape(2);
  if (!HoldsMaps(static_cast<int64_t>(attention.raw().size()), layers * heads, length)) {
    return "<p class=\"error\">the attention weights have the wrong size</p>";
  }
  if (query.layer >= layers || query.head >= heads) {
    return absl::StrFormat(
        "<p class=\"error\">layer %d head %d: the model has %d layers of %d heads</p>",
        query.layer, query.head, layers, heads);
  }
  const v1::HeadStatistic& entry = measured.heads(query.layer * heads + query.head);
  std::string html = absl::StrFormat("<h2 id=\"heatmap-title\">layer %d, head %d</h2>",
                                     query.layer, query.head);
  if (entry.pruned()) {
    return html + absl::StrFormat(
                      "<p class=\"pruned-note\">layer %d head %d is pruned: the model "
                      "does not compute it.</p>",
                      query.layer, query.head);
  }
  const int cell = static_cast<int>(
      std::clamp<int64_t>(kHeatmap / std::max<int64_t>(length, 1), 3, 24));
  const bool labelled = cell >= 10 && measured.token_texts_size() == length;
  const int margin = labelled ? 90 : 0;
  const int64_t side = margin + length * cell;
  const int64_t width = side + (labelled ? 40 : 0);  // the last key label leans right
  absl::StrAppendFormat(&html,
                        "<svg id=\"heatmap\" data-layer=\"%d\" data-head=\"%d\" "
                        "data-tokens=\"%d\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d "
                        "%d\" role=\"img\">",
                        query.layer, query.head, length, width, side, width, side);
  if (labelled) {
    for (int64_t t = 0; t < length; ++t) {
      const std::string token = HtmlEscape(measured.token_texts(static_cast<int>(t)));
      absl::StrAppendFormat(
          &html,
          "<text class=\"query-token\" x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>"
          "<text class=\"key-token\" transform=\"translate(%d %d) "
          "rotate(-60)\">%s</text>",
          margin - 4, margin + t * cell + cell / 2 + 4, token,
          margin + t * cell + cell / 2, margin - 4, token);
    }
  }
  const auto* weights = reinterpret_cast<const float*>(attention.raw().data()) +
                        (query.layer * heads + query.head) * length * length;
  for (int64_t i = 0; i < length; ++i) {
    for (int64_t j = 0; j < length; ++j) {
      const float weight = weights[i * length + j];
      // sqrt: small weights stay visible beside a dominant one.
      absl::StrAppendFormat(
          &html,
          "<rect class=\"weight\" x=\"%d\" y=\"%d\" width=\"%d\" "
          "height=\"%d\" fill=\"%s\"><title>%d → %d: %.4f</title></rect>",
          margin + j * cell, margin + i * cell, cell, cell,
          Shade(std::sqrt(std::max(weight, 0.0f))), i, j, weight);
    }
  }
  return html + "</svg>";
}

}  // namespace

absl::StatusOr<HeadsQuery> ParseHeadsQuery(const std::string& query_string) {
  HeadsQuery query;
  std::string value(kMaxHeadsTextBytes + 1, '\0');
  // The decoded value of `name` into `out`; false when absent.
  const auto read = [&](const char* name, std::string* out) -> absl::StatusOr<bool> {
    const int length = mg_get_var(query_string.data(), query_string.size(), name,
                                  value.data(), value.size());
    if (length == -1) return false;
    if (length < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " is over ", kMaxHeadsTextBytes, " bytes; send a shorter text"));
    }
    out->assign(value.data(), static_cast<size_t>(length));
    return true;
  };
  const auto number = [&](const char* name, int64_t* out) -> absl::Status {
    std::string text;
    absl::StatusOr<bool> present = read(name, &text);
    if (!present.ok()) return present.status();
    if (!*present || text.empty()) return absl::OkStatus();
    if (!absl::SimpleAtoi(text, out) || *out < 0 || *out > 1'000'000) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " must be a number in [0, 1000000], got \"", text.substr(0, 40), "\""));
    }
    return absl::OkStatus();
  };
  for (const auto& [name, out] :
       {std::pair<const char*, std::string*>{"model", &query.model},
        {"text", &query.text}}) {
    absl::StatusOr<bool> present = read(name, out);
    if (!present.ok()) return present.status();
  }
  if (absl::Status layer = number("layer", &query.layer); !layer.ok()) return layer;
  if (absl::Status head = number("head", &query.head); !head.ok()) return head;
  return query;
}

std::string RenderHeadsPage(const HeadsView& view) {
  const HeadsQuery& query = view.query;
  std::string html = absl::StrCat(
      "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<title>attnserve heads</title><style>"
      "body{font-family:sans-serif;margin:1.5em;color:#222}"
      "figure{display:inline-block;margin:.5em 1em .5em 0}"
      "figcaption{font-size:.9em;color:#555}svg text{font-size:11px}"
      ".error{color:#b00}textarea{width:40em;height:4em}"
      "</style></head><body><h1>attnserve: heads</h1><p><a href=\"/\">status</a>. "
      "One forward pass of the text through the model; each grid is one figure per "
      "layer (rows) and head (columns), averaged over the text's tokens. Pick a head "
      "to see its attention pattern. Pruned heads are crossed out.</p>");

  html += "<form method=\"get\" action=\"/heads\"><label>model <select name=\"model\">";
  for (const std::string& name : view.encoders) {
    absl::StrAppend(&html, "<option", name == query.model ? " selected" : "", ">",
                    HtmlEscape(name), "</option>");
  }
  absl::StrAppendFormat(
      &html,
      "</select></label> <label>layer <input name=\"layer\" type=\"number\" min=\"0\" "
      "value=\"%d\"></label> <label>head <input name=\"head\" type=\"number\" "
      "min=\"0\" value=\"%d\"></label><br><textarea name=\"text\" maxlength=\"%d\">%s"
      "</textarea><br><button type=\"submit\">measure</button></form>",
      query.layer, query.head, kMaxHeadsTextBytes, HtmlEscape(query.text));
  if (view.encoders.empty()) {
    html += "<p class=\"error\">no encoder model is served</p>";
  }
  if (view.measured.has_value()) {
    if (!view.measured->ok()) {
      absl::StrAppend(&html, "<p class=\"error\">",
                      HtmlEscape(std::string(view.measured->status().message())), "</p>");
    } else {
      const v1::HeadStatisticsResponse& measured = **view.measured;
      int64_t layers = 0, heads = 0;
      bool in_range = true;
      for (const v1::HeadStatistic& entry : measured.heads()) {
        // Checked before the + 1: a layer of INT64_MAX would overflow it.
        in_range = entry.layer() >= 0 && entry.layer() < kMaxGridSide &&
                   entry.head() >= 0 && entry.head() < kMaxGridSide;
        if (!in_range) break;
        layers = std::max(layers, entry.layer() + 1);
        heads = std::max(heads, entry.head() + 1);
      }
      if (!in_range) layers = heads = 0;
      absl::StrAppendFormat(&html, "<h2>%s: %d layers x %d heads, %d tokens</h2>",
                            HtmlEscape(measured.model()), layers, heads,
                            measured.tokens());
      if (layers * heads != measured.heads_size() || layers * heads == 0) {
        html += "<p class=\"error\">the server's figures are malformed</p>";
      } else {
        html += "<section id=\"grids\">";
        const std::string link_stem = HeadsLinkStem(query);
        for (const Figure& figure : kFigures) {
          html += Grid(figure, measured, layers, heads, query, link_stem);
        }
        html += "</section>";
        html += Heatmap(measured, layers, heads, query);
      }
    }
  }
  return html + "</body></html>";
}

}  // namespace attnserve::server
