// RequestPipeline: the one path every front door's request takes (attnserve.v1 gRPC,
// KServe v2 gRPC, KServe v2 HTTP). It owns, once for all doors: model lookup (one
// wording for "not served"), the auth check, validation and admission, the deadline and
// cancellation, the per-call accounting and metrics, and the drain state. A door only
// turns its wire format into an AttendRequest and the answer back into its wire format.
#ifndef ATTNSERVE_SERVER_PIPELINE_REQUEST_PIPELINE_H_
#define ATTNSERVE_SERVER_PIPELINE_REQUEST_PIPELINE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/batching/attention_executor.h"
#include "server/models/model_registry.h"
#include "server/pipeline/auth.h"
#include "server/pipeline/proto_convert.h"

namespace attnserve::server {

// What a finished request's trace is made of (ServiceObserver::on_request_traced):
// the caller's W3C trace context as the door received it, the request's name, its
// model, and the times of the phases it reached (wall clock).
struct RequestTrace {
  // The traceparent and tracestate headers (or gRPC metadata); empty when absent.
  std::string traceparent, tracestate;
  // The door's name for the call: "POST /v1/embeddings", "attnserve.v1.AttentionService/
  // Encode", "inference.GRPCInferenceService/ModelInfer", ...
  std::string name;
  std::string model, version;  // empty when no model was found
  absl::Time start, end;       // from Begin to the answer handed to the door
  // Reached only by a request that was queued: its validation (tokenizing, for text),
  // its wait in the batcher's queue, and its batch's compute (shared with the
  // batch_size - 1 other requests of that batch). Zero otherwise.
  absl::Time validate_start;
  absl::Duration validate;
  absl::Time enqueued;
  absl::Duration queue, compute;
  int batch_size = 0;
  int64_t batch_id = 0;  // shared by the requests computed in one batch
  int64_t tokens = 0;    // computed tokens (0 unless OK)
  absl::Status status;
};

// Hooks for metrics; every member optional. Called on gRPC, HTTP or batcher threads,
// never under the pipeline's locks; they must be thread-safe and quick.
struct ServiceObserver {
  // An RPC began / ended. `method` is the RPC's name ("Attend", "ModelInfer",
  // "HttpInfer", ...); `elapsed` runs from the handler's start to its answer.
  std::function<void(absl::string_view method)> on_rpc_started;
  std::function<void(absl::string_view method, absl::StatusCode code,
                     absl::Duration elapsed)>
      on_rpc_handled;
  // One attention request (a call or one stream message) was received / answered.
  // `model` is the served model's name, or "" when the request named an unknown model;
  // `tokens` counts computed query tokens (0 unless OK).
  std::function<void(const std::string& model)> on_request_started;
  std::function<void(const std::string& model, const absl::Status& status,
                     absl::Duration elapsed, int64_t tokens)>
      on_request_finished;
  // An encoder request's texts were admitted, `texts` of them truncated (> 0).
  std::function<void(const std::string& model, int64_t texts)> on_texts_truncated;
  // A classification model answered `sequences` texts or pairs with scores (a
  // rerank's documents); on the batcher's answer thread.
  std::function<void(const std::string& model, int64_t sequences)> on_sequences_scored;
  // A door caught an exception at its boundary (a bug: it was answered 500/INTERNAL).
  std::function<void(absl::string_view door)> on_internal_error;
  // A call was refused RESOURCE_EXHAUSTED because max_concurrent_requests were open.
  std::function<void()> on_overloaded;
  // A request was answered (once, right after on_request_finished), with its trace.
  std::function<void(const RequestTrace&)> on_request_traced;
};

// The cancellation of one call, shared by its door (which cancels) and its queued
// requests (which the batcher drops, CANCELLED, before compute). Thread-safe.
class Cancellation {
 public:
  // Marks the call cancelled and wakes the batcher its latest request went to, so that
  // the request stops holding queue space now. Idempotent; any thread.
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  friend class RequestPipeline;
  // Remembers the batcher to wake (and keeps it alive); true when the call was
  // cancelled already (then the request must not be queued).
  bool Attach(std::shared_ptr<BatchQueue> batcher);

