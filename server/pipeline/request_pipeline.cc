#include "server/pipeline/request_pipeline.h"

#include <cassert>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/pipeline/proto_convert.h"

namespace attnserve::server {

namespace {

// A unary call, open (RequestPipeline::CallOpened) until gRPC's OnDone deletes it.
// gRPC's OnCancel (the client went away, or the deadline passed) cancels the call's
// requests, so an abandoned call stops holding queue space.
class CountedReactor final : public grpc::ServerUnaryReactor {
 public:
  CountedReactor(RequestPipeline* pipeline, std::shared_ptr<Cancellation> cancellation)
      : pipeline_(pipeline), cancellation_(std::move(cancellation)) {
    pipeline_->CallOpened();
  }
  // gRPC runs OnDone after OnCancel has returned, but orders the two inside its own
  // (uninstrumented) library; mu_ makes that order visible to ThreadSanitizer.
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    if (cancellation_ != nullptr) cancellation_->Cancel();
  }
  void OnDone() override {
    { absl::MutexLock lock(&mu_); }
    pipeline_->CallClosed();
    delete this;
  }

 private:
  RequestPipeline* const pipeline_;
  const std::shared_ptr<Cancellation> cancellation_;
  absl::Mutex mu_;
};

}  // namespace

void Cancellation::Cancel() {
  // Ordered with Attach by the lock: either this sees the batcher and wakes it, or
  // Attach sees the flag and the request is never queued.
  std::shared_ptr<BatchQueue> batcher;
  {
    absl::MutexLock lock(&mu_);
    cancelled_.store(true);
    batcher = batcher_;
  }
  if (batcher != nullptr) batcher->Wake();
}

bool Cancellation::Attach(std::shared_ptr<BatchQueue> batcher) {
  absl::MutexLock lock(&mu_);
  batcher_ = std::move(batcher);
  return cancelled_.load();
}

absl::Time CallDeadline(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

absl::string_view MetadataValue(const grpc::CallbackServerContext* context,
                                absl::string_view key) {
  const auto& metadata = context->client_metadata();
  const auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  return it == metadata.end() ? absl::string_view()
                              : absl::string_view(it->second.data(), it->second.size());
}

RequestPipeline::RequestPipeline(ModelRegistry* registry, const Options& options,
                                 ServiceObserver observer)
    : registry_(registry), options_(options), observer_(std::move(observer)) {}

RequestPipeline::~RequestPipeline() {
  absl::MutexLock lock(&streams_mu_);
  // The gRPC server is shut down first, and it waits for every stream's OnDone.
  assert(streams_.empty());
}

absl::StatusOr<std::shared_ptr<ServedModel>> RequestPipeline::FindModel(
    absl::string_view name, absl::string_view version) const {
  std::shared_ptr<ServedModel> model = registry_->Find(name);
  if (model != nullptr && (version.empty() || version == model->version)) return model;
  std::vector<std::string> names;
  for (const auto& served : registry_->models()) {
    names.push_back(absl::StrCat(served->name, " (version ", served->version, ")"));
  }
  const std::string served =
      absl::StrCat("served: ", names.empty() ? "none" : absl::StrJoin(names, ", "));
  if (name.empty() && model == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "model must be set: this server has no default model (", served, ")"));
  }
  const std::string asked =
      absl::StrCat("model \"", name.empty() ? absl::string_view(model->name) : name, "\"",
                   version.empty() ? "" : absl::StrCat(" version \"", version, "\""));
  return absl::NotFoundError(absl::StrCat(asked, " is not served (", served, ")"));
}

bool RequestPipeline::Ready() const {
  return !draining() && !registry_->models().empty();
}

bool RequestPipeline::ModelReady(absl::string_view name,
                                 absl::string_view version) const {
  if (draining()) return false;
  const std::shared_ptr<ServedModel> model = registry_->Find(name);
  return model != nullptr && (version.empty() || version == model->version);
}

std::vector<ModelRegistry::IndexEntry> RequestPipeline::RepositoryIndex(
    bool ready_only) const {
  const bool is_draining = draining();
  std::vector<ModelRegistry::IndexEntry> index;
  for (ModelRegistry::IndexEntry& entry : registry_->Index()) {
    if (is_draining && entry.state == "READY") {
      entry.state = "UNAVAILABLE";
      entry.reason = "the server is shutting down";
    }
    if (ready_only && entry.state != "READY") continue;
    index.push_back(std::move(entry));
  }
  return index;
}

