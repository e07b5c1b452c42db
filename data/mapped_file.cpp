// Read-only mmap of a file (see data/mapped_file.h).
#include "data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "engine/error.h"

namespace remat {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw DataError(
      fmt::format("[data] {}: {}. Fix: check the path and its permissions", path, problem));
}

// Closes the descriptor on every path out of the constructor: the mapping outlives it.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) fail(path, fmt::format("cannot open ({})", std::strerror(errno)));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) fail(path, fmt::format("cannot stat ({})", std::strerror(errno)));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) return;  // mmap rejects length 0; an empty file is the caller's error to name
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (p == MAP_FAILED) fail(path, fmt::format("cannot memory-map ({})", std::strerror(errno)));
  data_ = static_cast<const uint8_t*>(p);
}

MappedFile::MappedFile(MappedFile&& o) noexcept {
  *this = std::move(o);
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() {
  unmap();
}

void MappedFile::unmap() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

void MappedFile::advise(Access access) const {
  if (data_ == nullptr) return;
  const int advice = access == Access::Sequential ? MADV_SEQUENTIAL
                     : access == Access::Random   ? MADV_RANDOM
                                                  : MADV_NORMAL;
  ::madvise(const_cast<uint8_t*>(data_), size_, advice);  // a hint: failure changes nothing
}

}  // namespace remat