  std::atomic<bool> cancelled_{false};
  absl::Mutex mu_;
  std::shared_ptr<BatchQueue> batcher_ ABSL_GUARDED_BY(mu_);
};

// An open bidirectional stream, as the pipeline tracks it for draining
// (server/frontends/stream_reactor.h). Thread-safe.
class OpenStream {
 public:
  virtual ~OpenStream() = default;
  // Keeps the stream alive until the matching Unref.
  virtual void Ref() = 0;
  virtual void Unref() = 0;
  // Stops reading; the stream answers what it holds and ends with UNAVAILABLE.
  virtual void Drain() = 0;
};

class RequestPipeline;

// One request (a call, or one message of a stream) from the moment a door hands it to
// the pipeline until its answer. It is counted once when its model is looked up
// (ServiceObserver::on_request_started, under the model's name, or "" when none is
// served by that name) and once when it is answered (on_request_finished); a request
// refused before the lookup (auth, drain) is counted under "". The model it was looked
// up to is kept until the answer, even when that model is replaced or unloaded
// meanwhile, so a request is decoded, admitted and computed by the one model object.
// Made by RequestPipeline::Begin; held by the door in a shared_ptr and passed to Submit
// or SubmitEncode. Find and model() on the door's thread; Finish on any thread.
class Request {
 public:
  ~Request();
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // Looks the model up, once: `name` (empty: the default model) at `version` (empty:
  // the current one). NotFound in the pipeline's words (RequestPipeline::FindModel),
  // which is counted as this request's answer: the door answers it and stops.
  // REQUIRES: called once, before Submit or SubmitEncode.
  absl::Status Find(absl::string_view name, absl::string_view version = "");
  // The model Find found. REQUIRES: Find returned OK.
  const std::shared_ptr<ServedModel>& model() const { return model_; }
  // Counts the answer once: `status`, and the tokens computed (0 unless OK). A door
  // calls it for a refusal of its own (a body it cannot decode); Submit and
  // SubmitEncode call it for theirs. Later calls are ignored.
  void Finish(const absl::Status& status, int64_t tokens = 0);
  // The request's name for its trace and the caller's trace context (the traceparent
  // and tracestate headers; empty when absent), kept for on_request_traced. The gRPC
  // Begin reads the metadata itself. REQUIRES: called before Submit or SubmitEncode,
  // on the door's thread.
  void SetTrace(absl::string_view name, absl::string_view traceparent,
                absl::string_view tracestate);

 private:
  friend class RequestPipeline;
  explicit Request(const RequestPipeline* pipeline);

  const RequestPipeline* const pipeline_;
  const absl::Time start_;
  std::string label_;      // the model's name, or "" (set before on_request_started)
  bool started_ = false;   // on_request_started told (by Find, or by a refusal)
  bool admitted_ = false;  // counted in the pipeline's in-flight calls until Finish
  std::atomic<bool> finished_{false};
  std::shared_ptr<ServedModel> model_;
  // Filled by the door (SetTrace) and the pipeline's phases, each before Finish, which
  // completes it; read only there (Finish runs once).
  RequestTrace trace_;
};

// The call's deadline (InfiniteFuture when it has none).
absl::Time CallDeadline(const grpc::CallbackServerContext* context);

// The call's metadata value under `key` (empty when absent). gRPC fills the metadata map
// on first use, unsynchronized: read it on the thread the call started on.
absl::string_view MetadataValue(const grpc::CallbackServerContext* context,
                                absl::string_view key);

// Thread-safe. Does not own the registry, which must outlive the pipeline and every
// call.
class RequestPipeline {
 public:
  struct Options {
    // Largest answer a door may send (the gRPC max send size); a request whose
    // response could be larger is refused with INVALID_ARGUMENT before any work.
    // Range [1024, 2^31 - 1].
    int64_t max_response_bytes = 64 << 20;
    // Refuse NaN and infinities in float inputs (AdmissionLimits::reject_non_finite).
    bool reject_non_finite = false;
    // Calls (not stream messages) answered at once with RESOURCE_EXHAUSTED (HTTP 429
    // with Retry-After) while this many are in flight, from Begin to their answer, so
    // that a load balancer can send them elsewhere instead of queueing them here; 0:
    // no limit (the queues' byte budgets still hold). Range [0, 2^31 - 1].
    int64_t max_concurrent_requests = 0;
    // When set, calls need a valid bearer token (else UNAUTHENTICATED); health and
    // readiness checks stay open. Not owned.
    TokenAuthenticator* auth = nullptr;
  };

  RequestPipeline(ModelRegistry* registry, const Options& options,
                  ServiceObserver observer = {});
  ~RequestPipeline();
  RequestPipeline(const RequestPipeline&) = delete;
  RequestPipeline& operator=(const RequestPipeline&) = delete;

