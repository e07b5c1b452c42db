// The binary as a child process a test can signal and wait for, and polling with a time limit:
// shared by the tests that drive remat-train against signals and other processes
// (test_hardening, test_shared_files). Test-only, header-only.
#pragma once

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

namespace remat::test {

/// Polls `cond` every 20 ms until it holds (true) or `limit_s` seconds pass (false).
inline bool eventually(const std::function<bool()>& cond, double limit_s) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < limit_s) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

/// `sh -c "exec remat-train ARGS"` from the source folder, stdout and stderr into `log`. The pid
/// is the binary's own (exec), in a process group of its own, so a stray signal never reaches
/// the test runner; a child still running when this goes out of scope is killed.
struct Child {
  pid_t pid = -1;
  int status = 0;
  bool reaped = false;

  Child(const std::string& args, const std::string& log) {
    const std::string cmd =
        fmt::format("cd {} && exec {} {} >{} 2>&1", REMAT_SOURCE_DIR, REMAT_BINARY, args, log);
    pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (!reaped && pid > 0) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
  }
  /// Waits up to `limit_s`; false when it is still running.
  bool wait(double limit_s) {
    return eventually([&] { return waitpid(pid, &status, WNOHANG) == pid; }, limit_s) &&
           (reaped = true);
  }
  int exit_code() const { return reaped && WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

}  // namespace remat::test