absl::Status RequestPipeline::Authorize(absl::string_view authorization) const {
  if (options_.auth == nullptr) return absl::OkStatus();
  return options_.auth->Check(authorization);
}

absl::Status RequestPipeline::Authorize(
    const grpc::CallbackServerContext* context) const {
  if (options_.auth == nullptr) return absl::OkStatus();
  return Authorize(MetadataValue(context, "authorization"));
}

absl::Status RequestPipeline::CheckServing() const {
  if (!draining()) return absl::OkStatus();
  return absl::UnavailableError("the server is shutting down; retry on another replica");
}

void RequestPipeline::StartDraining() {
  draining_.store(true, std::memory_order_release);
  std::vector<OpenStream*> open;
  {
    absl::MutexLock lock(&streams_mu_);
    streams_draining_ = true;
    // A registered stream has not seen OnDone, so gRPC's reference keeps it alive
    // while this one is taken.
    for (OpenStream* stream : streams_) {
      stream->Ref();
      open.push_back(stream);
    }
  }
  for (OpenStream* stream : open) {
    stream->Drain();
    stream->Unref();
  }
}

bool RequestPipeline::RegisterStream(OpenStream* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.insert(stream);
  return !streams_draining_;
}

void RequestPipeline::UnregisterStream(OpenStream* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.erase(stream);
}

void RequestPipeline::CallOpened() {
  absl::MutexLock lock(&calls_mu_);
  ++open_calls_;
}

void RequestPipeline::CallClosed() {
  absl::MutexLock lock(&calls_mu_);
  --open_calls_;
}

bool RequestPipeline::AwaitNoOpenCalls(absl::Time deadline) {
  absl::MutexLock lock(&calls_mu_);
  const auto none_open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu_) {
    return open_calls_ == 0;
  };
  return calls_mu_.AwaitWithDeadline(absl::Condition(&none_open), deadline);
}

int64_t RequestPipeline::open_calls() const {
  absl::MutexLock lock(&calls_mu_);
  return open_calls_;
}

grpc::ServerUnaryReactor* RequestPipeline::NewUnaryReactor(
    std::shared_ptr<Cancellation> cancellation) {
  return new CountedReactor(this, std::move(cancellation));
}

absl::Time RequestPipeline::StartRpc(absl::string_view method) const {
  if (observer_.on_rpc_started) observer_.on_rpc_started(method);
  return absl::Now();
}

void RequestPipeline::EndRpc(absl::string_view method, absl::StatusCode code,
                             absl::Time start) const {
  if (observer_.on_rpc_handled) {
    observer_.on_rpc_handled(method, code, absl::Now() - start);
  }
}

