#include "server/models/model_registry.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/base/status_macros.h"
#include "server/models/model_loader.h"
#include "server/models/model_repository.h"

namespace attnserve::server {

absl::StatusOr<ModelControlMode> ParseModelControlMode(absl::string_view text) {
  if (text == "none") return ModelControlMode::kNone;
  if (text == "explicit") return ModelControlMode::kExplicit;
  if (text == "poll") return ModelControlMode::kPoll;
  return absl::InvalidArgumentError(absl::StrCat(
      "model_control_mode must be none, explicit or poll, got \"", text, "\""));
}

class ModelRegistry::Reaper {
 public:
  explicit Reaper(std::function<void(const ModelEvent&)> tell)
      : tell_(std::move(tell)), thread_([this] { Loop(); }) {}

  // A model was adopted: it is freed here once retired.
  void Adopted() {
    absl::MutexLock lock(&mu_);
    ++live_;
  }

  // The last reference to `model` went (on any thread, a batcher's included: which is
  // why it is freed on the reaper's thread, which can join the batcher's).
  void Retire(ServedModel* model) {
    absl::MutexLock lock(&mu_);
    retired_.push_back(model);
  }

  // Waits until every adopted model has been retired and freed (a request still
  // holding an old version lets go of it when its callback returns), then joins the
  // thread.
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

 private:
  void Loop() {
    while (true) {
      ServedModel* model = nullptr;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](Reaper* reaper) ABSL_EXCLUSIVE_LOCKS_REQUIRED(reaper->mu_) {
              return (reaper->stopping_ && reaper->live_ == 0) ||
                     !reaper->retired_.empty();
            },
            this));
        if (retired_.empty()) return;  // stopping, and nothing is left to free
        model = retired_.front();
        retired_.erase(retired_.begin());
      }
      Free(model);
      absl::MutexLock lock(&mu_);
      --live_;
    }
  }

  void Free(ServedModel* model) {
    // Its queue is empty (every request held the model), so this only joins.
    model->queue()->Shutdown();
    ModelEvent event{ModelEvent::Kind::kFreed, model->name, model->version, ""};
    delete model;
#ifdef __GLIBC__
    // The server keeps freed memory for reuse (transport::KeepAllocatorMemory's
    // thresholds); an unloaded model's goes back to the system here.
    malloc_trim(0);
#endif
    if (tell_) tell_(event);
  }

  const std::function<void(const ModelEvent&)> tell_;
  absl::Mutex mu_;
  std::vector<ServedModel*> retired_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;  // adopted and not yet freed
  std::thread thread_;
};

ModelRegistry::ModelRegistry(const Options& options)
    : options_(options), reaper_(std::make_shared<Reaper>(options.on_event)) {}

ModelRegistry::~ModelRegistry() {
  Shutdown();
  {
    absl::MutexLock lock(&mu_);
    models_.clear();
  }
  reaper_->Stop();
}

std::shared_ptr<ServedModel> ModelRegistry::Adopt(std::unique_ptr<ServedModel> model) {
  // The deleter runs wherever the last request lets go: the reaper frees it.
  reaper_->Adopted();
  return std::shared_ptr<ServedModel>(
      model.release(),
      [reaper = reaper_](ServedModel* retired) { reaper->Retire(retired); });
}

void ModelRegistry::Tell(const ModelEvent& event) const {
  if (options_.on_event) options_.on_event(event);
}

