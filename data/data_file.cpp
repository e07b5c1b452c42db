// Data files read with pread, and their identity (see data/data_file.h).
#include "data/data_file.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/regular_file.h"

namespace remat {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw DataError(
      fmt::format("[data] {}: {}. Fix: check the path and its permissions", path, problem));
}

FileIdentity identity_of(const struct stat& st) {
  return {st.st_dev, st.st_ino, static_cast<uint64_t>(st.st_size), st.st_mtim};
}

std::string utc_time(const timespec& t) {
  struct tm tm {};
  gmtime_r(&t.tv_sec, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return fmt::format("{}.{:09d}", buf, t.tv_nsec);
}

// "size 4096 -> 0 bytes; mtime A -> B UTC; inode 12, unchanged": every field, changed or not, so
// the reader sees at once which kind of change it was.
std::string describe_change(const FileIdentity& was, const FileIdentity& now) {
  auto pair = [](auto a, auto b, const std::string& unit) {
    return a == b ? fmt::format("{}{}, unchanged", a, unit) : fmt::format("{} -> {}{}", a, b, unit);
  };
  const bool same_time =
      was.mtime.tv_sec == now.mtime.tv_sec && was.mtime.tv_nsec == now.mtime.tv_nsec;
  std::string text =
      fmt::format("size {}; mtime {}; inode {}", pair(was.size, now.size, " bytes"),
                  same_time ? utc_time(was.mtime) + " UTC, unchanged"
                            : utc_time(was.mtime) + " -> " + utc_time(now.mtime) + " UTC",
                  pair(was.inode, now.inode, ""));
  if (was.inode != now.inode || was.device != now.device)
    text += " (the path now names another file: replaced by a rename?)";
  else if (now.size > was.size)
    text += " (appended to: a run's windows depend on the size it opened)";
  return text;
}

constexpr const char* kChangedFix =
    "a running job's data must not change (appends included). Write new data under a new name "
    "and point the next run at it, or restore this file as it was, then continue with --resume "
    "latest";

[[noreturn]] void changed(const std::string& path, const std::string& what) {
  throw DataChanged(
      fmt::format("[data] {} changed while training ({}). Fix: {}", path, what, kChangedFix));
}

// A file is read for the whole run, so it keeps its descriptor: a corpus of more files than the
// soft RLIMIT_NOFILE (1024 by default on many systems) raises it to the hard limit once. Opened
// as a RegularFile: a FIFO or a device is refused at once, never waited on.
RegularFile open_for_the_run(const std::string& path) {
  RegularFile file = RegularFile::open_read(path);
  if (file.ok() || file.error() != EMFILE) return file;
  struct rlimit lim {};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return file;
  lim.rlim_cur = lim.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return file;
  return RegularFile::open_read(path);
}

}  // namespace

DataFile::DataFile(const std::string& path) : path_(path) {
  RegularFile file = open_for_the_run(path);
  if (file.error() == EMFILE)
    throw DataError(fmt::format(
        "[data] {}: cannot open: this process has as many files open as `ulimit -n` allows (a "
        "run keeps each data file open). Fix: raise the limit (ulimit -n), or merge small files",
        path));
  if (file.problem() == RegularFile::Problem::NotRegular) fail(path, "not a regular file");
  if (!file.ok()) fail(path, fmt::format("cannot open ({})", file.problem_text()));
  fd_ = file.release();
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    close();
    fail(path, fmt::format("cannot stat ({})", std::strerror(err)));
  }
  id_ = identity_of(st);
}

DataFile::DataFile(DataFile&& o) noexcept {
  *this = std::move(o);
}

DataFile& DataFile::operator=(DataFile&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    id_ = o.id_;
  }
  return *this;
}

DataFile::~DataFile() {
  close();
}

void DataFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void DataFile::read(uint64_t offset, size_t n, void* out) const {
  auto* p = static_cast<char*>(out);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      throw IoError(
          fmt::format("[data] {}: cannot read {} bytes at offset {} ({}). Fix: check "
                      "the file system the file lives on",
                      path_, n, offset, std::strerror(errno)));
    if (got == 0) {  // the file is shorter than at open: say how, else what the read saw
      check_unchanged();
      changed(path_, fmt::format("a read of {} bytes at offset {} ended after {}: the file is "
                                 "shorter than the {} bytes it had",
                                 n, offset, done, id_.size));
    }
    done += static_cast<size_t>(got);
  }
}

void DataFile::check_unchanged() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0)
    changed(path_, fmt::format("it was removed or renamed: {}", std::strerror(errno)));
  const FileIdentity now = identity_of(st);
  if (!(now == id_)) changed(path_, describe_change(id_, now));
}

void DataFile::advise(Access access) const {
  if (fd_ < 0) return;
  const int advice = access == Access::Sequential ? POSIX_FADV_SEQUENTIAL
                     : access == Access::Random   ? POSIX_FADV_RANDOM
                                                  : POSIX_FADV_NORMAL;
  ::posix_fadvise(fd_, 0, 0, advice);  // a hint: failure changes nothing
}

}  // namespace remat
