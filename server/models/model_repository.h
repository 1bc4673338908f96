// The layout of a model repository on disk (Triton's): its model folders, each
// model's numbered version folders, and a fingerprint of a folder's files for polling.
#ifndef ATTNSERVE_SERVER_MODELS_MODEL_REPOSITORY_H_
#define ATTNSERVE_SERVER_MODELS_MODEL_REPOSITORY_H_

#include <filesystem>
#include <string>
#include <vector>

namespace attnserve::server {

// The version of a model whose folder has no numbered version folders (KServe's
// model_version), and of the built-in model.
inline constexpr char kModelVersion[] = "1";

// Where a model folder's files are: its highest numbered version folder holding a
// file, else the folder itself (version kModelVersion).
struct ModelFiles {
  std::filesystem::path folder;
  std::string version = kModelVersion;
};
ModelFiles FindModelFiles(const std::filesystem::path& model_folder);

// The model folders of the repository at `root`, sorted; hidden folders (staging) are
// skipped. Empty when `root` cannot be read.
std::vector<std::filesystem::path> ModelFolders(const std::filesystem::path& root);

// The files under `folder` (recursively, links followed) as sorted "path size mtime"
// lines: what polling compares between scans.
std::string FingerprintFolder(const std::filesystem::path& folder);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_MODELS_MODEL_REPOSITORY_H_