absl::StatusOr<std::unique_ptr<ModelRegistry>> ModelRegistry::Create(
    const Options& options) {
  if (options.max_sequence_length < 1 ||
      options.max_sequence_length > kMaxSequenceLengthCeiling) {
    return absl::InvalidArgumentError(absl::StrCat("max_sequence_length must be in [1, ",
                                                   kMaxSequenceLengthCeiling, "], got ",
                                                   options.max_sequence_length));
  }
  if (options.control_mode != ModelControlMode::kNone &&
      options.model_repository.empty()) {
    return absl::InvalidArgumentError(
        "model_control_mode explicit or poll needs a --model_repository to load from");
  }
  if (options.control_mode == ModelControlMode::kPoll &&
      (options.poll_interval < absl::Milliseconds(10) ||
       options.poll_interval > absl::Hours(24))) {
    return absl::InvalidArgumentError(
        absl::StrCat("repository_poll_interval must be in [10ms, 24h], got ",
                     absl::FormatDuration(options.poll_interval)));
  }
#ifdef __GLIBC__
  if (options.control_mode != ModelControlMode::kNone) {
    // Models come and go: their memory must go back to the system when they do. The
    // server keeps freed memory for reuse (transport::KeepAllocatorMemory), and
    // malloc_trim returns only the main arena's free top: with glibc's default of 8
    // arenas per core, 20-25 MiB of an unloaded d=1024 model stayed resident in the
    // others (RSS after unloading rose from 33 to 59 MiB over a few load cycles); with
    // one arena it stayed at 33. Small allocations still come from each thread's own
    // cache without the arena's lock.
    mallopt(M_ARENA_MAX, 1);
  }
#endif
  std::unique_ptr<ModelRegistry> registry(new ModelRegistry(options));
  absl::MutexLock load_lock(&registry->load_mu_);
  absl::MutexLock lock(&registry->mu_);
  std::string only_repository_model;  // set when the repository holds exactly one
  if (!options.model_repository.empty()) {
    const std::filesystem::path root(options.model_repository);
    std::error_code error;
    if (!std::filesystem::is_directory(root, error)) {
      return absl::NotFoundError(absl::StrCat(
          "model repository \"", options.model_repository, "\" is not a directory"));
    }
    const std::vector<std::filesystem::path> folders = ModelFolders(root);
    for (const auto& folder : folders) {
      Folder& seen = registry->folders_[folder.filename().string()];
      seen.seen = FingerprintFolder(folder);
      ATTN_ASSIGN_OR_RETURN(std::unique_ptr<ServedModel> model,
                            LoadRepositoryModel(folder, FindModelFiles(folder), options));
      seen.served = seen.seen;
      if (folders.size() == 1) only_repository_model = model->name;
      const std::string name = model->name;
      registry->models_.emplace(name, registry->Adopt(std::move(model)));
    }
  }
  if (options.builtin_model && registry->models_.count(kDefaultModelName) == 0) {
    ATTN_ASSIGN_OR_RETURN(std::unique_ptr<ServedModel> model, MakeBuiltinModel(options));
    registry->models_.emplace(kDefaultModelName, registry->Adopt(std::move(model)));
  }
  if (registry->models_.empty() && options.control_mode == ModelControlMode::kNone) {
    return absl::InvalidArgumentError(
        "no models to serve: --builtin_model=false needs a --model_repository with at "
        "least one model");
  }
  if (!options.default_model.empty()) {
    if (registry->models_.count(options.default_model) == 0) {
      std::vector<std::string> names;
      for (const auto& [name, model] : registry->models_) names.push_back(name);
      return absl::InvalidArgumentError(
          absl::StrCat("default_model \"", options.default_model,
                       "\" is not served; models: ", absl::StrJoin(names, ", ")));
    }
    registry->default_model_ = options.default_model;
  } else if (!only_repository_model.empty()) {
    // A repository of one model is what its operator means to serve: the built-in
    // model beside it is for trying the server.
    registry->default_model_ = only_repository_model;
  } else if (registry->models_.count(kDefaultModelName) != 0) {
    registry->default_model_ = kDefaultModelName;
  }
  if (options.control_mode == ModelControlMode::kPoll) {
    registry->poller_ = std::thread([raw = registry.get()] { raw->PollLoop(); });
  }
  return registry;
}

std::shared_ptr<ServedModel> ModelRegistry::Find(absl::string_view name) const {
  if (name.empty() && default_model_.empty()) return nullptr;
  absl::MutexLock lock(&mu_);
  const auto it = models_.find(name.empty() ? absl::string_view(default_model_) : name);
  return it == models_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<const ServedModel>> ModelRegistry::models() const {
  std::vector<std::shared_ptr<const ServedModel>> result;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, model] : models_) result.push_back(model);
  return result;
}

