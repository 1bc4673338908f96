// StreamReactor: the one implementation of attnserve's bidirectional streams
// (AttendStream, and KServe's ModelStreamInfer), parameterized by the messages they
// carry.
#ifndef ATTNSERVE_SERVER_FRONTENDS_STREAM_REACTOR_H_
#define ATTNSERVE_SERVER_FRONTENDS_STREAM_REACTOR_H_

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "attnserve/v1/attention.pb.h"
#include "core/base/thread_sanitizer.h"
#include "grpcpp/grpcpp.h"
#include "server/batching/attention_executor.h"
#include "server/pipeline/request_pipeline.h"

namespace attnserve::server {

// Stream messages accepted but not yet answered, per stream; reading pauses beyond it so
// that one fast client cannot fill the batcher queue alone.
inline constexpr size_t kMaxStreamInFlight = 64;

// A stream refused before it starts (no valid token): finished at once. An open call
// of `service` until OnDone.
template <typename Read, typename Write>
class RefusedStream final : public grpc::ServerBidiReactor<Read, Write> {
 public:
  RefusedStream(RequestPipeline* service, const grpc::Status& status)
      : service_(service) {
    service_->CallOpened();
    core::TsanHandOff(this);  // gRPC's core runs OnDone on another thread
    this->Finish(status);
  }
  void OnDone() override {
    core::TsanTakeOver(this);
    service_->CallClosed();
    delete this;
  }

 private:
  RequestPipeline* const service_;
};

// A bidirectional stream of attention requests (attnserve's AttendStream, KServe's
// ModelStreamInfer): reads messages continuously, submits each through
// the protocol's Submit, and writes the answers in the order the messages came, one
// write in flight at a time. `Protocol` says what the messages are:
//   using Read = ...; using Write = ...;          // the stream's message types
//   static constexpr char kMethod[] = "...";       // the RPC's name, for metrics
//   static void Submit(RequestPipeline& pipeline, const std::shared_ptr<Request>&
//   request,
//                      const std::shared_ptr<Read>& read, absl::Time call_deadline,
//                      const std::shared_ptr<Cancellation>& cancellation,
//                      const std::function<void(absl::Status, Write)>& answer);
// Submit looks the message's model up (request->Find), converts the message (it may
// move out of `*read`), submits it and calls `answer` exactly once: on a batcher
// thread, or inline when the message is refused before queueing; the message written
// is `answer`'s. Each message is its own Request (Origin::kStreamMessage: the stream was
// authorized when it opened).
//
// Lifetime: a reference count under mu_. gRPC holds one reference from construction to
// OnDone; each submitted message holds one until its answer has been handed on
// (Complete returns); StartDraining holds one while it drains. The last Unref deletes.
// Every method that touches the reactor after releasing mu_ holds a reference, so no
// path can run on a deleted reactor.
//
// gRPC's core (not instrumented) orders each StartRead, StartWrite and Finish before the
// callback it leads to, which may run on another of its threads. TsanHandOff before each
// and TsanTakeOver first in each callback show ThreadSanitizer that order and no more,
// one key per kind: &read_ (StartRead, OnReadDone), &writing_ (StartWrite,
// OnWriteDone), &finished_ (Finish), &start_ (the constructor, for OnCancel); OnDone
// takes over all four. grpcpp reads the reactor's vtable to call a callback before it
// runs, which tsan.supp's race_top entries cover.
template <typename Protocol>
class StreamReactor final
    : public grpc::ServerBidiReactor<typename Protocol::Read, typename Protocol::Write>,
      public OpenStream {
 public:
  using Read = typename Protocol::Read;
  using Write = typename Protocol::Write;

  StreamReactor(RequestPipeline* service, grpc::CallbackServerContext* context)
      : service_(service),
        context_(context),
        cancellation_(std::make_shared<Cancellation>()),
        start_(absl::Now()) {
    service_->CallOpened();
    // The stream's trace context, read here once: message handlers run on other
    // threads (MetadataValue).
    traceparent_ = std::string(MetadataValue(context_, "traceparent"));
    tracestate_ = std::string(MetadataValue(context_, "tracestate"));
    if (service_->observer().on_rpc_started) {
      service_->observer().on_rpc_started(Protocol::kMethod);
    }
    const bool open = service_->RegisterStream(this);
    {
      absl::MutexLock lock(&mu_);
      if (open) {
        issuing_read_ = true;
      } else {
        draining_ = true;
        opened_draining_ = true;
        reads_done_ = true;  // no read is started: the stream ends at once
      }
    }
    core::TsanHandOff(&start_);
    if (open) {
      IssueRead();
    } else {
      Advance();
    }
  }

  void OnReadDone(bool ok) override {
    core::TsanTakeOver(&read_);
    if (!ok) {
      {
        absl::MutexLock lock(&mu_);
        reads_done_ = true;
      }
      Advance();
      return;
    }
    int64_t sequence;
    bool read_more;
    // The work views the request's tensor bytes, so the answer callback owns the
    // messages until the batcher is done with them.
    auto read = std::make_shared<Read>();
    {
      absl::MutexLock lock(&mu_);
      // Taken under the lock: once reading is paused here, Advance on another thread
      // may resume it at once, and gRPC then fills read_ with the next message.
      read->Swap(&read_);
      sequence = next_sequence_++;
      slots_.push_back(Slot{sequence, false, {}});
      ++refs_;  // held by the submitted message until Complete returns
      // While draining no new message is read: the stream ends once these are answered.
      read_more = !draining_ && slots_.size() < kMaxStreamInFlight;
      if (read_more) {
        issuing_read_ = true;
      } else {
        read_paused_ = true;
      }
    }
    if (read_more) IssueRead();
    // A stream's message is never refused by Begin.
    const std::shared_ptr<Request> request =
        *service_->Begin("", RequestPipeline::Origin::kStreamMessage);
    // Each message is a request of its own in the stream's trace.
    request->SetTrace(Protocol::kMethod, traceparent_, tracestate_);
    Protocol::Submit(
        *service_, request, read, CallDeadline(context_), cancellation_,
        [this, sequence, request](const absl::Status& status, Write message) {
          int64_t held = 0;
          // Until it is written, the answer stays counted in its model's queue budget
          // (taken here, before the batcher returns the request's own bytes): a client
          // that stops reading keeps new work out instead of growing memory. The model
          // the message was computed by, held until the answer is written: it may be
          // replaced meanwhile.
          std::shared_ptr<BatchQueue> batcher;
          if (status.ok()) {
            const std::shared_ptr<ServedModel>& model = request->model();
            batcher = std::shared_ptr<BatchQueue>(model, model->queue());
            held = static_cast<int64_t>(message.ByteSizeLong());
            batcher->Hold(held);
          }
          Complete(sequence, std::move(message), batcher, held);
        });
  }

  void OnWriteDone(bool ok) override {
    core::TsanTakeOver(&writing_);
    Slot written;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      written = std::move(slots_.front());
      slots_.pop_front();
      if (!ok) broken_ = true;
    }
    ReleaseHeld(written);
    Advance();
  }

