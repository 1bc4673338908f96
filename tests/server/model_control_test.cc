// Models loaded, replaced and unloaded while the registry serves: explicit loads,
// versions, refused versions, unloads, and polling with its debounce.
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/models/model_registry.h"

namespace attnserve::server {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string NewRepository(const std::string& name) {
  const std::string path = ::testing::TempDir() + "/control_" + name;
  fs::remove_all(path);
  fs::create_directories(path);
  return path;
}

void WriteFile(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string GeneratedConfig(int seed, int d_model = 32) {
  return "d_model: " + std::to_string(d_model) +
         "\nnum_heads: 2\ngenerated_weights: true\nseed: " + std::to_string(seed) + "\n";
}

// Records the registry's events; waits for one.
class Events {
 public:
  std::function<void(const ModelEvent&)> hook() {
    return [this](const ModelEvent& event) {
      absl::MutexLock lock(&mu_);
      seen_.push_back(Describe(event));
    };
  }
  // Blocks until `line` ("freed m 1") was told.
  void Await(const std::string& line) {
    absl::MutexLock lock(&mu_);
    const auto told = [this, &line]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::find(seen_.begin(), seen_.end(), line) != seen_.end();
    };
    mu_.Await(absl::Condition(&told));
  }
  std::vector<std::string> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  static std::string Describe(const ModelEvent& event) {
    static const std::map<ModelEvent::Kind, std::string> kinds = {
        {ModelEvent::Kind::kLoaded, "loaded"},
        {ModelEvent::Kind::kLoadFailed, "failed"},
        {ModelEvent::Kind::kUnloaded, "unloaded"},
        {ModelEvent::Kind::kFreed, "freed"}};
    return kinds.at(event.kind) + " " + event.model + " " + event.version;
  }
  absl::Mutex mu_;
  std::vector<std::string> seen_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<ModelRegistry> MakeRegistry(const std::string& repository,
                                            ModelControlMode mode, Events* events) {
  ModelRegistry::Options options;
  options.model_repository = repository;
  options.control_mode = mode;
  options.builtin_model = false;
  options.warm_up = false;
  options.poll_interval = absl::Hours(1);  // the tests call Poll() themselves
  if (events != nullptr) options.on_event = events->hook();
  auto registry = ModelRegistry::Create(options);
  EXPECT_TRUE(registry.ok()) << registry.status();
  return registry.ok() ? *std::move(registry) : nullptr;
}

TEST(ModelControlTest, ANewVersionTakesNewRequestsAndTheOldIsFreedAfterItsLast) {
  const std::string repository = NewRepository("versions");
  WriteFile(fs::path(repository) / "m" / "1" / "config.pbtxt", GeneratedConfig(1));
  Events events;
  auto registry = MakeRegistry(repository, ModelControlMode::kExplicit, &events);
  ASSERT_NE(registry, nullptr);
  // A request in flight holds the model it was given.
  std::shared_ptr<ServedModel> in_flight = registry->Find("m");
  ASSERT_NE(in_flight, nullptr);
  EXPECT_EQ(in_flight->version, "1");

  WriteFile(fs::path(repository) / "m" / "2" / "config.pbtxt", GeneratedConfig(2, 64));
  ASSERT_TRUE(registry->Load("m").ok());
  const std::shared_ptr<ServedModel> now = registry->Find("m");
  EXPECT_EQ(now->version, "2");
  EXPECT_EQ(now->spec.d_model, 64);
  EXPECT_EQ(now->info.version(), "2");
  // The old one still works for the request that holds it, and is freed with it.
  EXPECT_EQ(in_flight->spec.d_model, 32);
  EXPECT_THAT(events.seen(), ::testing::Not(::testing::Contains("freed m 1")));
  in_flight.reset();
  events.Await("freed m 1");
  EXPECT_THAT(events.seen(), ::testing::ElementsAre("loaded m 2", "freed m 1"));
}

TEST(ModelControlTest, AReplacedVersionLetGoOnItsOwnBatcherIsFreedBeforeTheRegistryGoes) {
  // The last reference to a replaced version can go on that version's own batcher
  // thread (a request's callback holding it), even while the registry is being
  // destroyed: it must be freed on the reaper's thread (which can join the batcher's),
  // and the registry's destruction waits for it.
  const std::string repository = NewRepository("last_on_batcher");
  WriteFile(fs::path(repository) / "m" / "1" / "config.pbtxt", GeneratedConfig(1));
  std::atomic<bool> destroyed{false};
  std::atomic<bool> freed_before_destroyed{false};
  Events events;
  ModelRegistry::Options options;
  options.model_repository = repository;
  options.control_mode = ModelControlMode::kExplicit;
  options.builtin_model = false;
  options.warm_up = false;
  options.poll_interval = absl::Hours(1);
  options.on_event = [&, record = events.hook()](const ModelEvent& event) {
    record(event);
    if (event.kind == ModelEvent::Kind::kFreed && event.version == "1") {
      freed_before_destroyed = !destroyed.load();
    }
  };
  auto created = ModelRegistry::Create(options);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<ModelRegistry> registry = *std::move(created);
  std::shared_ptr<ServedModel> old = registry->Find("m");
  WriteFile(fs::path(repository) / "m" / "2" / "config.pbtxt", GeneratedConfig(2));
  ASSERT_TRUE(registry->Load("m").ok());

  // The callback lets go once the registry is destroyed, or after 2 s: a registry
  // that does not wait is gone by then on any machine (the model then went on its own
  // batcher, which cannot join itself); one that waits is still there, and the test
  // passes however long its destruction takes.
  absl::Notification in_callback, gone;
  auto work = std::make_unique<AttentionWork>();
  work->query = InputTensor::FromFloats(std::vector<float>(32, 0.5f));
  work->query_lengths = {1};
  AttentionBatcher* batcher = old->attention_batcher.get();
  ASSERT_TRUE(batcher
                  ->Enqueue(std::move(work),
                            [held = std::move(old), &in_callback, &gone](
                                absl::Status, std::unique_ptr<AttentionWork>) mutable {
                              in_callback.Notify();
                              gone.WaitForNotificationWithTimeout(absl::Seconds(2));
                              held.reset();  // the last reference, on the batcher
                            })
                  .ok());
  in_callback.WaitForNotification();
  std::thread destroyer([&] {
    registry.reset();
    destroyed = true;
    gone.Notify();
  });
  destroyer.join();
  EXPECT_TRUE(freed_before_destroyed);
  EXPECT_THAT(events.seen(), ::testing::Contains("freed m 1"));
}

TEST(ModelControlTest, ABadNewVersionIsRefusedWithItsReasonAndTheOldKeepsServing) {
  const std::string repository = NewRepository("bad_version");
  WriteFile(fs::path(repository) / "m" / "config.pbtxt", GeneratedConfig(1));
  Events events;
  auto registry = MakeRegistry(repository, ModelControlMode::kExplicit, &events);
  ASSERT_NE(registry, nullptr);
  // Version 2 names weights that are not there.
  WriteFile(fs::path(repository) / "m" / "2" / "config.pbtxt",
            "d_model: 32\nnum_heads: 2\n");
  const absl::Status refused = registry->Load("m");
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(refused.message(), HasSubstr("weights.safetensors"));
  EXPECT_EQ(registry->Find("m")->version, "1");
  const std::vector<ModelRegistry::IndexEntry> index = registry->Index();
  ASSERT_EQ(index.size(), 1u);
  EXPECT_EQ(index[0].state, "READY");
  EXPECT_EQ(index[0].version, "1");
  EXPECT_THAT(index[0].reason, HasSubstr("version 2 failed to load"));
  EXPECT_THAT(events.seen(), ::testing::ElementsAre("failed m 2"));
  // A wrong shape: d_model not divisible by num_heads.
  WriteFile(fs::path(repository) / "m" / "2" / "config.pbtxt",
            "d_model: 30\nnum_heads: 4\ngenerated_weights: true\n");
  EXPECT_EQ(registry->Load("m").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry->Find("m")->version, "1");
}

TEST(ModelControlTest, UnloadStopsNewRequestsAndFreesTheModel) {
  const std::string repository = NewRepository("unload");
  WriteFile(fs::path(repository) / "m" / "config.pbtxt", GeneratedConfig(1));
  Events events;
  auto registry = MakeRegistry(repository, ModelControlMode::kExplicit, &events);
  ASSERT_NE(registry, nullptr);
  ASSERT_TRUE(registry->Unload("m").ok());
  EXPECT_EQ(registry->Find("m"), nullptr);
  events.Await("freed m 1");
  EXPECT_EQ(registry->Unload("m").code(), absl::StatusCode::kNotFound);
  const std::vector<ModelRegistry::IndexEntry> index = registry->Index();
  ASSERT_EQ(index.size(), 1u);
  EXPECT_EQ(index[0].state, "UNAVAILABLE");
  EXPECT_EQ(index[0].reason, "unloaded");
  // And back.
  ASSERT_TRUE(registry->Load("m").ok());
  EXPECT_NE(registry->Find("m"), nullptr);
}

TEST(ModelControlTest, BackgroundControlRunsInOrderOnItsOwnThreadUntilShutdown) {
  const std::string repository = NewRepository("background");
  WriteFile(fs::path(repository) / "m" / "config.pbtxt", GeneratedConfig(1));
  Events events;
  auto registry = MakeRegistry(repository, ModelControlMode::kExplicit, &events);
  ASSERT_NE(registry, nullptr);
  WriteFile(fs::path(repository) / "m" / "2" / "config.pbtxt", GeneratedConfig(2, 64));
  absl::Mutex mu;
  std::vector<std::pair<absl::Status, std::thread::id>> answers;
  const auto record = [&](const absl::Status& status) {
    absl::MutexLock lock(&mu);
    answers.emplace_back(status, std::this_thread::get_id());
  };
  const auto answered = [&](size_t count) {
    absl::MutexLock lock(&mu);
    const auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
      return answers.size() >= count;
    };
    mu.Await(absl::Condition(&enough));
  };
  registry->LoadInBackground("m", std::nullopt, record);
  registry->UnloadInBackground("m", record);
  registry->LoadInBackground("missing", std::nullopt, record);
  answered(3);
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(answers[0].first.ok()) << answers[0].first;
    EXPECT_TRUE(answers[1].first.ok()) << answers[1].first;
    EXPECT_EQ(answers[2].first.code(), absl::StatusCode::kNotFound);
    for (const auto& [status, thread] : answers) {
      EXPECT_NE(thread, std::this_thread::get_id());
      EXPECT_EQ(thread, answers[0].second);  // one control thread
    }
  }
  // The unload ran after the load it followed.
  EXPECT_EQ(registry->Find("m"), nullptr);
  EXPECT_THAT(events.seen(), ::testing::IsSupersetOf({"loaded m 2", "unloaded m 2"}));

