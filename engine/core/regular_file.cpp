// Regular files opened without blocking or following links (see engine/core/regular_file.h).
#include "engine/core/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace remat {

namespace {

// What an open(2) error means here. ELOOP from O_NOFOLLOW and ENXIO (a FIFO opened for writing
// with no reader, under O_NONBLOCK) are the two refusals that come back as errors; lstat tells
// them from a loop among the folders or a device without its driver.
RegularFile::Problem problem_of(const std::string& path, int err) {
  struct stat st {};
  switch (err) {
    case ENOENT:
      return RegularFile::Problem::Missing;
    case ELOOP:
      if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) return RegularFile::Problem::Link;
      break;
    case ENXIO:
    case ENODEV:
      if (::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
        return RegularFile::Problem::NotRegular;
      break;
    default:
      break;
  }
  return RegularFile::Problem::Error;
}

}  // namespace

RegularFile RegularFile::open_read(const std::string& path) {
  return RegularFile(path, O_RDONLY);
}

RegularFile::RegularFile(const std::string& path, int flags, mode_t mode) : path_(path) {
  flags |= O_CLOEXEC | O_NONBLOCK;
  if (flags & O_CREAT) flags |= O_NOFOLLOW;
  int fd;
  do fd = ::open(path.c_str(), flags, mode);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    error_ = errno;
    problem_ = problem_of(path, error_);
    return;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    error_ = errno;
    problem_ = Problem::Error;
    ::close(fd);
    return;
  }
  if (!S_ISREG(st.st_mode)) {
    problem_ = Problem::NotRegular;
    ::close(fd);
    return;
  }
  // A regular file ignores O_NONBLOCK, but the descriptor may be handed on: make it plain.
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    error_ = errno;
    problem_ = Problem::Error;
    ::close(fd);
    return;
  }
  fd_ = fd;
  size_ = static_cast<uint64_t>(st.st_size);
}

RegularFile::~RegularFile() {
  close();
}

RegularFile::RegularFile(RegularFile&& o) noexcept {
  *this = std::move(o);
}

RegularFile& RegularFile::operator=(RegularFile&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    problem_ = o.problem_;
    error_ = o.error_;
    size_ = o.size_;
  }
  return *this;
}

std::string RegularFile::problem_text() const {
  switch (problem_) {
    case Problem::None:
      return "";
    case Problem::Missing:
      return "no such file";
    case Problem::NotRegular:
      return "not a regular file (a folder, device or pipe)";
    case Problem::Link:
      return "a symbolic link (never followed when a file is written)";
    case Problem::Error:
      break;
  }
  return std::strerror(error_);
}

int RegularFile::release() {
  return std::exchange(fd_, -1);
}

void RegularFile::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

int RegularFile::read_all(std::string& out, uint64_t max_bytes) {
  out.clear();
  out.reserve(static_cast<size_t>(std::min(size_, max_bytes)));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      out.clear();
      return errno;
    }
    if (n == 0) return 0;
    if (out.size() + static_cast<uint64_t>(n) > max_bytes) {
      out.clear();
      return EFBIG;
    }
    out.append(buf, static_cast<size_t>(n));
  }
}

}  // namespace remat