grpc::ServerUnaryReactor* RequestPipeline::FinishNow(absl::string_view method,
                                                     absl::Time start,
                                                     const absl::Status& status) {
  EndRpc(method, status.code(), start);
  grpc::ServerUnaryReactor* reactor = NewUnaryReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

Request::Request(const RequestPipeline* pipeline)
    : pipeline_(pipeline), start_(absl::Now()) {
  trace_.start = start_;
}

void Request::SetTrace(absl::string_view name, absl::string_view traceparent,
                       absl::string_view tracestate) {
  trace_.name = std::string(name);
  // Bounded: W3C's traceparent is 55 characters, tracestate at most 512.
  trace_.traceparent = std::string(traceparent.substr(0, 256));
  trace_.tracestate = std::string(tracestate.substr(0, 1024));
}

Request::~Request() {
  // A door that dropped its request without an answer is a bug; the counts stay whole.
  Finish(absl::InternalError("the request was dropped without an answer"));
}

absl::Status Request::Find(absl::string_view name, absl::string_view version) {
  absl::StatusOr<std::shared_ptr<ServedModel>> found =
      pipeline_->FindModel(name, version);
  absl::Status status = found.status();
  if (status.ok()) {
    model_ = *std::move(found);
    label_ = model_->name;
  }
  started_ = true;
  const ServiceObserver& observer = pipeline_->observer();
  if (observer.on_request_started) observer.on_request_started(label_);
  if (!status.ok()) Finish(status);
  return status;
}

void Request::Finish(const absl::Status& status, int64_t tokens) {
  if (finished_.exchange(true)) return;
  if (admitted_) pipeline_->in_flight_.fetch_sub(1, std::memory_order_acq_rel);
  const ServiceObserver& observer = pipeline_->observer();
  if (!started_ && observer.on_request_started) observer.on_request_started(label_);
  const absl::Time end = absl::Now();
  if (observer.on_request_finished) {
    observer.on_request_finished(label_, status, end - start_, status.ok() ? tokens : 0);
  }
  if (observer.on_request_traced) {
    trace_.end = end;
    trace_.status = status;
    trace_.tokens = status.ok() ? tokens : 0;
    if (model_ != nullptr) {
      trace_.model = model_->name;
      trace_.version = model_->version;
    }
    observer.on_request_traced(trace_);
  }
}

absl::StatusOr<std::shared_ptr<Request>> RequestPipeline::Begin(
    absl::string_view authorization, Origin origin, absl::Time deadline) const {
  std::shared_ptr<Request> request(new Request(this));
  if (origin == Origin::kStreamMessage) return request;
  absl::Status allowed =
      origin == Origin::kAuthorized ? absl::OkStatus() : Authorize(authorization);
  if (allowed.ok()) allowed = CheckServing();
  if (allowed.ok() && deadline <= absl::Now()) {
    allowed =
        absl::DeadlineExceededError("the deadline passed before the request was read");
  }
  if (allowed.ok() && options_.max_concurrent_requests > 0) {
    request->admitted_ = true;
    const int64_t open = in_flight_.fetch_add(1, std::memory_order_acq_rel) + 1;
    if (open > options_.max_concurrent_requests) {
      allowed = absl::ResourceExhaustedError(absl::StrCat(
          "the server is at its limit of ", options_.max_concurrent_requests,
          " concurrent requests (--max_concurrent_requests): retry later or elsewhere"));
      if (observer_.on_overloaded) observer_.on_overloaded();
    }
  }
  if (!allowed.ok()) {
    request->Finish(allowed);
    return allowed;
  }
  return request;
}

absl::StatusOr<std::shared_ptr<Request>> RequestPipeline::Begin(
    const grpc::CallbackServerContext* context, absl::string_view name) const {
  absl::StatusOr<std::shared_ptr<Request>> request = Begin(
      MetadataValue(context, "authorization"), Origin::kCall, CallDeadline(context));
  if (request.ok()) {
    (*request)->SetTrace(name, MetadataValue(context, "traceparent"),
                         MetadataValue(context, "tracestate"));
  }
  return request;
}

AdmissionLimits RequestPipeline::LimitsFor(const ServedModel& model) const {
  AdmissionLimits limits;
  limits.max_sequence_length = model.max_sequence_length;
  limits.max_response_bytes = options_.max_response_bytes;
  limits.reject_non_finite = options_.reject_non_finite;
  limits.max_work_bytes = model.max_queue_bytes;
  if (model.max_text_tokens > 0) limits.max_text_tokens = model.max_text_tokens;
  limits.auto_truncate = model.auto_truncate;
  if (model.is_encoder()) limits.text_config = &model.info.encoder();
  return limits;
}

namespace {

// DEADLINE_EXCEEDED once `deadline` has passed: checked before validation (no work is
// spent on a request nobody waits for) and again before queueing (tokenizing takes time).
absl::Status CheckDeadline(absl::Time deadline) {
  if (deadline > absl::Now()) return absl::OkStatus();
  return absl::DeadlineExceededError("the deadline passed before the request was queued");
}

}  // namespace

absl::Status RequestPipeline::CheckQueueable(
    absl::Time deadline, const std::shared_ptr<Cancellation>& cancellation,
    std::shared_ptr<BatchQueue> queue,
    std::shared_ptr<const std::atomic<bool>>* cancelled) const {
  if (absl::Status timely = CheckDeadline(deadline); !timely.ok()) return timely;
  if (cancellation == nullptr) return absl::OkStatus();
  if (cancellation->Attach(std::move(queue))) {
    return absl::CancelledError("the call was cancelled before it was queued");
  }
  // The work reads the flag; the Cancellation stays alive with it.
  *cancelled =
      std::shared_ptr<const std::atomic<bool>>(cancellation, &cancellation->cancelled_);
  return absl::OkStatus();
}

absl::Status RequestPipeline::CheckResponseSize(
    const google::protobuf::Message& response) const {
  const size_t bytes = response.ByteSizeLong();
  if (bytes <= static_cast<size_t>(options_.max_response_bytes)) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("the response is ", bytes,
                   " bytes, over max_message_bytes=", options_.max_response_bytes));
}

