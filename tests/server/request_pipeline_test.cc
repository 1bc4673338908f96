// The request pipeline's order, step by step as a door takes it (Begin, Find, decode,
// Submit), with no server: an expired deadline is refused before the lookup, a version
// swap between decode and enqueue leaves the request on the version it looked up, and
// a KServe request's tensor bytes reach the queued work without a copy.
#include "server/pipeline/request_pipeline.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/frontends/kserve_convert.h"
#include "server/models/model_registry.h"
#include "server/pipeline/proto_convert.h"

namespace attnserve::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

void WriteConfig(const fs::path& folder, int seed, int d_model) {
  fs::create_directories(folder);
  std::ofstream(folder / "config.pbtxt")
      << "d_model: " << d_model
      << "\nnum_heads: 2\ngenerated_weights: true\nseed: " << seed << "\n";
}

// What the observer was told: "started MODEL" and "finished MODEL CODE".
class Counts {
 public:
  ServiceObserver observer() {
    ServiceObserver observer;
    observer.on_request_started = [this](const std::string& model) {
      absl::MutexLock lock(&mu_);
      told_.push_back("started " + model);
    };
    observer.on_request_finished = [this](const std::string& model,
                                          const absl::Status& status, absl::Duration,
                                          int64_t) {
      absl::MutexLock lock(&mu_);
      told_.push_back("finished " + model + " " +
                      absl::StatusCodeToString(status.code()));
    };
    return observer;
  }
  std::vector<std::string> told() {
    absl::MutexLock lock(&mu_);
    return told_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> told_ ABSL_GUARDED_BY(mu_);
};

class RequestPipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    repository_ = ::testing::TempDir() + "/pipeline_" +
                  ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(repository_);
    WriteConfig(fs::path(repository_) / "m" / "1", 1, 32);
    ModelRegistry::Options options;
    options.model_repository = repository_;
    options.control_mode = ModelControlMode::kExplicit;
    options.builtin_model = false;
    options.warm_up = false;
    options.poll_interval = absl::Hours(1);
    auto registry = ModelRegistry::Create(options);
    ASSERT_TRUE(registry.ok()) << registry.status();
    registry_ = *std::move(registry);
    pipeline_ = std::make_unique<RequestPipeline>(
        registry_.get(), RequestPipeline::Options{}, counts_.observer());
  }

  static v1::AttendRequest Query(int d_model) {
    v1::AttendRequest attend;
    attend.set_model("m");
    v1::Tensor* query = attend.mutable_query();
    query->set_dtype(v1::DATA_TYPE_FP32);
    query->add_shape(3);
    query->add_shape(d_model);
    const std::vector<float> values(3 * d_model, 0.25f);
    query->set_raw(std::string(reinterpret_cast<const char*>(values.data()),
                               values.size() * sizeof(float)));
    return attend;
  }

  // Submits `attend` for `request` and waits for its answer.
  std::pair<absl::Status, v1::AttendResponse> SubmitAndWait(
      const std::shared_ptr<Request>& request, const v1::AttendRequest& attend,
      absl::Time deadline = absl::InfiniteFuture()) {
    absl::Notification answered;
    std::pair<absl::Status, v1::AttendResponse> answer;
    pipeline_->Submit(request, attend, deadline, nullptr,
                      [&](absl::Status status, v1::AttendResponse response) {
                        answer = {std::move(status), std::move(response)};
                        answered.Notify();
                      });
    answered.WaitForNotification();
    return answer;
  }

  std::string repository_;
  Counts counts_;
  std::unique_ptr<ModelRegistry> registry_;
  std::unique_ptr<RequestPipeline> pipeline_;
};

TEST_F(RequestPipelineTest, AnExpiredDeadlineIsRefusedBeforeTheLookup) {
  const absl::StatusOr<std::shared_ptr<Request>> request = pipeline_->Begin(
      "", RequestPipeline::Origin::kCall, absl::Now() - absl::Seconds(1));
  ASSERT_EQ(request.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(request.status().message(), HasSubstr("before the request was read"));
  // Counted once, under no model: the lookup never ran.
  EXPECT_THAT(counts_.told(), ElementsAre("started ", "finished  DEADLINE_EXCEEDED"));
}

TEST_F(RequestPipelineTest, ADeadlinePassedAfterTheLookupCostsNoValidation) {
  absl::StatusOr<std::shared_ptr<Request>> request = pipeline_->Begin("");
  ASSERT_TRUE(request.ok());
  ASSERT_TRUE((*request)->Find("m").ok());
  // A query of the wrong width would be INVALID_ARGUMENT; the deadline comes first.
  const auto [status, response] =
      SubmitAndWait(*request, Query(48), absl::Now() - absl::Seconds(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(counts_.told(), ElementsAre("started m", "finished m DEADLINE_EXCEEDED"));
}

TEST_F(RequestPipelineTest, AVersionSwapBetweenDecodeAndEnqueueKeepsTheLookedUpVersion) {
  absl::StatusOr<std::shared_ptr<Request>> request = pipeline_->Begin("");
  ASSERT_TRUE(request.ok());
  ASSERT_TRUE((*request)->Find("m").ok());
  const v1::AttendRequest decoded = Query(32);  // decoded against version 1 (d = 32)

  // Version 2 (d = 64) replaces it before the request is enqueued.
  WriteConfig(fs::path(repository_) / "m" / "2", 2, 64);
  ASSERT_TRUE(registry_->Load("m").ok());
  ASSERT_EQ(registry_->Find("m")->version, "2");

  const auto [status, response] = SubmitAndWait(*request, decoded);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(response.model_version(), "1");
  EXPECT_THAT(response.output().shape(), ElementsAre(3, 32));

  // A request that looks the model up now gets version 2, which names its width.
  absl::StatusOr<std::shared_ptr<Request>> next = pipeline_->Begin("");
  ASSERT_TRUE(next.ok());
  ASSERT_TRUE((*next)->Find("m").ok());
  const auto [refused, unused] = SubmitAndWait(*next, Query(32));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("64"));
  EXPECT_THAT(counts_.told(), ElementsAre("started m", "finished m OK", "started m",
                                          "finished m INVALID_ARGUMENT"));
}

TEST(KServeInputTest, RawTensorBytesReachTheQueuedWorkWithoutACopy) {
  auto infer = std::make_shared<inference::ModelInferRequest>();
  infer->set_model_name("m");
  inference::ModelInferRequest::InferInputTensor* input = infer->add_inputs();
  input->set_name("query");
  input->set_datatype("FP32");
  input->add_shape(3);
  input->add_shape(32);
  const std::vector<float> values(3 * 32, 0.5f);
  infer->add_raw_input_contents()->assign(reinterpret_cast<const char*>(values.data()),
                                          values.size() * sizeof(float));
  const char* const wire = infer->raw_input_contents(0).data();

  absl::StatusOr<v1::AttendRequest> attend = AttendFromInfer(infer.get());
  ASSERT_TRUE(attend.ok()) << attend.status();
  // The bytes moved into the request (a swap of the buffer), and the work views them.
  EXPECT_EQ(attend->query().raw().data(), wire);
  core::ModelSpec spec;
  spec.d_model = 32;
  spec.num_heads = 2;
  absl::StatusOr<std::unique_ptr<AttentionWork>> work =
      WorkFromRequest(*attend, spec, AdmissionLimits{});
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_EQ(reinterpret_cast<const char*>((*work)->query.InPlace().data()), wire);
}

}  // namespace
}  // namespace attnserve::server
