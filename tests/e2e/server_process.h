// Runs the real attnserve binary as a child process for end-to-end tests: starts it
// with flags, reads the port it chose from its first stdout line, signals it, and
// collects its exit code and stderr.
#ifndef ATTNSERVE_TESTS_E2E_SERVER_PROCESS_H_
#define ATTNSERVE_TESTS_E2E_SERVER_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace attnserve::testing {

class ServerProcess {
 public:
  // Starts `binary` with `flags`; stderr goes to `stderr_path`.
  ServerProcess(const std::string& binary, const std::vector<std::string>& flags,
                const std::string& stderr_path)
      : stderr_path_(stderr_path) {
    int out[2];
    if (pipe(out) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> args = {binary};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ) !=
        0) {
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    stdout_ = fdopen(out[0], "r");
  }

  ~ServerProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      Wait();
    }
    if (stdout_ != nullptr) fclose(stdout_);
  }

  // The port from the next stdout line, "attnserve listening on HOST:PORT" (or, with
  // `marker` = "metrics on", "attnserve metrics on HOST:PORT"); -1 if the process ended
  // without printing it.
  int ReadPort(const std::string& marker = "listening on") {
    char line[256];
    if (stdout_ == nullptr || fgets(line, sizeof(line), stdout_) == nullptr) return -1;
    const std::string text(line);
    const size_t colon = text.rfind(':');
    if (text.find(marker) == std::string::npos || colon == std::string::npos) {
      return -1;
    }
    return std::stoi(text.substr(colon + 1));
  }

  void Signal(int signal_number) { kill(pid_, signal_number); }

  pid_t pid() const { return pid_; }

  // Blocks until the process ends; its exit code, or 128 + signal.
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    exited_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::string Stderr() const {
    std::ifstream file(stderr_path_);
    std::stringstream text;
    text << file.rdbuf();
    return text.str();
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  FILE* stdout_ = nullptr;
  std::string stderr_path_;
};

}  // namespace attnserve::testing

#endif  // ATTNSERVE_TESTS_E2E_SERVER_PROCESS_H_
