#include "server/observability/event_log.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace attnserve::server {

void LogEvent(absl::string_view event,
              std::initializer_list<std::pair<absl::string_view, std::string>> fields) {
  std::string line = absl::StrCat(
      "ts=", absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " event=", event);
  for (const auto& [key, value] : fields) {
    const bool quote = value.empty() || absl::StrContains(value, ' ');
    absl::StrAppend(&line, " ", key, "=", quote ? "\"" : "", value, quote ? "\"" : "");
  }
  line += "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace attnserve::server
