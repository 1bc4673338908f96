// The status page's arithmetic and escaping: percentiles between two histogram
// snapshots (as Prometheus's histogram_quantile interpolates), and model names and flags
// that cannot inject markup; the head view's query parsing and drawing.
#include "server/observability/status_page.h"

#include <civetweb.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "server/observability/heads_page.h"
#include "server/observability/metrics_http.h"

namespace attnserve::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ServerMetrics::HistogramCounts Counts(std::vector<uint64_t> cumulative) {
  ServerMetrics::HistogramCounts counts;
  counts.upper_bounds = {0.001, 0.01, 0.1, std::numeric_limits<double>::infinity()};
  counts.cumulative = std::move(cumulative);
  counts.count = counts.cumulative.back();
  return counts;
}

TEST(StatusPageTest, QuantilesInterpolateInsideTheBucketOfTheIntervalsSamples) {
  // Before: 10 samples <= 1 ms. After: 10 more <= 1 ms, and 20 in (1 ms, 10 ms].
  const auto before = Counts({10, 10, 10, 10});
  const auto after = Counts({20, 40, 40, 40});
  // 30 samples in the interval: the median (rank 15) is the 5th of the 20 in the second
  // bucket: 1 ms + 9 ms * 5 / 20.
  EXPECT_NEAR(QuantileBetween(before, after, 0.5), 0.001 + 0.009 * 5.0 / 20.0, 1e-12);
  // Rank 9 of 30 falls in the first bucket: 0 + 1 ms * 9 / 10.
  EXPECT_NEAR(QuantileBetween(before, after, 0.3), 0.0009, 1e-12);
  EXPECT_EQ(QuantileBetween(after, after, 0.5), -1) << "no samples in between";
  // Past the last finite bound: its lower edge.
  EXPECT_EQ(QuantileBetween(Counts({0, 0, 0, 0}), Counts({0, 0, 0, 5}), 0.99), 0.1);
}

TEST(StatusPageTest, TextFromModelsAndFlagsIsEscaped) {
  StatusView view;
  view.version = "0.1.0";
  view.started = absl::Now() - absl::Minutes(3);
  view.flags = {{"model_repository", "/srv/<models>&\"x\""}};
  v1::ModelInfo model;
  model.set_name("m<script>alert(1)</script>");
  model.set_device("cpu");
  view.models.push_back(model);
  StatusSample first, last;
  first.time = absl::Now() - absl::Seconds(10);
  last.time = absl::Now();
  first.models[model.name()].request_duration = Counts({0, 0, 0, 0});
  last.models[model.name()].request_duration = Counts({4, 4, 4, 4});
  first.models[model.name()].batch_size = Counts({0, 0, 0, 0});
  last.models[model.name()].batch_size = Counts({3, 4, 4, 4});
  view.samples = {first, last};
  const std::string html = RenderStatusPage(view);
  EXPECT_THAT(html, Not(HasSubstr("<script>")));
  EXPECT_THAT(html, HasSubstr("m&lt;script&gt;alert(1)&lt;/script&gt;"));
  EXPECT_THAT(html, HasSubstr("/srv/&lt;models&gt;&amp;&quot;x&quot;"));
  EXPECT_THAT(html, HasSubstr("class=\"series p50\" data-points=\"1\""));
  EXPECT_THAT(html, HasSubstr("class=\"bar\" data-count=\"3\""));
  EXPECT_THAT(html, HasSubstr("class=\"bar\" data-count=\"1\""));
  EXPECT_THAT(html, HasSubstr("up 3m"));
}

