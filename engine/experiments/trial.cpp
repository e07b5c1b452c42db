// Child-process trials (see engine/experiments/trial.h).
#include "engine/experiments/trial.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/core/error.h"
#include "engine/experiments/interrupt.h"

extern char** environ;

namespace remat::experiments {
namespace {

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error(fmt::format("[trial] cannot resolve /proc/self/exe: {}", ec.message()));
  return p.string();
}

std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  // Progress lines rewritten in place leave carriage returns; keep the final text.
  if (auto cr = last.rfind('\r'); cr != std::string::npos) last = last.substr(cr + 1);
  return last;
}

std::optional<nlohmann::json> read_summary(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::optional<nlohmann::json> out;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("summary")) out = j["summary"];
  }
  return out;
}

}  // namespace

std::string trial_status(int exit_code) {
  if (exit_code == 0) return "ok";
  if (exit_code == 3) return "oom";
  return "error";
}

TrialResult run_trial(const TrialSpec& spec, const std::function<void()>& tick) {
  static const std::string exe = self_exe();
  char dir_template[] = "/tmp/remat-trial-XXXXXX";
  if (!mkdtemp(dir_template))
    throw IoError(
        fmt::format("[trial] cannot create a temporary folder: {}", std::strerror(errno)));
  const std::string dir = dir_template;
  const std::string metrics = dir + "/metrics.jsonl", err = dir + "/stderr.txt";

  std::vector<std::string> args = {exe, "train", "--config", spec.config_path};
  for (const auto& s : spec.overrides) {
    args.push_back("--set");
    args.push_back(s);
  }
  // A trial measures steps: it writes no checkpoint (nor touches the run's checkpoint.dir) and
  // spends no time on validation.
  for (const char* a : {"--set", "checkpoint.dir=", "--set", "train.eval_every=0"})
    args.emplace_back(a);
  for (const char* a : {"--metrics", metrics.c_str(), "-q"}) args.emplace_back(a);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  // The child leads its own process group, so the parent can signal all of it, and a signal meant
  // for the parent (Ctrl-C reaches the whole foreground group) is forwarded exactly once.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  // A trial is one process of its own: without the MPI launcher's variables, so that a parent
  // started by mpirun does not make its trials join (or hang in) the parent's job.
  std::vector<char*> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view v(*e);
    if (v.starts_with("OMPI_") || v.starts_with("PMIX_") || v.starts_with("PMI_")) continue;
    env.push_back(*e);
  }
  env.push_back(nullptr);
  pid_t pid = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, &attr, argv.data(), env.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    std::filesystem::remove_all(dir);
    throw Error(fmt::format("[trial] cannot start {}: {}", exe, std::strerror(rc)));
  }

  TrialResult r;
  int status = 0;
  bool stopped = false;
  int forwarded = 0;  // signals passed on to the child's group
  int sleep_ms = 2;   // short trials end in milliseconds; long ones are polled 5 times a second
  for (;;) {
    const pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (interrupted() && forwarded < interrupt_count()) {
      // The point is discarded anyway. The first signal is passed on (the child stops after its
      // step); a second one means "now", for the child too.
      kill(-pid, forwarded == 0 ? interrupt_signal() : SIGKILL);
      forwarded = interrupt_count();
      stopped = true;
    }
    if (tick) tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    sleep_ms = std::min(sleep_ms * 2, 200);
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.interrupted = stopped || interrupted();
  r.summary = read_summary(metrics);
  r.message = last_line(err);
  if (r.message.rfind("error: ", 0) == 0) r.message = r.message.substr(7);
  if (WIFSIGNALED(status) && !stopped)
    r.message =
        fmt::format("killed by signal {} ({})", WTERMSIG(status), strsignal(WTERMSIG(status)));
  std::filesystem::remove_all(dir);
  return r;
}

}  // namespace remat::experiments
