// Text-embeddings-inference's tokenizer routes, served on the HTTP port for any model
// that takes text: POST /tokenize (each token's id, text and place in the input) and
// POST /decode (ids back to text). Pure functions, which never throw whatever the bytes:
// the HTTP door (KServeHttp) and the fuzzer (tests/fuzz/embeddings_fuzzer.cc) call them.
#ifndef ATTNSERVE_SERVER_FRONTENDS_TOKENIZE_API_H_
#define ATTNSERVE_SERVER_FRONTENDS_TOKENIZE_API_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/text/tokenizer.h"
#include "server/models/model_registry.h"

namespace attnserve::server {

// A POST /tokenize body: {"inputs": text | [text], "add_special_tokens"?: true,
// "prompt_name"?}. InvalidArgument naming the field: not a JSON object, a missing or
// mistyped field, an empty list, an unknown field.
struct TokenizeCall {
  std::vector<std::string> inputs;
  bool add_special_tokens = true;
  std::string prompt_name;
};
absl::StatusOr<TokenizeCall> ParseTeiTokenize(absl::string_view body);

// A POST /decode body: {"ids": [id, ...] | [[id, ...], ...], "skip_special_tokens"?:
// true}. Errors as ParseTeiTokenize's, and an id that is not an integer.
struct DecodeCall {
  std::vector<std::vector<int64_t>> ids;
  bool skip_special_tokens = true;
};
absl::StatusOr<DecodeCall> ParseTeiDecode(absl::string_view body);

// TEI's /tokenize answer, [[{"id", "text", "special", "start", "stop"}] per input]: a
// text's tokens with their CHARACTER offsets [start, stop) in the input as tokenized
// (after its prompt: the request's prompt_name, else the model's default prompt) and
// that text; a token the template adds has special true, its vocabulary entry as text,
// and null offsets. Every input is tokenized whole (no truncation). InvalidArgument for
// a model without a tokenizer, an unknown prompt_name or text that is not UTF-8.
absl::StatusOr<std::string> TokenizeBody(const TokenizeCall& call,
                                         const ServedModel& model);

// TEI's /decode answer, ["text" per list of ids], by the model's decoder.
// InvalidArgument naming the list and the position of an id outside the vocabulary;
// Unimplemented for a decoder the tokenizer cannot run.
absl::StatusOr<std::string> DecodeBody(const DecodeCall& call, const ServedModel& model);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FRONTENDS_TOKENIZE_API_H_
