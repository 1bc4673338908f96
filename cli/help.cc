#include "cli/help.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace attnserve::cli {

std::string HelpText(std::initializer_list<absl::string_view> own_files) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    for (absl::string_view file : own_files) {
      if (absl::EndsWith(flag->Filename(), file)) flags.push_back(flag);
    }
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string text = absl::StrCat(absl::ProgramUsageMessage(), "\n\nFlags:\n");
  for (const absl::CommandLineFlag* flag : flags) {
    absl::StrAppend(&text, "  --", flag->Name(), "  ", flag->Help(), " (default: \"",
                    flag->DefaultValue(), "\")\n");
  }
  return text;
}

bool PrintHelpIfAsked(int argc, char** argv,
                      std::initializer_list<absl::string_view> own_files) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "--helpfull" || arg == "-h" ||
        arg == "--helpshort") {
      const std::string text = HelpText(own_files);
      std::fwrite(text.data(), 1, text.size(), stdout);
      return true;
    }
  }
  return false;
}

}  // namespace attnserve::cli
