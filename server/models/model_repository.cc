#include "server/models/model_repository.h"

#include <algorithm>
#include <cstdint>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace attnserve::server {

ModelFiles FindModelFiles(const std::filesystem::path& model_folder) {
  ModelFiles files{model_folder};
  int64_t highest = -1;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(model_folder, error)) {
    const std::string name = entry.path().filename().string();
    int64_t number = 0;
    if (!entry.is_directory() || name.size() > 18 ||
        !std::all_of(name.begin(), name.end(),
                     [](char c) { return c >= '0' && c <= '9'; }) ||
        !absl::SimpleAtoi(name, &number) || number <= highest) {
      continue;
    }
    std::error_code inner;
    bool has_file = false;
    for (const auto& file : std::filesystem::directory_iterator(entry.path(), inner)) {
      has_file = has_file || file.is_regular_file();
    }
    if (!has_file) continue;
    highest = number;
    files.folder = entry.path();
    files.version = absl::StrCat(number);
  }
  return files;
}

std::string FingerprintFolder(const std::filesystem::path& folder) {
  std::vector<std::string> lines;
  std::error_code error;
  for (auto it = std::filesystem::recursive_directory_iterator(
           folder, std::filesystem::directory_options::follow_directory_symlink, error);
       !error && it != std::filesystem::recursive_directory_iterator();
       it.increment(error)) {
    std::error_code stat_error;
    const auto status = std::filesystem::status(it->path(), stat_error);
    if (stat_error || !std::filesystem::is_regular_file(status)) continue;
    const auto size = std::filesystem::file_size(it->path(), stat_error);
    const auto modified = std::filesystem::last_write_time(it->path(), stat_error);
    if (stat_error) continue;
    lines.push_back(
        absl::StrCat(std::filesystem::relative(it->path(), folder, stat_error).string(),
                     " ", size, " ", modified.time_since_epoch().count()));
  }
  std::sort(lines.begin(), lines.end());
  return absl::StrJoin(lines, "\n");
}

std::vector<std::filesystem::path> ModelFolders(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> folders;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    // Hidden folders are for staging (written there, then renamed into place).
    if (entry.is_directory() && entry.path().filename().string().rfind('.', 0) != 0) {
      folders.push_back(entry.path());
    }
  }
  std::sort(folders.begin(), folders.end());
  return folders;
}

}  // namespace attnserve::server