// The models table says what each model does: attention, encoder, reranker, classifier.
TEST(StatusPageTest, TheModelsTableNamesEachModelsTask) {
  StatusView view;
  view.version = "0.1.0";
  view.started = absl::Now();
  const auto add = [&](const std::string& name, v1::ModelKind kind, int labels) {
    v1::ModelInfo model;
    model.set_name(name);
    model.set_kind(kind);
    if (labels > 0) {
      model.mutable_encoder()->set_task(v1::EncoderConfig::TASK_CLASSIFY);
      for (int i = 0; i < labels; ++i) model.mutable_encoder()->add_labels("l");
    }
    view.models.push_back(model);
  };
  add("mha", v1::MODEL_KIND_ATTENTION, 0);
  add("minilm", v1::MODEL_KIND_ENCODER, 0);
  add("ce", v1::MODEL_KIND_ENCODER, 1);
  add("nli", v1::MODEL_KIND_ENCODER, 3);
  const std::string html = RenderStatusPage(view);
  EXPECT_THAT(html, HasSubstr("<td>mha</td><td>attention</td>"));
  EXPECT_THAT(html, HasSubstr("<td>minilm</td><td>encoder (<a class=\"heads\" "
                              "href=\"/heads?model=minilm\">heads</a>)</td>"));
  EXPECT_THAT(html, HasSubstr("<td>ce</td><td>reranker (<a class=\"heads\" "
                              "href=\"/heads?model=ce\">heads</a>)</td>"));
  EXPECT_THAT(html, HasSubstr("<td>nli</td><td>classifier (3 labels) (<a class=\"heads\" "
                              "href=\"/heads?model=nli\">heads</a>)</td>"));
}

TEST(HeadsPageTest, TheQueryIsDecodedAndItsMistakesNamed) {
  absl::StatusOr<HeadsQuery> query =
      ParseHeadsQuery("model=mini%20lm&text=caf%C3%A9+%3Cb%3E&layer=2&head=11");
  ASSERT_TRUE(query.ok()) << query.status();
  EXPECT_EQ(query->model, "mini lm");
  EXPECT_EQ(query->text, "caf\xC3\xA9 <b>");
  EXPECT_EQ(query->layer, 2);
  EXPECT_EQ(query->head, 11);
  EXPECT_EQ(ParseHeadsQuery("")->layer, 0);
  EXPECT_THAT(ParseHeadsQuery("head=-1").status().message(),
              HasSubstr("head must be a number in [0, 1000000], got \"-1\""));
  EXPECT_THAT(ParseHeadsQuery("text=" + std::string(kMaxHeadsTextBytes + 1, 'a'))
                  .status()
                  .message(),
              HasSubstr("text is over 2000 bytes"));
}

TEST(HeadsPageTest, GridsCrossOutPrunedHeadsAndTokensAreEscaped) {
  v1::HeadStatisticsResponse measured;
  measured.set_model("m");
  measured.set_tokens(2);
  for (int layer = 0; layer < 2; ++layer) {
    for (int head = 0; head < 3; ++head) {
      v1::HeadStatistic* entry = measured.add_heads();
      entry->set_layer(layer);
      entry->set_head(head);
      entry->set_pruned(layer == 1 && head == 2);
      entry->set_mean_entropy(0.25 * (head + 1));
    }
  }
  v1::Tensor* attention = measured.mutable_attention();
  for (const int extent : {2, 3, 2, 2}) attention->add_shape(extent);
  const std::vector<float> weights(2 * 3 * 2 * 2, 0.5f);
  attention->set_raw(std::string(reinterpret_cast<const char*>(weights.data()),
                                 weights.size() * sizeof(float)));
  measured.add_token_texts("[CLS]");
  measured.add_token_texts("<img>");
  HeadsView view;
  view.encoders = {"m"};
  view.query.model = "m";
  view.query.text = "<script>";
  view.query.layer = 1;
  view.query.head = 1;
  view.measured = measured;
  const std::string html = RenderHeadsPage(view);
  EXPECT_THAT(html, Not(HasSubstr("<script>")));
  EXPECT_THAT(html, Not(HasSubstr("<img>")));
  EXPECT_THAT(html, HasSubstr("&lt;img&gt;"));
  EXPECT_THAT(html, HasSubstr("data-statistic=\"mean_entropy\""));
  EXPECT_THAT(html, HasSubstr("class=\"cell pruned\" data-layer=\"1\" data-head=\"2\""));
  EXPECT_THAT(html, HasSubstr("data-value=\"0.75\""));
  EXPECT_THAT(html, HasSubstr("<svg id=\"heatmap\" data-layer=\"1\" data-head=\"1\" "
                              "data-tokens=\"2\""));
  // The links carry the query URL-encoded, then HTML-escaped.
  EXPECT_THAT(html, HasSubstr("text=%3cscript%3e&amp;layer=0&amp;head=0"));

  view.query.head = 2;  // the pruned one
  EXPECT_THAT(RenderHeadsPage(view), HasSubstr("layer 1 head 2 is pruned"));
  // A response whose attention does not match its figures draws no heatmap.
  measured.mutable_attention()->mutable_raw()->resize(8);
  view.measured = measured;
  view.query.head = 0;
  EXPECT_THAT(RenderHeadsPage(view),
              HasSubstr("the attention weights have the wrong size"));
}

