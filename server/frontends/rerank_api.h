// The rerank and classification APIs (TEI's /rerank and /predict, the Cohere and Jina
// rerank shape): their answers, built from a classification model's scores. The parsers
// and the shared types are declared in embeddings_api.h, beside the embeddings APIs
// whose call type they share (one HTTP path serves both).
#ifndef ATTNSERVE_SERVER_FRONTENDS_RERANK_API_H_
#define ATTNSERVE_SERVER_FRONTENDS_RERANK_API_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "attnserve/v1/attention.pb.h"
#include "server/frontends/embeddings_api.h"
#include "server/models/model_registry.h"

namespace attnserve::server {

// OK when `model` ranks documents: a classification model of one label. Otherwise
// InvalidArgument naming the model, what it is, and `instead` (the call to use for a
// model of several labels).
absl::Status CheckReranker(const ServedModel& model, absl::string_view instead);

// The indices of `scores`, best first (ties keep their order), cut to top_n (0: all).
std::vector<int64_t> RankScores(absl::Span<const float> scores, int64_t top_n);

// The answer of a rerank or predict call (EmbeddingsBody's words). REQUIRES:
// call.classifies().
std::string ScoresBody(const EmbeddingsCall& call, const v1::EncodeResponse& response,
                       const ServedModel& model);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FRONTENDS_RERANK_API_H_
