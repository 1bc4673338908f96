// libFuzzer target: the status page's head view. The input's first line is a URL query
// string (ParseHeadsQuery); the rest, when it parses, a HeadStatisticsResponse drawn
// by RenderHeadsPage (any shape, sizes, indices and token texts). Any input must give a
// Status or a page: never a crash, an exception, a read out of bounds or undefined
// behaviour.
#include <cstddef>
#include <cstdint>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "server/observability/heads_page.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnserve::server;  // NOLINT(build/namespaces): a fuzzer's one function
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t line = input.find('\n');
  HeadsView view;
  view.encoders = {"m", "<e>"};
  absl::StatusOr<HeadsQuery> query = ParseHeadsQuery(input.substr(0, line));
  if (!query.ok()) {
    view.measured = query.status();
  } else {
    view.query = *std::move(query);
    if (line != std::string::npos) {
      attnserve::v1::HeadStatisticsResponse measured;
      if (measured.ParseFromString(input.substr(line + 1))) view.measured = measured;
    }
  }
  RenderHeadsPage(view);
  return 0;
}