std::vector<ModelRegistry::IndexEntry> ModelRegistry::Index() const {
  std::map<std::string, IndexEntry> entries;
  if (!options_.model_repository.empty()) {
    for (const auto& folder : ModelFolders(options_.model_repository)) {
      const std::string name = folder.filename().string();
      entries[name] = {name, FindModelFiles(folder).version, "UNAVAILABLE", "unloaded"};
    }
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [name, model] : models_) {
    entries[name] = {name, model->version, "READY", ""};
  }
  for (const auto& [name, reason] : load_errors_) {
    IndexEntry& entry = entries[name];
    entry.name = name;
    if (entry.state.empty()) entry.state = "UNAVAILABLE";
    entry.reason = reason;
  }
  std::vector<IndexEntry> result;
  for (auto& [name, entry] : entries) result.push_back(std::move(entry));
  return result;
}

absl::Status ModelRegistry::CheckExplicitControl(absl::string_view done) const {
  if (options_.control_mode == ModelControlMode::kExplicit) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "models are ", done,
      " by the repository API only under --model_control_mode=explicit (this server: ",
      options_.control_mode == ModelControlMode::kNone ? "none" : "poll", ")"));
}

absl::Status ModelRegistry::Load(absl::string_view name,
                                 const std::optional<std::string>& config_json) {
  ATTN_RETURN_IF_ERROR(CheckExplicitControl("loaded"));
  absl::MutexLock lock(&load_mu_);
  return LoadLocked(name, config_json);
}

absl::Status ModelRegistry::LoadLocked(absl::string_view name,
                                       const std::optional<std::string>& config_json) {
  if (name.empty() || name == "." || name == ".." || name[0] == '.' ||
      name.find('/') != absl::string_view::npos ||
      name.find('\\') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("model name \"", name, "\" must name a folder of the repository"));
  }
  const std::filesystem::path folder =
      std::filesystem::path(options_.model_repository) / std::string(name);
  std::error_code error;
  if (!std::filesystem::is_directory(folder, error)) {
    return absl::NotFoundError(absl::StrCat("model \"", name, "\" has no folder in the ",
                                            "repository ", options_.model_repository));
  }
  const Fingerprint files = FingerprintFolder(folder);
  const ModelFiles model_files = FindModelFiles(folder);
  const std::string& version = model_files.version;
  absl::StatusOr<std::unique_ptr<ServedModel>> loaded =
      LoadRepositoryModel(folder, model_files, options_, config_json);
  if (!loaded.ok()) {
    folders_[std::string(name)].failed = files;
    {
      absl::MutexLock lock(&mu_);
      load_errors_[std::string(name)] = absl::StrCat(
          "version ", version, " failed to load: ", loaded.status().message());
    }
    Tell({ModelEvent::Kind::kLoadFailed, std::string(name), version,
          std::string(loaded.status().message())});
    return loaded.status();
  }
  folders_[std::string(name)].served = files;
  const std::string loaded_version = (*loaded)->version;
  std::shared_ptr<ServedModel> replaced = Adopt(*std::move(loaded));
  {
    absl::MutexLock lock(&mu_);
    models_[std::string(name)].swap(replaced);
    load_errors_.erase(std::string(name));
  }
  Tell({ModelEvent::Kind::kLoaded, std::string(name), loaded_version, ""});
  // `replaced` (the model served before, if any) goes here; its last request frees it.
  return absl::OkStatus();
}

absl::Status ModelRegistry::Unload(absl::string_view name) {
  ATTN_RETURN_IF_ERROR(CheckExplicitControl("unloaded"));
  absl::MutexLock lock(&load_mu_);
  return UnloadLocked(name);
}

