// The safetensors format (what checkpoints and `--init` files are): an 8-byte little-endian
// header length N, N bytes of JSON {"__metadata__": {str: str}, "<tensor>": {"dtype", "shape",
// "data_offsets": [begin, end]}}, then the tensors' bytes, back to back, offsets counted from
// the first byte after the header. The header is padded with spaces so the data starts 8-byte
// aligned, as the reference implementation writes it.
//
// Writer streams: the header first (from shapes declared up front), then each tensor in order,
// so a model is never held in host memory twice; it checksums (XXH3-64) what it writes.
// Reader memory-maps a file and validates every header field and offset before handing out a
// pointer; each problem is a CheckpointError naming the file, the problem and the fix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace remat::safetensors {

struct TensorInfo {
  std::string name;
  std::string dtype = "F32";  // safetensors spelling: F32, BF16, F16, I32, I64, U8, ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the data section (Reader fills them)
  uint64_t end = 0;
  uint64_t bytes() const { return end - begin; }
};

/// Bytes per element of a safetensors dtype name; 0 when the name is unknown.
size_t dtype_bytes(std::string_view dtype);

/// XXH3-64 of a byte range (what state.json records), and its 16-digit hex spelling.
uint64_t xxh3_64(const void* data, size_t bytes);
std::string hex64(uint64_t v);

/// Writes one safetensors file: every tensor declared in the constructor, then write() once per
/// tensor in declaration order, then finish(). Every write is checked: a short write, a full disk
/// or a failed fsync is an IoError naming the file. Destroying an unfinished Writer closes the
/// file (the caller removes it; checkpoints write into a temporary folder).
class Writer {
 public:
  Writer(std::string path, std::vector<TensorInfo> tensors,
         const std::map<std::string, std::string>& metadata);
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  /// The next tensor's bytes (exactly its declared size).
  void write(const void* data, size_t bytes);
  /// Flushes and fsyncs; after this bytes() and checksum() describe the whole file.
  void finish();
  uint64_t bytes() const { return written_; }
  uint64_t checksum() const;

 private:
  void write_raw(const void* data, size_t bytes);
  struct HashState;
  std::string path_;
  std::vector<TensorInfo> tensors_;
  size_t next_ = 0;
  int fd_ = -1;
  uint64_t written_ = 0;
  std::unique_ptr<HashState> hash_;
};

/// A file mapped read-only (an empty file has no mapping). Move-only.
class MappedFile {
 public:
  /// Throws CheckpointError when the file is missing, IoError when it cannot be read.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const std::string& path() const { return path_; }
  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  std::string path_;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

/// A validated safetensors file. Tensors are listed in file (offset) order.
class Reader {
 public:
  /// Validates the header and offsets of `file`; throws CheckpointError on any problem.
  explicit Reader(MappedFile file);
  /// Maps and validates `path`.
  explicit Reader(const std::string& path) : Reader(MappedFile(path)) {}
  const std::string& path() const { return file_.path(); }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The tensor named `name`, or nullptr.
  const TensorInfo* find(const std::string& name) const;
  /// First byte of a tensor's data (in the mapping).
  const std::byte* data(const TensorInfo& t) const { return data_start_ + t.begin; }
  /// Gives a tensor's pages back to the kernel once it has been read (they are read from the file
  /// again if touched): streaming a model larger than memory through the mapping then never holds
  /// more than the tensor at hand.
  void release(const TensorInfo& t) const;

 private:
  MappedFile file_;
  const std::byte* data_start_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

/// Converts `n` elements of a floating-point dtype ("F32", "BF16" or "F16") to f32, exactly (every
/// bf16 and f16 value is an f32 value). Returns false for any other dtype.
bool to_f32(std::string_view dtype, const std::byte* src, size_t n, float* dst);
/// f32 -> bf16, rounding to nearest even (NaN stays a quiet NaN of the same sign).
uint16_t f32_to_bf16(float x);

/// "[2, 3]": how messages print a shape.
std::string shape_string(const std::vector<int64_t>& shape);

// ---- checked POSIX writes, shared with engine/training/checkpoint.cpp and `export` ----

/// An IoError "[checkpoint] cannot <what> <path>: <strerror(err)>. Fix: ...".
[[noreturn]] void throw_io_error(const std::string& what, const std::string& path, int err);
/// Creates (or truncates) `path` for writing and returns its descriptor: never through a symbolic
/// link, never a FIFO or device (engine/core/regular_file.h); an IoError naming `path` otherwise.
int create_file(const std::string& path);
/// Writes all `bytes` to `fd` (retrying partial writes and EINTR); IoError naming `path` otherwise.
void write_all(int fd, const void* data, size_t bytes, const std::string& path);
/// `text` as the whole of a new file `path` (create_file), fsync'd before it returns.
void write_file_durably(const std::string& path, const std::string& text);

}  // namespace remat::safetensors