  // ---- Model lookup.
  // The served model `name` (empty: the default model, when there is one) at
  // `version` (empty: the current one). NotFound, worded the same for every door and
  // every cause, naming what was asked and what is served.
  // The model stays alive while held, even when it is replaced or unloaded meanwhile.
  absl::StatusOr<std::shared_ptr<ServedModel>> FindModel(
      absl::string_view name, absl::string_view version = "") const;
  ModelRegistry* registry() const { return registry_; }

  // ---- Readiness: the one answer every door and gRPC health give.
  // Not draining, and at least one model served.
  bool Ready() const;
  // Not draining, and FindModel(name, version) finds a model. Does not block.
  bool ModelReady(absl::string_view name, absl::string_view version = "") const;
  // The registry's index as every door reports it: while draining, no model is
  // "READY" (each says the server is shutting down); `ready_only` keeps the ready ones.
  std::vector<ModelRegistry::IndexEntry> RepositoryIndex(bool ready_only) const;

  // ---- Auth.
  // OK when `authorization` ("Bearer <token>") is valid or no tokens are configured;
  // UNAUTHENTICATED otherwise.
  absl::Status Authorize(absl::string_view authorization) const;
  // The same for a gRPC call's "authorization" metadata.
  absl::Status Authorize(const grpc::CallbackServerContext* context) const;

  // ---- Drain (one state for every door).
  // From now on new calls are refused UNAVAILABLE before any work; open streams stop
  // reading, answer the messages they already read, and end UNAVAILABLE; readiness
  // answers false everywhere. Does not block. Idempotent.
  void StartDraining();
  bool draining() const { return draining_.load(std::memory_order_acquire); }
  // UNAVAILABLE (the words every door uses) once draining has begun; else OK. For a
  // door to refuse a call before it reads the call's input.
  absl::Status CheckServing() const;
  // Streams register while gRPC holds them (until their OnDone), so that draining
  // reaches them. Returns false when draining: the stream must end at once.
  bool RegisterStream(OpenStream* stream);
  void UnregisterStream(OpenStream* stream);

  // ---- Open calls. Every call of every door counts from its handler's start until
  // its answer has been handed to the transport (gRPC's OnDone; the HTTP write).
  void CallOpened();
  void CallClosed();
  // Blocks until no call is open or `deadline` passes; true when none is open.
  bool AwaitNoOpenCalls(absl::Time deadline);
  int64_t open_calls() const;
  // A reactor for a unary call that is finished from elsewhere (a batcher callback) or
  // at once: it counts as an open call until its OnDone, then deletes itself. With
  // `cancellation`, gRPC's OnCancel (client gone, deadline passed) cancels it.
  grpc::ServerUnaryReactor* NewUnaryReactor(
      std::shared_ptr<Cancellation> cancellation = nullptr);

  // ---- Accounting. StartRpc counts the call and returns its start time; EndRpc
  // counts its outcome; FinishNow does EndRpc and finishes a gRPC call at once.
  absl::Time StartRpc(absl::string_view method) const;
  void EndRpc(absl::string_view method, absl::StatusCode code, absl::Time start) const;
  grpc::ServerUnaryReactor* FinishNow(absl::string_view method, absl::Time start,
                                      const absl::Status& status);
  const ServiceObserver& observer() const { return observer_; }

  // One call's accounting, for a door's handler: counted as started when made, ended
  // once by End or FinishNow. Copyable (a batcher callback may hold it). `method` must
  // be a string literal.
  class Rpc {
   public:
    Rpc(RequestPipeline* pipeline, absl::string_view method)
        : pipeline_(pipeline), method_(method), start_(pipeline->StartRpc(method)) {}
    void End(absl::StatusCode code) const { pipeline_->EndRpc(method_, code, start_); }
    // End, then a reactor finished at once with `status`.
    grpc::ServerUnaryReactor* FinishNow(const absl::Status& status) const {
      return pipeline_->FinishNow(method_, start_, status);
    }

   private:
    RequestPipeline* pipeline_;
    absl::string_view method_;
    absl::Time start_;
  };