absl::Status ModelRegistry::UnloadLocked(absl::string_view name) {
  std::shared_ptr<ServedModel> unloaded;
  {
    absl::MutexLock lock(&mu_);
    const auto it = models_.find(name);
    if (it == models_.end()) {
      return absl::NotFoundError(absl::StrCat("model \"", name, "\" is not loaded"));
    }
    unloaded = std::move(it->second);
    models_.erase(it);
  }
  if (auto it = folders_.find(name); it != folders_.end()) it->second.served.clear();
  // New requests no longer find it; the queued ones are computed before it is freed.
  unloaded->queue()->Flush();
  Tell({ModelEvent::Kind::kUnloaded, unloaded->name, unloaded->version, ""});
  return absl::OkStatus();
}

void ModelRegistry::LoadInBackground(std::string name,
                                     std::optional<std::string> config_json,
                                     std::function<void(absl::Status)> done) {
  PostControl([this, name = std::move(name),
               config_json = std::move(config_json)] { return Load(name, config_json); },
              std::move(done));
}

void ModelRegistry::UnloadInBackground(std::string name,
                                       std::function<void(absl::Status)> done) {
  PostControl([this, name = std::move(name)] { return Unload(name); }, std::move(done));
}

void ModelRegistry::PostControl(std::function<absl::Status()> job,
                                std::function<void(absl::Status)> done) {
  const absl::Status stopping =
      absl::UnavailableError("the server is shutting down; models are not changed");
  {
    absl::MutexLock lock(&control_mu_);
    if (!control_closed_) {
      control_jobs_.push_back([this, job = std::move(job), done, stopping] {
        bool stopped;
        {
          absl::MutexLock lock(&mu_);
          stopped = stopping_;
        }
        done(stopped ? stopping : job());
      });
      if (!control_thread_.joinable()) {
        control_thread_ = std::thread([this] { ControlLoop(); });
      }
      return;
    }
  }
  done(stopping);
}

void ModelRegistry::ControlLoop() {
  while (true) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&control_mu_);
      const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mu_) {
        return control_closed_ || !control_jobs_.empty();
      };
      control_mu_.Await(absl::Condition(&ready));
      if (control_jobs_.empty()) return;  // closed, and every job answered
      job = std::move(control_jobs_.front());
      control_jobs_.pop_front();
    }
    job();
  }
}

int ModelRegistry::Poll() {
  absl::MutexLock lock(&load_mu_);
  // A repository that is not there now (a volume remounting) unloads nothing.
  std::error_code error;
  if (!std::filesystem::is_directory(options_.model_repository, error)) return 0;
  int changes = 0;
  std::set<std::string> present;
  for (const auto& folder : ModelFolders(options_.model_repository)) {
    const std::string name = folder.filename().string();
    present.insert(name);
    Folder& state = folders_[name];
    const Fingerprint files = FingerprintFolder(folder);
    // Unchanged for one whole interval: not being written any more.
    const bool settled = files == state.seen;
    state.seen = files;
    if (!settled || files == state.served || files == state.failed) continue;
    (void)LoadLocked(name, std::nullopt);  // a failure is told, and the old one stays
    ++changes;
  }
  for (auto it = folders_.begin(); it != folders_.end();) {
    if (present.count(it->first) != 0) {
      ++it;
      continue;
    }
    if (!it->second.served.empty() && UnloadLocked(it->first).ok()) ++changes;
    {
      absl::MutexLock errors_lock(&mu_);
      load_errors_.erase(it->first);
    }
    it = folders_.erase(it);
  }
  return changes;
}

void ModelRegistry::PollLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Wakes early only for Shutdown.
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.poll_interval);
    if (stopping_) break;
    mu_.Unlock();
    Poll();
    mu_.Lock();
  }
}

void ModelRegistry::Flush() {
  for (const auto& model : models()) model->queue()->Flush();
}

void ModelRegistry::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (poller_.joinable()) poller_.join();
  {
    // Posted loads are answered (UNAVAILABLE from now on); none starts later.
    absl::MutexLock lock(&control_mu_);
    control_closed_ = true;
  }
  if (control_thread_.joinable()) control_thread_.join();
  for (const auto& model : models()) model->queue()->Shutdown();
}

}  // namespace attnserve::server
