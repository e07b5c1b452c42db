// One run per checkpoint folder (see engine/training/run_lock.h).
#include "engine/training/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
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

namespace {

// Whether `fd` is still the file `path` names: a run that locked it after its holder removed it
// (see ~RunLock) holds a lock on nothing, and must open the path again.
bool still_named(int fd, const std::string& path) {
  struct stat by_fd {
  }, by_path{};
  if (::fstat(fd, &by_fd) != 0 || ::lstat(path.c_str(), &by_path) != 0) return false;
  return by_fd.st_dev == by_path.st_dev && by_fd.st_ino == by_path.st_ino;
}

// The folders create_directories(dir) would make, outermost first.
std::vector<std::string> missing_folders(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (std::filesystem::path p = dir; !p.empty() && !std::filesystem::exists(p, ec);
       p = p.parent_path()) {
    out.insert(out.begin(), p.string());
    if (p == p.parent_path()) break;
  }
  return out;
}

}  // namespace

namespace {

// "out/run/" and "out/./run" as "out/run": the folders to create and remove are named once.
std::string normal_folder(const std::string& dir) {
  std::filesystem::path p = std::filesystem::path(dir).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
  return p.string();
}

}  // namespace

RunLock::RunLock(const std::string& folder)
    : path_((std::filesystem::path(normal_folder(folder)) / kLockName).string()) {
  const std::string dir = normal_folder(folder);
  // A holder that removed the lock file and its folder between our open and our flock (a
  // refused run cleaning up) leaves us a lock on nothing, or no file to open: open the path
  // again, a few times at most.
  constexpr int kAttempts = 5;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    switch (lock(dir)) {
      case Outcome::Unguarded:
        return;  // warning_ says so
      case Outcome::Locked:
        if (still_named(fd_, path_)) {
          write_holder(fd_);
          return;
        }
        ::close(fd_);
        fd_ = -1;
        break;
      case Outcome::Vanished:
        break;
    }
  }
  cannot_lock("keep the lock file", path_, ENOENT);
}

RunLock::Outcome RunLock::lock(const std::string& dir) {
  const std::vector<std::string> missing = missing_folders(dir);
  if (created_.empty()) created_ = missing;
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
  if (!file.ok() && file.error() == ENOENT) return Outcome::Vanished;  // the folder went away
  if (!file.ok()) cannot_lock("open the lock file", path_, file.error());
  fd_ = file.release();
  int rc;
  do rc = ::flock(fd_, LOCK_EX | LOCK_NB);
  while (rc != 0 && errno == EINTR);
  if (rc == 0) return Outcome::Locked;
  const int err = errno;
  if (locks_unsupported(err)) {
    warning_ = fmt::format(
        "warning: [checkpoint] {} cannot be locked ({}): this file system has no locks, so "
        "nothing stops a second run from writing into {} at the same time; start one run per "
        "folder",
        path_, std::strerror(err), dir);
    ::close(fd_);
    fd_ = -1;
    created_.clear();  // unguarded: nothing to clean up safely
    return Outcome::Unguarded;
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
  if (fd_ < 0) return;
  // A folder this lock created that holds nothing but the lock: removed, the lock file first,
  // while it is still held (a run that opened it meanwhile finds it gone and opens the path
  // again). rmdir removes only empty folders, so nothing written since is touched.
  if (!created_.empty()) {
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
    bool only_lock = true;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
      if (it->path().filename() != kLockName) only_lock = false;
    if (!ec && only_lock && ::unlink(path_.c_str()) == 0)
      for (auto it = created_.rbegin(); it != created_.rend(); ++it)
        if (::rmdir(it->c_str()) != 0) break;
  }
  ::close(fd_);  // drops the lock
}

}  // namespace remat