  // gRPC runs OnDone after OnCancel has returned, but orders the two inside its own
  // (uninstrumented) library. The reference held here makes that order visible to
  // ThreadSanitizer through mu_: the last Unref, whichever runs it, deletes.
  void OnCancel() override {
    core::TsanTakeOver(&start_);
    Ref();
    cancellation_->Cancel();
    Unref();
  }

  void OnDone() override {
    core::TsanTakeOver(&start_);
    core::TsanTakeOver(&read_);
    core::TsanTakeOver(&writing_);
    core::TsanTakeOver(&finished_);
    service_->UnregisterStream(this);
    service_->CallClosed();
    Unref();
  }

  // Called by RequestPipeline::StartDraining with a reference held.
  void Drain() override {
    {
      absl::MutexLock lock(&mu_);
      draining_ = true;
    }
    Advance();
  }

  void Ref() override {
    absl::MutexLock lock(&mu_);
    ++refs_;
  }

  void Unref() override {
    bool destroy;
    {
      absl::MutexLock lock(&mu_);
      destroy = --refs_ == 0;
    }
    if (destroy) delete this;
  }

 private:
  struct Slot {
    int64_t sequence = 0;
    bool ready = false;
    Write message;
    // The answer's bytes counted in `batcher`'s budget until written or discarded.
    std::shared_ptr<BatchQueue> batcher;
    int64_t held_bytes = 0;
  };

  static void ReleaseHeld(const Slot& slot) {
    if (slot.batcher != nullptr && slot.held_bytes > 0) {
      slot.batcher->Release(slot.held_bytes);
    }
  }

  // The answer to message `sequence`; runs on a batcher thread (or inline when the
  // message was refused), holding the reference taken in OnReadDone.
  void Complete(int64_t sequence, Write message,
                const std::shared_ptr<BatchQueue>& batcher, int64_t held_bytes) {
    {
      absl::MutexLock lock(&mu_);
      for (Slot& slot : slots_) {
        if (slot.sequence == sequence) {
          slot.ready = true;
          slot.message = std::move(message);
          slot.batcher = batcher;
          slot.held_bytes = held_bytes;
          break;
        }
      }
    }
    Advance();
    Unref();
  }