  // ---- The request, in the same order at every door: Begin (auth, then drain), the
  // door reads what names the model, Request::Find (the model, once), the door decodes
  // its wire format (Request::Finish on an error of its own), then Submit or
  // SubmitEncode (validation, admission, the deadline, enqueue, the answer).
  // kAuthorized: a call its door has authorized itself (the status page's head view,
  // behind the metrics port's own check); drain and deadline still apply.
  enum class Origin { kCall, kStreamMessage, kAuthorized };
  // A new request. UNAUTHENTICATED when `authorization` ("Bearer <token>") is not
  // valid; UNAVAILABLE for a call once draining has begun; DEADLINE_EXCEEDED when
  // `deadline` (the call's, when the door knows it before reading the body) has
  // passed. A message of an open stream (kStreamMessage) skips all three: its stream
  // was checked when it opened, and once draining the stream stops reading instead. A
  // refusal is already counted (under "", before any lookup) when it is returned: the
  // door answers it. Does not block.
  absl::StatusOr<std::shared_ptr<Request>> Begin(
      absl::string_view authorization, Origin origin = Origin::kCall,
      absl::Time deadline = absl::InfiniteFuture()) const;
  // The same with a gRPC call's "authorization" metadata and deadline; the request is
  // named `name` for its trace, with the call's traceparent and tracestate metadata.
  absl::StatusOr<std::shared_ptr<Request>> Begin(
      const grpc::CallbackServerContext* context, absl::string_view name = "") const;

  // Validates and admits `attend` for `request`'s model, and enqueues it; `done` gets
  // the status and, when OK, the filled response. It runs on a batcher thread, or
  // inline when the request is refused before queueing; either way the request is
  // counted first (Request::Finish). `attend` must stay alive until `done` has run: the
  // queued work reads its tensor bytes in place. `deadline` passes → DEADLINE_EXCEEDED;
  // `cancellation` (may be null) cancelled → CANCELLED; either drops the work before
  // compute. An encoder model is refused INVALID_ARGUMENT.
  // With `statistics` (kept alive by the caller until `done`), the request measures the
  // model's heads instead, and `done` gets an empty response.
  // REQUIRES: `request->Find` returned OK.
  void Submit(const std::shared_ptr<Request>& request, const v1::AttendRequest& attend,
              absl::Time deadline, const std::shared_ptr<Cancellation>& cancellation,
              std::function<void(absl::Status, v1::AttendResponse)> done,
              v1::HeadStatisticsResponse* statistics = nullptr);

  // The same for an encoder model's request (Encode): validated
  // (EncoderWorkFromRequest), admitted and queued on the model's encoder batcher. The
  // work copies what it needs, so `encode` may go once this returns. An attention model
  // is refused INVALID_ARGUMENT, as Submit refuses an encoder.
  // With `statistics` (kept alive by the caller until `done`), the request measures the
  // encoder's heads (AdmitEncoderStatistics) instead, and `done` gets an empty response;
  // with `statistics_attention` too, the first sequence's attention weights and tokens.
  void SubmitEncode(const std::shared_ptr<Request>& request,
                    const v1::EncodeRequest& encode, absl::Time deadline,
                    const std::shared_ptr<Cancellation>& cancellation,
                    std::function<void(absl::Status, v1::EncodeResponse)> done,
                    v1::HeadStatisticsResponse* statistics = nullptr,
                    bool statistics_attention = false);

 private:
  // The limits `model`'s requests are admitted under.
  AdmissionLimits LimitsFor(const ServedModel& model) const;
  // What every validated request does last before Enqueue: DEADLINE_EXCEEDED when
  // `deadline` passed, CANCELLED when `cancellation` (may be null) is; else OK, with
  // `*cancelled` set to the flag the queued work reads and `queue` woken on a cancel.
  absl::Status CheckQueueable(absl::Time deadline,
                              const std::shared_ptr<Cancellation>& cancellation,
                              std::shared_ptr<BatchQueue> queue,
                              std::shared_ptr<const std::atomic<bool>>* cancelled) const;
  // OK, or INTERNAL when `response` is larger than max_response_bytes (admission
  // bounds it already; this guards the invariant, because gRPC aborts the process on
  // a message it cannot serialize).
  absl::Status CheckResponseSize(const google::protobuf::Message& response) const;

  ModelRegistry* const registry_;
  const Options options_;
  const ServiceObserver observer_;
  std::atomic<bool> draining_{false};
  // Calls between Begin and their answer (Options::max_concurrent_requests); Request
  // gives its count back in Finish.
  friend class Request;
  mutable std::atomic<int64_t> in_flight_{0};
  absl::Mutex streams_mu_;
  absl::flat_hash_set<OpenStream*> streams_ ABSL_GUARDED_BY(streams_mu_);
  bool streams_draining_ ABSL_GUARDED_BY(streams_mu_) = false;
  mutable absl::Mutex calls_mu_;
  int64_t open_calls_ ABSL_GUARDED_BY(calls_mu_) = 0;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_PIPELINE_REQUEST_PIPELINE_H_
