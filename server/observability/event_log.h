// Structured logging: one line per event on stderr, `ts=... event=... key=value ...`,
// values quoted when they contain spaces. Thread-safe (one write per line).
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_EVENT_LOG_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_EVENT_LOG_H_

#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace attnserve::server {

void LogEvent(
    absl::string_view event,
    std::initializer_list<std::pair<absl::string_view, std::string>> fields = {});

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_EVENT_LOG_H_
