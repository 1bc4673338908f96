#include "server/attention_service.h"

#include <cassert>
#include <chrono>
#include <deque>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "server/proto_convert.h"
#include "server/stream_reactor.h"

namespace attnserve::server {

namespace {

absl::Status Unavailable() {
  return absl::UnavailableError("the server is shutting down; retry on another replica");
}

// A unary call, open (AttentionService::CallOpened) until gRPC's OnDone deletes it.
class CountedReactor : public grpc::ServerUnaryReactor {
 public:
  explicit CountedReactor(AttentionService* service) : service_(service) {
    service_->CallOpened();
  }
  void OnDone() override {
    service_->CallClosed();
    delete this;
  }

 private:
  AttentionService* const service_;
};

// A unary Attend call; finished from the batcher's callback.
// A cancellation wakes the model's batcher (not owned; may be null), which then drops
// the request at once, so an abandoned call stops holding queue space.
class AttendReactor final : public CountedReactor {
 public:
  AttendReactor(AttentionService* service, DynamicBatcher* batcher)
      : CountedReactor(service),
        batcher_(batcher),
        cancelled_(std::make_shared<std::atomic<bool>>(false)) {}
  void OnCancel() override {
    cancelled_->store(true, std::memory_order_release);
    if (batcher_ != nullptr) batcher_->Wake();
  }
  std::shared_ptr<std::atomic<bool>> cancelled() const { return cancelled_; }

