// The status page's head view (GET /heads on the metrics port): for a text typed into
// its form, an encoder's heads measured by one forward pass (HeadStatistics with
// return_attention), drawn as a layer x head grid per statistic and, for the head
// picked (a click on a grid cell), its attention pattern over the text's tokens as a
// heatmap. Pruned heads are drawn crossed out. Server-rendered SVG, no JavaScript.
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_HEADS_PAGE_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_HEADS_PAGE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention.pb.h"

namespace attnserve::server {

// What the form asked, read from the query string.
struct HeadsQuery {
  std::string model;
  std::string text;
  int64_t layer = 0;
  int64_t head = 0;
};

// The most bytes of text the form takes (a URL's worth; the model's own token limit
// and memory budget apply after).
inline constexpr int64_t kMaxHeadsTextBytes = 2000;

// The query from a URL query string (?model=...&text=...&layer=...&head=...); fields
// left out keep their defaults. InvalidArgument naming the field, the value and the
// limit (text over kMaxHeadsTextBytes, a layer or head that is not a number >= 0).
absl::StatusOr<HeadsQuery> ParseHeadsQuery(const std::string& query_string);

struct HeadsView {
  // The encoder models the form offers.
  std::vector<std::string> encoders;
  HeadsQuery query;
  // The measurement of query.text (set when a text was given): the figures, or why
  // there are none.
  std::optional<absl::StatusOr<v1::HeadStatisticsResponse>> measured;
};

// The page. Every text from the query, the model and the tokens is HTML-escaped.
std::string RenderHeadsPage(const HeadsView& view);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_HEADS_PAGE_H_