namespace {

// A validation error, naming the model whose limits the field was checked against.
absl::Status ForModel(const absl::Status& status, const ServedModel& model) {
  return absl::Status(status.code(),
                      absl::StrCat(status.message(), " (model \"", model.name, "\")"));
}

}  // namespace

void RequestPipeline::Submit(const std::shared_ptr<Request>& request,
                             const v1::AttendRequest& attend, absl::Time deadline,
                             const std::shared_ptr<Cancellation>& cancellation,
                             std::function<void(absl::Status, v1::AttendResponse)> done,
                             v1::HeadStatisticsResponse* statistics) {
  const auto refuse = [&](const absl::Status& status) {
    request->Finish(status);
    done(status, {});
  };
  std::shared_ptr<ServedModel> model = request->model();
  if (model->is_encoder()) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "model \"", model->name,
        "\" is an encoder: send token ids to Encode (KServe: input \"input_ids\")")));
  }
  if (absl::Status timely = CheckDeadline(deadline); !timely.ok()) return refuse(timely);
  AdmissionLimits limits = LimitsFor(*model);
  limits.weights_for_statistics = statistics != nullptr;
  request->trace_.validate_start = absl::Now();
  absl::StatusOr<std::unique_ptr<AttentionWork>> work =
      WorkFromRequest(attend, model->spec, limits);
  request->trace_.validate = absl::Now() - request->trace_.validate_start;
  if (!work.ok()) return refuse(ForModel(work.status(), *model));
  if (absl::Status queueable = CheckQueueable(
          deadline, cancellation,
          std::shared_ptr<BatchQueue>(model, model->attention_batcher.get()),
          &(*work)->cancelled);
      !queueable.ok()) {
    return refuse(queueable);
  }
  (*work)->deadline = deadline;
  if (statistics != nullptr) {
    // Admitted above as a request with its attention weights (what the core holds
    // while measuring); the weights stay inside the core.
    (*work)->head_statistics = true;
    (*work)->return_attention = false;
  }
  const int64_t tokens = (*work)->tokens();
  request->trace_.enqueued = absl::Now();
  auto format = std::make_shared<ReplyFormat>(ReplyFormatOf(attend));
  auto answer = std::make_shared<std::function<void(absl::Status, v1::AttendResponse)>>(
      std::move(done));
  // The batcher calls back exactly once, unless Enqueue fails (then never).
  const absl::Status enqueued = model->attention_batcher->Enqueue(
      std::move(work).value(),
      [this, request, model, format, tokens, answer, statistics](
          absl::Status status, std::unique_ptr<AttentionWork> result) {
        v1::AttendResponse response;
        if (status.ok() && statistics != nullptr) {
          statistics->set_model(model->name);
          statistics->set_tokens(tokens);
          for (size_t head = 0; head < result->statistics.size(); ++head) {
            const core::HeadStatistic& figures = result->statistics[head];
            v1::HeadStatistic* entry = statistics->add_heads();
            entry->set_head(static_cast<int64_t>(head));
            entry->set_pruned(model->spec.IsPruned(static_cast<int64_t>(head)));
            entry->set_mean_entropy(figures.mean_entropy);
            entry->set_mean_max_weight(figures.mean_max_weight);
            entry->set_mean_output_norm(figures.mean_output_norm);
          }
        } else if (status.ok()) {
          FillResponse(*format, *result, model->name, model->spec.num_heads, &response);
          response.set_model_version(model->version);
          status = CheckResponseSize(response);
          if (!status.ok()) response.Clear();
        }
        if (result != nullptr) {
          request->trace_.queue = result->queue_time;
          request->trace_.compute = result->compute_time;
          request->trace_.batch_size = result->batch_size;
          request->trace_.batch_id = result->batch_id;
        }
        request->Finish(status, tokens);
        (*answer)(std::move(status), std::move(response));
      });
  if (!enqueued.ok()) {
    request->Finish(enqueued);
    (*answer)(enqueued, {});
  }
}