  registry->Shutdown();
  registry->LoadInBackground("m", std::nullopt, record);
  answered(4);
  absl::MutexLock lock(&mu);
  EXPECT_EQ(answers[3].first.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(registry->Find("m"), nullptr);
}

TEST(ModelControlTest, BadNamesAndConfigsAreRefusedNamingTheProblem) {
  const std::string repository = NewRepository("names");
  WriteFile(fs::path(repository) / "m" / "config.pbtxt", GeneratedConfig(1));
  auto registry = MakeRegistry(repository, ModelControlMode::kExplicit, nullptr);
  ASSERT_NE(registry, nullptr);
  for (const char* name : {"", "..", "../m", "a/b", ".hidden"}) {
    const absl::Status status = registry->Load(name);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(status.message(), HasSubstr("must name a folder")) << name;
  }
  EXPECT_EQ(registry->Load("absent").code(), absl::StatusCode::kNotFound);
  // A config given with the load replaces config.pbtxt.
  ASSERT_TRUE(
      registry
          ->Load("m", R"({"d_model": 64, "num_heads": 8, "generated_weights": true,
                                  "seed": 3})")
          .ok());
  EXPECT_EQ(registry->Find("m")->spec.num_heads, 8);
  const absl::Status bad_json = registry->Load("m", "{\"d_model\": \"x\"");
  EXPECT_EQ(bad_json.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_json.message(), HasSubstr("config is not a ModelConfig in JSON"));
  const absl::Status bad_field =
      registry->Load("m", R"({"d_model": 64, "num_heads": 5})");
  EXPECT_EQ(bad_field.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry->Find("m")->spec.num_heads, 8);
}

