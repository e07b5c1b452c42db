// One run per checkpoint folder (see engine/training/run_lock.h).
#include "engine/training/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "engine/core/error.h"
#include "engine/core/regular_file.h"

namespace remat {
namespace {

constexpr const char* kLockName = ".lock";
// The holder's line is one line; anything longer is not ours.
constexpr uint64_t kMaxHolderBytes = 4096;

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

[[noreturn]] void cannot_lock(const std::string& what, const std::string& path, int err) {
  throw CheckpointError(fmt::format(
      "[checkpoint] cannot {} {} ({}): a run needs it to own its checkpoint.dir. Fix: choose a "
      "checkpoint.dir this user can write",
      what, path, std::strerror(err)));
}

// Replaces the file's contents with this process's line; best effort: the lock is what counts,
// the line only makes another run's refusal message precise.
void write_holder(int fd) {
  const std::string line =
      fmt::format("pid {} on host {}, started {}\n", ::getpid(), host_name(), now_utc());
  if (::ftruncate(fd, 0) != 0) return;
  [[maybe_unused]] const ssize_t n = ::pwrite(fd, line.data(), line.size(), 0);
}

bool locks_unsupported(int err) {
  return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL;
}

}  // namespace

std::string run_lock_holder(const std::string& path) {
  RegularFile file = RegularFile::open_read(path);
  std::string text;
  if (!file.ok() || file.read_all(text, kMaxHolderBytes) != 0) text.clear();
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text.empty() ? "a process that has not written its pid yet (it is starting)" : text;
}

RunLock::RunLock(const std::string& dir)
    : path_((std::filesystem::path(dir) / kLockName).string()) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) cannot_lock("create the folder", dir, ec.value());
  // Opened without O_TRUNC: the holder's line stays readable until this process owns the lock.
  // Never through a link (one to a file elsewhere would get our pid line written over it, a
  // dangling one would create its target), never a FIFO or a folder.
  RegularFile file(path_, O_RDWR | O_CREAT);
  if (file.problem() == RegularFile::Problem::Link ||
      file.problem() == RegularFile::Problem::NotRegular)
    throw CheckpointError(
        fmt::format("[checkpoint] {}: the lock file is {}. Fix: remove it; a run creates its own",
                    path_, file.problem_text()));
  if (!file.ok()) cannot_lock("open the lock file", path_, file.error());
  fd_ = file.release();
  int rc;
  do rc = ::flock(fd_, LOCK_EX | LOCK_NB);
  while (rc != 0 && errno == EINTR);
  if (rc == 0) {
    write_holder(fd_);
    return;
  }
  const int err = errno;
  if (locks_unsupported(err)) {
    warning_ = fmt::format(
        "warning: [checkpoint] {} cannot be locked ({}): this file system has no locks, so "
        "nothing stops a second run from writing into {} at the same time; start one run per "
        "folder",
        path_, std::strerror(err), dir);
    return;
  }
  ::close(fd_);
  fd_ = -1;
  if (err != EWOULDBLOCK) cannot_lock("lock", path_, err);
  throw CheckpointError(fmt::format(
      "[checkpoint] checkpoint.dir {} is in use by another run: {} (lock {}). Two runs in one "
      "folder would interleave their checkpoints. Fix: wait for that run to end or stop it, or "
      "give this run another checkpoint.dir",
      dir, run_lock_holder(path_), path_));
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // drops the lock; the file stays (see the header)
}

}  // namespace remat
