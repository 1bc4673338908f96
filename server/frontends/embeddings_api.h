// The embedding APIs that client code is written against, served on the HTTP port:
// OpenAI's POST /v1/embeddings (the `openai` client, LangChain, LlamaIndex) and Hugging
// Face text-embeddings-inference's POST /embed. Their bodies become EncodeRequests (text
// or token ids) and their answers come back in each API's own JSON, errors included.
// Pure functions, which never throw whatever the bytes: the HTTP door (KServeHttp) and
// the fuzzer (tests/fuzz/embeddings_fuzzer.cc) call them.
#ifndef ATTNSERVE_SERVER_FRONTENDS_EMBEDDINGS_API_H_
#define ATTNSERVE_SERVER_FRONTENDS_EMBEDDINGS_API_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "attnserve/v1/attention.pb.h"
#include "server/models/model_registry.h"

namespace attnserve::server {

// One call of these APIs, parsed: an embeddings call, or a rerank or classification
// call (server/frontends/rerank_api.cc) on a classification model.
struct EmbeddingsCall {
  // kTeiRerank: TEI's POST /rerank; kTeiPredict: TEI's POST /predict; kRerank: the
  // Cohere and Jina shape, POST /v1/rerank and /v2/rerank.
  // kCohereEmbed: Cohere's POST /v2/embed; kTeiEmbedAll: TEI's POST /embed_all;
  // kTeiEmbedSparse: TEI's POST /embed_sparse.
  enum class Api {
    kOpenAi,
    kTei,
    kTeiRerank,
    kTeiPredict,
    kRerank,
    kCohereEmbed,
    kTeiEmbedAll,
    kTeiEmbedSparse
  };
  bool reranks() const { return api == Api::kTeiRerank || api == Api::kRerank; }
  bool classifies() const { return reranks() || api == Api::kTeiPredict; }
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
  // Rerank: the query is encode.text (once per document), the documents
  // encode.text_pair. Answer the best `top_n` (0: all), with their text when
  // `return_documents` (TEI: return_text).
  int64_t top_n = 0;
  bool return_documents = false;
  // Cohere's max_tokens_per_doc (0: unset). Each pair is cut to the model's
  // max_text_tokens, so a document never keeps more than that: a limit at or above it
  // is met, and one below it is refused (CheckEmbeddingsCall).
  int64_t max_tokens_per_doc = 0;
  // TEI /predict: the inputs came as a list of inputs (answered as a list of lists).
  bool batch = false;
  // Cohere /v2/embed: the embedding types asked for, in the body's order (each once).
  enum class EmbeddingType { kFloat, kInt8, kUint8, kBinary, kUbinary, kBase64 };
  std::vector<EmbeddingType> embedding_types;
};

// The most documents one rerank call may hold (Cohere's limit), and the most inputs of
// one /predict call.
inline constexpr int64_t kMaxRerankDocuments = 1000;

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

// TEI's POST /embed_all: {"inputs": text | [text] | [ids] | [[ids]], "truncate"?: bool,
// "truncation_direction"?: "Right", "prompt_name"?}: every token's last hidden state
// (sentence-transformers' output_value="token_embeddings"). Errors as ParseTeiEmbed's.
absl::StatusOr<EmbeddingsCall> ParseTeiEmbedAll(absl::string_view body);

// TEI's POST /embed_sparse: the body /embed_all takes, for a sparse model
// (TASK_SPARSE_EMBED): each input's nonzero weights. Errors as ParseTeiEmbed's.
absl::StatusOr<EmbeddingsCall> ParseTeiEmbedSparse(absl::string_view body);

// TEI's POST /rerank: {"query", "texts": [text], "truncate"?, "truncation_direction"?:
// "Right", "raw_scores"?, "return_text"?}. Errors as ParseOpenAiEmbeddings's, and more
// than kMaxRerankDocuments texts.
absl::StatusOr<EmbeddingsCall> ParseTeiRerank(absl::string_view body);

// The Cohere and Jina rerank body: {"model"?, "query", "documents": [text | {"text"}],
// "top_n"?: n >= 1 (more than the documents: all of them), "return_documents"?,
// "max_tokens_per_doc"?: n >= 1}. A document over the model's max_text_tokens with the
// query is cut (as those APIs cut). An optional field sent as null is absent, in every
// parser here. Errors as ParseTeiRerank's.
absl::StatusOr<EmbeddingsCall> ParseRerank(absl::string_view body);

// TEI's POST /predict: {"inputs": text | [text, text] | [text] | [[text, text]] (a
// text, a pair, or a list of either), "raw_scores"?, "truncate"?,
// "truncation_direction"?}. Errors as ParseTeiRerank's.
absl::StatusOr<EmbeddingsCall> ParseTeiPredict(absl::string_view body);

// Cohere's POST /v2/embed: {"model", "texts": [text], "input_type": "search_document" |
// "search_query" | "classification" | "clustering", "embedding_types"?: ["float" |
// "int8" | "uint8" | "binary" | "ubinary" | "base64"] (default ["float"]), "truncate"?:
// "END" (default) | "NONE", "output_dimension"?: n, "max_tokens"?: n, "priority"?}.
// Images and "inputs" are refused (text models only), as is truncate "START". Errors as
// ParseOpenAiEmbeddings's.
absl::StatusOr<EmbeddingsCall> ParseCohereEmbed(absl::string_view body);

// One embedding quantized as Cohere's embedding types, with sentence-transformers'
// quantize_embeddings rules (sentence_transformers.quantization) and the fixed range
// [-1, 1] (an L2-normalized embedding's) for int8 and uint8: uint8 = clip(floor((x + 1)
// / (2/255)), 0, 255) in float32, int8 = uint8 - 128; binary and ubinary: the signs (x >
// 0) packed 8 per byte, first value in the highest bit, the last byte padded with zeros;
// binary is ubinary - 128 as int8.
std::vector<int> QuantizeEmbedding(absl::Span<const float> values,
                                   EmbeddingsCall::EmbeddingType type);

// The embedding type Cohere names `name` ("float", "int8", "uint8", "binary",
// "ubinary", "base64"), or nullopt.
std::optional<EmbeddingsCall::EmbeddingType> EmbeddingTypeNamed(absl::string_view name);

// What needs the model, checked before the call is queued: an embeddings call's model
// pools (an embedding exists) and does not classify, a sparse model is called through
// /embed_sparse (and /embed_all) only and /embed_sparse calls a sparse model, TEI's
// normalize=false is
// possible (the model does not L2-normalize by its recipe); a rerank or predict call's
// model classifies (and reranks with one label). InvalidArgument naming the field.
// (The work checks dimensions, as on every door.)
absl::Status CheckEmbeddingsCall(const EmbeddingsCall& call, const ServedModel& model);

// The answer's JSON. OpenAI: {"object": "list", "data": [{"object": "embedding",
// "index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}. TEI:
// [[...], ...]. The embeddings as the work made them (shortened, normalized).
// TEI /rerank: [{"index", "score", "text"?}]; Cohere/Jina: {"id", "model", "results":
// [{"index", "relevance_score", "document"?: {"text"}}], "usage": {"total_tokens"},
// "meta"}; both best first, cut to top_n. TEI /embed_all: [[[...] per token] per
// input], the hidden states as they are. TEI /embed_sparse: [[{"index", "value"}] per
// input], its nonzero weights in vocabulary order. TEI /predict: [{"label", "score"}]
// best first (a list of them for a batch), labels from `model`.
std::string EmbeddingsBody(const EmbeddingsCall& call, const v1::EncodeResponse& response,
                           const ServedModel& model);

// An error in the API's own shape, with its HTTP status: OpenAI's {"error": {"message",
// "type", "param", "code"}}; TEI's {"error", "error_type"} (validation errors are 422
// there, for /rerank and /predict too); Cohere's {"message"} for kRerank. `http_status`
// is the status the KServe door gives the same error.
std::pair<int, std::string> EmbeddingsError(EmbeddingsCall::Api api,
                                            const absl::Status& status, int http_status);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FRONTENDS_EMBEDDINGS_API_H_