 private:
  DynamicBatcher* const batcher_;
  std::shared_ptr<std::atomic<bool>> cancelled_;
};

}  // namespace

absl::Time CallDeadline(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

AttentionService::AttentionService(ModelRegistry* registry, const Options& options,
                                   ServiceObserver observer)
    : registry_(registry), options_(options), observer_(std::move(observer)) {}

AttentionService::~AttentionService() {
  absl::MutexLock lock(&streams_mu_);
  // The gRPC server is shut down first, and it waits for every stream's OnDone.
  assert(streams_.empty());
}

bool AttentionService::RegisterStream(OpenStream* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.insert(stream);
  return !streams_draining_;
}

void AttentionService::UnregisterStream(OpenStream* stream) {
  absl::MutexLock lock(&streams_mu_);
  streams_.erase(stream);
}

void AttentionService::DrainStreams() {
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

void AttentionService::StartDraining() {
  draining_.store(true, std::memory_order_release);
  DrainStreams();
}

void AttentionService::CallOpened() {
  absl::MutexLock lock(&calls_mu_);
  ++open_calls_;
}

void AttentionService::CallClosed() {
  absl::MutexLock lock(&calls_mu_);
  --open_calls_;
}

bool AttentionService::AwaitNoOpenCalls(absl::Time deadline) {
  absl::MutexLock lock(&calls_mu_);
  const auto none_open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu_) {
    return open_calls_ == 0;
  };
  return calls_mu_.AwaitWithDeadline(absl::Condition(&none_open), deadline);
}

int64_t AttentionService::open_calls() const {
  absl::MutexLock lock(&calls_mu_);
  return open_calls_;
}

grpc::ServerUnaryReactor* AttentionService::NewUnaryReactor() {
  return new CountedReactor(this);
}

void AttentionService::Submit(const v1::AttendRequest& request, absl::Time deadline,
                              std::shared_ptr<const std::atomic<bool>> cancelled,
                              std::function<void(absl::Status, v1::AttendResponse)> done,
                              v1::HeadStatisticsResponse* statistics, Origin origin) {
  const absl::Time start = absl::Now();
  ServedModel* model = registry_->Find(request.model());
  const std::string model_name = model != nullptr ? model->name : "";
  if (observer_.on_request_started) observer_.on_request_started(model_name);
  auto finish = [this, start, model_name, done = std::move(done)](
                    absl::Status status, v1::AttendResponse response, int64_t tokens) {
    if (observer_.on_request_finished) {
      observer_.on_request_finished(model_name, status, absl::Now() - start, tokens);
    }
    done(std::move(status), std::move(response));
  };
  if (origin == Origin::kCall && draining_.load(std::memory_order_acquire)) {
    finish(Unavailable(), {}, 0);
    return;
  }
  if (model == nullptr) {
    std::vector<std::string> names;
    for (const ServedModel* served : registry_->models()) names.push_back(served->name);
    finish(
        absl::NotFoundError(
            request.model().empty()
                ? absl::StrCat("model must be set: this server has no default model; "
                               "models: ",
                               absl::StrJoin(names, ", "))
                : absl::StrCat("model \"", request.model(),
                               "\" is not served; models: ", absl::StrJoin(names, ", "))),
        {}, 0);
    return;
  }
  AdmissionLimits limits;
  limits.max_sequence_length = model->max_sequence_length;
  limits.max_response_bytes = options_.max_response_bytes;
  limits.max_work_bytes = model->max_queue_bytes;
  limits.weights_for_statistics = statistics != nullptr;
  absl::StatusOr<std::unique_ptr<AttentionWork>> work =
      WorkFromRequest(request, model->spec, limits);
  if (!work.ok()) {
    // The field's limits are the model's: say which model.
    finish(absl::Status(
               work.status().code(),
               absl::StrCat(work.status().message(), " (model \"", model->name, "\")")),
           {}, 0);
    return;
  }
  (*work)->deadline = deadline;
  (*work)->cancelled = std::move(cancelled);
  if (statistics != nullptr) {
    // Admitted above as a request with its attention weights (what the core holds
    // while measuring); the weights stay inside the core.
    (*work)->head_statistics = true;
    (*work)->return_attention = false;
  }
  const int64_t tokens = (*work)->tokens();
  auto format = std::make_shared<ReplyFormat>(ReplyFormatOf(request));
  // The batcher calls back exactly once, unless Enqueue fails (then never).
  auto shared_finish = std::make_shared<decltype(finish)>(std::move(finish));
  const absl::Status enqueued = model->batcher->Enqueue(
      std::move(work).value(),
      [this, model, format, tokens, shared_finish, statistics](
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
          // Admission bounded the size already; this guards the invariant, because gRPC
          // aborts the process on a message it cannot serialize.
          const size_t bytes = response.ByteSizeLong();
          if (bytes > static_cast<size_t>(options_.max_response_bytes)) {
            status = absl::InternalError(absl::StrCat(
                "the response is ", bytes,
                " bytes, over max_message_bytes=", options_.max_response_bytes));
            response.Clear();
          }
        }
        (*shared_finish)(std::move(status), std::move(response),
                         status.ok() ? tokens : 0);
      });
  if (!enqueued.ok()) (*shared_finish)(enqueued, {}, 0);
}

grpc::ServerUnaryReactor* AttentionService::Attend(grpc::CallbackServerContext* context,
                                                   const v1::AttendRequest* request,
                                                   v1::AttendResponse* response) {
  const absl::Time start = StartRpc("Attend");
  if (absl::Status allowed = Authorize(context); !allowed.ok()) {
    return FinishNow("Attend", start, allowed);
  }
  const ServedModel* model = registry_->Find(request->model());
  auto* reactor =
      new AttendReactor(this, model != nullptr ? model->batcher.get() : nullptr);
  Submit(
      *request, CallDeadline(context), reactor->cancelled(),
      [this, start, reactor, response](absl::Status status, v1::AttendResponse result) {
        if (status.ok()) response->Swap(&result);
        EndRpc("Attend", status.code(), start);
        reactor->Finish(ToGrpcStatus(status));
      });
  return reactor;
}

grpc::ServerUnaryReactor* AttentionService::HeadStatistics(
    grpc::CallbackServerContext* context, const v1::HeadStatisticsRequest* request,
    v1::HeadStatisticsResponse* response) {
  const absl::Time start = StartRpc("HeadStatistics");
  if (absl::Status allowed = Authorize(context); !allowed.ok()) {
    return FinishNow("HeadStatistics", start, allowed);
  }
  const ServedModel* model = registry_->Find(request->model());
  auto* reactor =
      new AttendReactor(this, model != nullptr ? model->batcher.get() : nullptr);
  // The same inputs as an Attend with return_attention, so that validation and
  // admission (field names, limits, budgets) are the same. Copied: this is an
  // analysis call, not the serving path.
  auto attend = std::make_shared<v1::AttendRequest>();
  attend->set_model(request->model());
  *attend->mutable_query() = request->query();
  if (request->has_memory()) *attend->mutable_memory() = request->memory();
  attend->set_causal(request->causal());
  attend->set_return_attention(true);
  Submit(
      *attend, CallDeadline(context), reactor->cancelled(),
      [this, start, reactor, response, attend](absl::Status status, v1::AttendResponse) {
        if (!status.ok()) response->Clear();
        EndRpc("HeadStatistics", status.code(), start);
        reactor->Finish(ToGrpcStatus(status));
      },
      response);
  return reactor;
}

grpc::ServerBidiReactor<v1::AttendStreamRequest, v1::AttendStreamResponse>*
AttentionService::AttendStream(grpc::CallbackServerContext* context) {
  if (absl::Status allowed = Authorize(context); !allowed.ok()) {
    EndRpc("AttendStream", allowed.code(), StartRpc("AttendStream"));
    return new RefusedStream<v1::AttendStreamRequest, v1::AttendStreamResponse>(
        this, ToGrpcStatus(allowed));
  }
  return new StreamReactor<AttendStreamProtocol>(this, context);
}

absl::Status AttentionService::Authorize(
    const grpc::CallbackServerContext* context) const {
  if (options_.auth == nullptr) return absl::OkStatus();
  const auto& metadata = context->client_metadata();
  const auto it = metadata.find("authorization");
  return options_.auth->Check(
      it == metadata.end() ? absl::string_view()
                           : absl::string_view(it->second.data(), it->second.size()));
}

grpc::ServerUnaryReactor* AttentionService::ListModels(
    grpc::CallbackServerContext* context, const v1::ListModelsRequest* /*request*/,
    v1::ListModelsResponse* response) {
  const absl::Time start = StartRpc("ListModels");
  if (absl::Status allowed = Authorize(context); !allowed.ok()) {
    return FinishNow("ListModels", start, allowed);
  }
  for (const ServedModel* model : registry_->models())
    *response->add_models() = model->info;
  return FinishNow("ListModels", start, absl::OkStatus());
}

grpc::ServerUnaryReactor* AttentionService::GetModel(grpc::CallbackServerContext* context,
                                                     const v1::GetModelRequest* request,
                                                     v1::GetModelResponse* response) {
  const absl::Time start = StartRpc("GetModel");
  if (absl::Status allowed = Authorize(context); !allowed.ok()) {
    return FinishNow("GetModel", start, allowed);
  }
  const ServedModel* model =
      request->name().empty() ? nullptr : registry_->Find(request->name());
  if (model == nullptr) {
    return FinishNow("GetModel", start,
                     absl::NotFoundError(
                         absl::StrCat("model \"", request->name(), "\" is not served")));
  }
  *response->mutable_model() = model->info;
  return FinishNow("GetModel", start, absl::OkStatus());
}

absl::Time AttentionService::StartRpc(absl::string_view method) const {
  if (observer_.on_rpc_started) observer_.on_rpc_started(method);
  return absl::Now();
}

void AttentionService::EndRpc(absl::string_view method, absl::StatusCode code,
                              absl::Time start) const {
  if (observer_.on_rpc_handled)
    observer_.on_rpc_handled(method, code, absl::Now() - start);
}

grpc::ServerUnaryReactor* AttentionService::FinishNow(absl::string_view method,
                                                      absl::Time start,
                                                      const absl::Status& status) {
  EndRpc(method, status.code(), start);
  grpc::ServerUnaryReactor* reactor = NewUnaryReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace attnserve::server
