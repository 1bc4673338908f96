// --help for the project's binaries: their own flags, without build paths, exit 0.
#ifndef ATTNSERVE_CLI_HELP_H_
#define ATTNSERVE_CLI_HELP_H_

#include <initializer_list>
#include <string>

#include "absl/strings/string_view.h"

namespace attnserve::cli {

// The text --help prints: the program usage message (absl::SetProgramUsageMessage),
// then every flag defined in a file whose path ends with one of `own_files`, sorted by
// name, each with its help and default.
std::string HelpText(std::initializer_list<absl::string_view> own_files);

// When argv holds --help, -help, --helpfull, -h or --helpshort: prints HelpText to
// stdout and returns true (the caller exits 0). Call before absl::ParseCommandLine.
bool PrintHelpIfAsked(int argc, char** argv,
                      std::initializer_list<absl::string_view> own_files);

}  // namespace attnserve::cli

#endif  // ATTNSERVE_CLI_HELP_H_