TEST(ModelControlTest, LoadAndUnloadAreRefusedOutsideExplicitMode) {
  const std::string repository = NewRepository("modes");
  WriteFile(fs::path(repository) / "m" / "config.pbtxt", GeneratedConfig(1));
  for (const ModelControlMode mode : {ModelControlMode::kNone, ModelControlMode::kPoll}) {
    auto registry = MakeRegistry(repository, mode, nullptr);
    ASSERT_NE(registry, nullptr);
    EXPECT_EQ(registry->Load("m").code(), absl::StatusCode::kFailedPrecondition);
    const absl::Status unload = registry->Unload("m");
    EXPECT_EQ(unload.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(unload.message(), HasSubstr("--model_control_mode=explicit"));
  }
  EXPECT_THAT(std::string(ParseModelControlMode("sometimes").status().message()),
              HasSubstr("model_control_mode must be none, explicit or poll"));
}

TEST(ModelControlTest, PollingLoadsAFolderOnlyOnceItsFilesHaveSettled) {
  const std::string repository = NewRepository("poll");
  WriteFile(fs::path(repository) / "m" / "config.pbtxt", GeneratedConfig(1));
  Events events;
  auto registry = MakeRegistry(repository, ModelControlMode::kPoll, &events);
  ASSERT_NE(registry, nullptr);
  EXPECT_EQ(registry->Poll(), 0);  // nothing changed

  // A new folder: seen by one scan, loaded by the next if unchanged.
  WriteFile(fs::path(repository) / "n" / "config.pbtxt", GeneratedConfig(2));
  EXPECT_EQ(registry->Poll(), 0);
  EXPECT_EQ(registry->Find("n"), nullptr);
  EXPECT_EQ(registry->Poll(), 1);
  ASSERT_NE(registry->Find("n"), nullptr);

  // A file still being written (it changes between scans) is not loaded.
  const fs::path weights = fs::path(repository) / "m" / "2" / "weights.safetensors";
  WriteFile(fs::path(repository) / "m" / "2" / "config.pbtxt",
            "d_model: 32\nnum_heads: 2\n");
  WriteFile(weights, "partial");
  EXPECT_EQ(registry->Poll(), 0);
  WriteFile(weights, "partial, longer");
  EXPECT_EQ(registry->Poll(), 0);
  // Left half-written for a whole interval: the load is tried, refused, and the old
  // version keeps serving; the same files are not tried again.
  EXPECT_EQ(registry->Poll(), 1);
  EXPECT_EQ(registry->Find("m")->version, "1");
  EXPECT_EQ(registry->Poll(), 0);
  EXPECT_THAT(events.seen(), ::testing::Contains("failed m 2"));

  // Completed (here: generated weights instead): loaded once settled.
  fs::remove(weights);
  WriteFile(fs::path(repository) / "m" / "2" / "config.pbtxt", GeneratedConfig(3));
  EXPECT_EQ(registry->Poll(), 0);
  EXPECT_EQ(registry->Poll(), 1);
  EXPECT_EQ(registry->Find("m")->version, "2");

  // A folder that goes is unloaded.
  fs::remove_all(fs::path(repository) / "n");
  EXPECT_EQ(registry->Poll(), 1);
  EXPECT_EQ(registry->Find("n"), nullptr);
  events.Await("freed n 1");

  // A repository that is gone for a while (a volume remounting) unloads nothing.
  fs::rename(repository, repository + ".away");
  EXPECT_EQ(registry->Poll(), 0);
  EXPECT_NE(registry->Find("m"), nullptr);
  fs::rename(repository + ".away", repository);
  EXPECT_EQ(registry->Poll(), 0);
}

}  // namespace
}  // namespace attnserve::server