void RequestPipeline::SubmitEncode(
    const std::shared_ptr<Request>& request, const v1::EncodeRequest& encode,
    absl::Time deadline, const std::shared_ptr<Cancellation>& cancellation,
    std::function<void(absl::Status, v1::EncodeResponse)> done,
    v1::HeadStatisticsResponse* statistics, bool statistics_attention) {
  const auto refuse = [&](const absl::Status& status) {
    request->Finish(status);
    done(status, {});
  };
  std::shared_ptr<ServedModel> model = request->model();
  if (!model->is_encoder()) {
    return refuse(absl::InvalidArgumentError(absl::StrCat(
        "model \"", model->name,
        "\" is an attention layer, not an encoder: send [L, d_model] queries "
        "to Attend (KServe: input \"query\")")));
  }
  if (absl::Status timely = CheckDeadline(deadline); !timely.ok()) return refuse(timely);
  const absl::Time decode_start = absl::Now();
  absl::StatusOr<std::unique_ptr<EncoderWork>> work =
      EncoderWorkFromRequest(encode, model->encoder_spec, LimitsFor(*model),
                             model->tokenizer.get(), model->score_activation);
  const absl::Duration tokenize = absl::Now() - decode_start;
  const int64_t tokenize_us = absl::ToInt64Microseconds(tokenize);
  request->trace_.validate_start = decode_start;
  request->trace_.validate = tokenize;
  if (!work.ok()) return refuse(ForModel(work.status(), *model));
  if (statistics != nullptr) {
    if (absl::Status admitted = AdmitEncoderStatistics(
            model->encoder_spec, LimitsFor(*model), statistics_attention, work->get());
        !admitted.ok()) {
      return refuse(ForModel(admitted, *model));
    }
  }
  if (absl::Status queueable =
          CheckQueueable(deadline, cancellation,
                         std::shared_ptr<BatchQueue>(model, model->encoder_batcher.get()),
                         &(*work)->cancelled);
      !queueable.ok()) {
    return refuse(queueable);
  }
  (*work)->deadline = deadline;
  if ((*work)->truncated > 0 && observer_.on_texts_truncated) {
    observer_.on_texts_truncated(model->name, (*work)->truncated);
  }
  const int64_t tokens = (*work)->tokens();
  request->trace_.enqueued = absl::Now();
  auto answer = std::make_shared<std::function<void(absl::Status, v1::EncodeResponse)>>(
      std::move(done));
  const absl::Status enqueued = model->encoder_batcher->Enqueue(
      std::move(work).value(),
      [this, request, model, tokens, answer, statistics, tokenize_us,
       request_id = encode.request_id()](absl::Status status,
                                         std::unique_ptr<EncoderWork> result) {
        v1::EncodeResponse response;
        if (status.ok() && statistics != nullptr) {
          FillEncoderStatistics(*result, model->encoder_spec, model->name,
                                model->tokenizer.get(), statistics);
        } else if (status.ok()) {
          const auto sequences = static_cast<int64_t>(result->lengths.size());
          if (!result->scores.empty() && observer_.on_sequences_scored) {
            observer_.on_sequences_scored(model->name, sequences);
          }
          FillEncodeResponse(*result, model->name, request_id, model->spec.d_model,
                             &response);
          response.set_model_version(model->version);
          response.set_tokenize_time_us(tokenize_us);
          status = CheckResponseSize(response);
          if (!status.ok()) response.Clear();
        }
        if (result != nullptr) {
          request->trace_.queue = result->queue_time;
          request->trace_.compute = result->compute_time;
          request->trace_.batch_size = result->batch_size;
          request->trace_.batch_id = result->batch_id;
        }
        request->Finish(status, tokens);
        (*answer)(std::move(status), std::move(response));
      });
  if (!enqueued.ok()) {
    request->Finish(enqueued);
    (*answer)(enqueued, {});
  }
}

}  // namespace attnserve::server
