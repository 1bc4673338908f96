// The embedding APIs that client code is written against, served on the HTTP port:
// OpenAI's POST /v1/embeddings (the `openai` client, LangChain, LlamaIndex) and Hugging
// Face text-embeddings-inference's POST /embed. Their bodies become EncodeRequests (text
// or token ids) and their answers come back in each API's own JSON, errors included.
// Pure functions, which never throw whatever the bytes: the HTTP door (KServeHttp) and
// the fuzzer (tests/fuzz/embeddings_fuzzer.cc) call them.
#ifndef ATTNSERVE_SERVER_FRONTENDS_EMBEDDINGS_API_H_
#define ATTNSERVE_SERVER_FRONTENDS_EMBEDDINGS_API_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/v1/attention.pb.h"
#include "server/models/model_registry.h"

namespace attnserve::server {

// One embeddings call, parsed.
struct EmbeddingsCall {
  enum class Api { kOpenAi, kTei };
  Api api = Api::kOpenAi;
  // The work: `text` (one or many), or token ids as input_ids [n, L] with an
  // attention_mask when the sequences differ in length. `model` is the body's "model"
  // (OpenAI; empty selects the default model), empty for TEI. The body's "dimensions"
  // and TEI's "normalize" travel in it, to the work that applies them.
  v1::EncodeRequest encode;
  // OpenAI encoding_format "base64": each embedding as the base64 of its little-endian
  // float32 bytes instead of a list of numbers.
  bool base64 = false;
  // TEI "normalize" (default true): answer L2-normalized embeddings.
  bool normalize = true;
};

// A POST /v1/embeddings body: {"model", "input": text | [text] | [ids] | [[ids]],
// "encoding_format"?: "float" | "base64", "dimensions"?: n, "user"?}. `body_bytes`
// bounds the padded size of token arrays ([n, longest] may hold at most that many ids,
// so that padding never costs more memory than the body). InvalidArgument naming the
// field: not a JSON object, a missing or mistyped field, an empty list, a list mixing
// kinds, an unknown field.
absl::StatusOr<EmbeddingsCall> ParseOpenAiEmbeddings(absl::string_view body);

// A POST /embed body: {"inputs": text | [text] | [ids] | [[ids]], "normalize"?: bool,
// "truncate"?: bool, "truncation_direction"?: "Right", "dimensions"?: n}. Errors as
// ParseOpenAiEmbeddings's.
absl::StatusOr<EmbeddingsCall> ParseTeiEmbed(absl::string_view body);

// What needs the model, checked before the call is queued: the model pools (an
// embedding exists), and TEI's normalize=false is possible (the model does not
// L2-normalize by its recipe). InvalidArgument naming the field. (The work checks
// dimensions, as on every door.)
absl::Status CheckEmbeddingsCall(const EmbeddingsCall& call, const ServedModel& model);

// The answer's JSON. OpenAI: {"object": "list", "data": [{"object": "embedding",
// "index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}. TEI:
// [[...], ...]. The embeddings as the work made them (shortened, normalized).
std::string EmbeddingsBody(const EmbeddingsCall& call,
                           const v1::EncodeResponse& response);

// An error in the API's own shape, with its HTTP status: OpenAI's {"error": {"message",
// "type", "param", "code"}}; TEI's {"error", "error_type"} (validation errors are 422
// there). `http_status` is the status the KServe door gives the same error.
std::pair<int, std::string> EmbeddingsError(EmbeddingsCall::Api api,
                                            const absl::Status& status, int http_status);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FRONTENDS_EMBEDDINGS_API_H_