TEST(HeadsPageTest, FiguresOutsideTheGridAreCalledMalformed) {
  for (const int64_t layer : {int64_t{-1}, int64_t{1} << 40, INT64_MAX}) {
    v1::HeadStatisticsResponse measured;
    measured.set_model("m");
    measured.add_heads();  // layer 0, head 0
    measured.add_heads()->set_layer(layer);
    HeadsView view;
    view.encoders = {"m"};
    view.query.model = "m";
    view.measured = measured;
    const std::string html = RenderHeadsPage(view);
    EXPECT_THAT(html, HasSubstr("the server's figures are malformed")) << layer;
    EXPECT_THAT(html, HasSubstr("m: 0 layers x 0 heads")) << layer;
  }
}

TEST(HeadsPageTest, AttentionWhoseSizeOverflowsIsTheWrongSize) {
  // 4 x 4096 heads of 2^24 x 2^24 weights: 2^64 bytes, which a product wraps to 0, the
  // size of the empty weights sent.
  v1::HeadStatisticsResponse measured;
  measured.set_model("m");
  for (int layer = 0; layer < 4; ++layer) {
    for (int head = 0; head < 4096; ++head) {
      v1::HeadStatistic* entry = measured.add_heads();
      entry->set_layer(layer);
      entry->set_head(head);
    }
  }
  v1::Tensor* attention = measured.mutable_attention();
  for (const int64_t extent :
       {int64_t{4}, int64_t{4096}, int64_t{1} << 24, int64_t{1} << 24}) {
    attention->add_shape(extent);
  }
  HeadsView view;
  view.encoders = {"m"};
  view.query.model = "m";
  view.measured = measured;
  EXPECT_THAT(RenderHeadsPage(view),
              HasSubstr("the attention weights have the wrong size"));
}

// GET `path` from the metrics port: (status, body).
std::pair<int, std::string> Get(int port, const std::string& path) {
  char error[256] = {};
  mg_connection* connection =
      mg_download("127.0.0.1", port, 0, error, sizeof(error),
                  "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path.c_str());
  if (connection == nullptr) {
    ADD_FAILURE() << "no connection: " << error;
    return {0, ""};
  }
  std::pair<int, std::string> reply = {mg_get_response_info(connection)->status_code, ""};
  char chunk[4096];
  int read = 0;
  while ((read = mg_read(connection, chunk, sizeof(chunk))) > 0) {
    reply.second.append(chunk, static_cast<size_t>(read));
  }
  mg_close_connection(connection);
  return reply;
}

TEST(HeadsPageTest, OneMeasurementAtATimeAndTheNextIsA429) {
  // The head view holds at most one of the metrics port's threads; /metrics answers
  // meanwhile.
  ModelRegistry::Options models;
  models.warm_up = false;
  models.intra_op_threads = 1;
  auto registry = ModelRegistry::Create(models);
  ASSERT_TRUE(registry.ok()) << registry.status();
  ServerMetrics metrics;
  absl::Notification entered, release;
  MetricsHttp::Options options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.measure_heads =
      [&](const std::string&,
          const std::string& text) -> absl::StatusOr<v1::HeadStatisticsResponse> {
    if (text == "held") {
      entered.Notify();
      release.WaitForNotification();
    }
    return absl::UnavailableError("measured " + text);
  };
  auto http = MetricsHttp::Start(options, &metrics, registry->get(), nullptr);
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  std::pair<int, std::string> held;
  std::thread first([&] { held = Get(port, "/heads?model=mha-base&text=held"); });
  entered.WaitForNotification();
  const auto refused = Get(port, "/heads?model=mha-base&text=second");
  EXPECT_EQ(refused.first, 429);
  EXPECT_THAT(refused.second, HasSubstr("one text at a time"));
  EXPECT_EQ(Get(port, "/metrics").first, 200);
  release.Notify();
  first.join();
  EXPECT_EQ(held.first, 503);
  EXPECT_THAT(held.second, HasSubstr("measured held"));
  const auto after = Get(port, "/heads?model=mha-base&text=third");
  EXPECT_EQ(after.first, 503);
  EXPECT_THAT(after.second, HasSubstr("measured third"));
  (*http)->Stop();
}

}  // namespace
}  // namespace attnserve::server