  // StartRead, decided under the lock with issuing_read_ set; no Finish is decided
  // until the read has been issued, so a read never starts after Finish.
  void IssueRead() {
    core::TsanHandOff(&read_);
    this->StartRead(&read_);
    {
      absl::MutexLock lock(&mu_);
      issuing_read_ = false;
    }
    Advance();
  }

  // Starts the next write, resumes reading, or finishes: decided under the lock, done
  // outside it. The caller holds a reference.
  void Advance() {
    const Write* write = nullptr;
    bool read = false, finish = false;
    grpc::Status finish_status;
    std::vector<Slot> discarded;
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      if (broken_) {
        // The client is gone: answers are discarded as they come.
        while (!slots_.empty() && slots_.front().ready && !writing_) {
          discarded.push_back(std::move(slots_.front()));
          slots_.pop_front();
        }
      } else if (!writing_ && !slots_.empty() && slots_.front().ready) {
        writing_ = true;
        // Deque elements stay put while others are pushed behind them.
        write = &slots_.front().message;
      }
      if (read_paused_ && !reads_done_ && !draining_ &&
          slots_.size() < kMaxStreamInFlight) {
        read_paused_ = false;
        issuing_read_ = true;
        read = true;
      }
      // Draining ends the stream once every message read so far is answered, even
      // with a read still pending (gRPC completes it with ok=false).
      if ((reads_done_ || draining_) && slots_.empty() && !writing_ && !issuing_read_) {
        finished_ = true;
        finish = true;
        if (broken_) {
          finish_status =
              grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading");
        } else if (opened_draining_) {
          // Refused as every door refuses a call while draining.
          finish_status = ToGrpcStatus(service_->CheckServing());
        } else if (draining_) {
          finish_status = grpc::Status(
              grpc::StatusCode::UNAVAILABLE,
              "the server is shutting down; every message sent before was answered; "
              "reopen the stream on another replica");
        } else {
          finish_status = grpc::Status::OK;
        }
      }
    }
    for (const Slot& slot : discarded) ReleaseHeld(slot);
    if (write != nullptr) {
      core::TsanHandOff(&writing_);
      this->StartWrite(write);
    }
    if (finish) {
      if (service_->observer().on_rpc_handled) {
        service_->observer().on_rpc_handled(
            Protocol::kMethod, static_cast<absl::StatusCode>(finish_status.error_code()),
            absl::Now() - start_);
      }
      core::TsanHandOff(&finished_);
      this->Finish(finish_status);
    }
    if (read) IssueRead();
  }

  RequestPipeline* const service_;
  grpc::CallbackServerContext* const context_;
  // The caller's traceparent and tracestate metadata (empty when absent), set once by
  // the constructor.
  std::string traceparent_, tracestate_;
  const std::shared_ptr<Cancellation> cancellation_;
  const absl::Time start_;
  // gRPC fills it between StartRead and OnReadDone; OnReadDone takes the message out
  // under mu_, before anything can start the next read.
  Read read_;

  absl::Mutex mu_;
  int64_t refs_ ABSL_GUARDED_BY(mu_) = 1;  // gRPC's, until OnDone
  // Answers in request order; the front one is written when ready.
  std::deque<Slot> slots_ ABSL_GUARDED_BY(mu_);
  int64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool read_paused_ ABSL_GUARDED_BY(mu_) = false;
  bool issuing_read_ ABSL_GUARDED_BY(mu_) = false;  // a StartRead is being issued
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool opened_draining_ ABSL_GUARDED_BY(mu_) = false;  // opened after draining began
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// attnserve.v1.AttentionService/AttendStream.
struct AttendStreamProtocol {
  using Read = v1::AttendStreamRequest;
  using Write = v1::AttendStreamResponse;
  static constexpr char kMethod[] = "AttendStream";
  static void Submit(RequestPipeline& pipeline, const std::shared_ptr<Request>& request,
                     const std::shared_ptr<Read>& read, absl::Time call_deadline,
                     const std::shared_ptr<Cancellation>& cancellation,
                     const std::function<void(absl::Status, Write)>& answer) {
    const auto reply = [read, answer](absl::Status status, v1::AttendResponse response) {
      Write message;
      if (status.ok()) {
        *message.mutable_response() = std::move(response);
      } else {
        v1::StreamError* error = message.mutable_error();
        error->set_code(static_cast<int>(status.code()));
        error->set_message(std::string(status.message()));
        error->set_request_id(read->request().request_id());
      }
      answer(std::move(status), std::move(message));
    };
    if (absl::Status found = request->Find(read->request().model()); !found.ok()) {
      return reply(found, {});
    }
    // The work views the request's tensor bytes: the callback keeps the message.
    pipeline.Submit(request, read->request(), call_deadline, cancellation, reply);
  }
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FRONTENDS_STREAM_REACTOR_H_
