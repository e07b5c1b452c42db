#include "engine/model_files/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "engine/core/error.h"
#include "engine/core/regular_file.h"

namespace remat::safetensors {

namespace {

// A header this large is not a tensor index but garbage read as a length (the reference
// implementation refuses the same size).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The data section starts at a multiple of this, so f32 (and f64) tensors are aligned in a mapping.
constexpr size_t kDataAlignment = 8;
// Linux writes at most ~2 GiB per call; larger tensors go in pieces.
constexpr size_t kMaxWriteChunk = size_t{1} << 30;

// safetensors files come from checkpoints, Hugging Face downloads and PEFT adapters alike.
constexpr const char* kFixCorrupt =
    "write the file again (a checkpoint's: resume from an earlier checkpoint; a model's or an "
    "adapter's: download or save it again)";

[[noreturn]] void fail(const std::string& path, const std::string& problem,
                       const std::string& fix = kFixCorrupt) {
  throw CheckpointError(fmt::format("[checkpoint] {}: {}. Fix: {}", path, problem, fix));
}

uint64_t read_le64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(p[i]);
  return v;
}

// Element count times element size, or false when it overflows 64 bits.
bool byte_size(const std::vector<int64_t>& shape, size_t elem_bytes, uint64_t* out) {
  uint64_t n = elem_bytes;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  *out = n;
  return true;
}

}  // namespace

size_t dtype_bytes(std::string_view dtype) {
  static const std::map<std::string_view, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

void throw_io_error(const std::string& what, const std::string& path, int err) {
  throw IoError(fmt::format(
      "[checkpoint] cannot {} {}: {}. Fix: check that the folder is writable and the disk has "
      "space",
      what, path, std::strerror(err)));
}

int create_file(const std::string& path) {
  RegularFile file(path, O_WRONLY | O_CREAT | O_TRUNC);
  if (file.problem() == RegularFile::Problem::Link ||
      file.problem() == RegularFile::Problem::NotRegular)
    throw IoError(fmt::format(
        "[checkpoint] cannot create {}: it is {}. Fix: remove it (remat-train writes only regular "
        "files of its own)",
        path, file.problem_text()));
  if (!file.ok()) throw_io_error("create", path, file.error());
  return file.release();
}

void write_file_durably(const std::string& path, const std::string& text) {
  const int fd = create_file(path);
  try {
    write_all(fd, text.data(), text.size(), path);
    if (::fsync(fd) != 0) throw_io_error("fsync", path, errno);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) throw_io_error("close", path, errno);
}

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, std::min(bytes, kMaxWriteChunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_io_error("write", path, errno);
    if (n == 0) throw_io_error("write", path, ENOSPC);  // no progress, no error: a full disk
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

uint64_t xxh3_64(const void* data, size_t bytes) {
  return XXH3_64bits(data, bytes);
}

std::string hex64(uint64_t v) {
  return fmt::format("{:016x}", v);
}

bool to_f32(std::string_view dtype, const std::byte* src, size_t n, float* dst) {
  if (dtype == "F32") {
    std::memcpy(dst, src, n * sizeof(float));
    return true;
  }
  const bool bf16 = dtype == "BF16";
  if (!bf16 && dtype != "F16") return false;
  for (size_t i = 0; i < n; ++i) {
    uint16_t h = 0;
    std::memcpy(&h, src + 2 * i, 2);
    uint32_t bits = 0;
    if (bf16) {
      bits = static_cast<uint32_t>(h) << 16;
    } else {
      const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
      const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
      if (exp == 0x1f) {  // inf, NaN (payload kept)
        bits = sign | 0x7f800000u | (mant << 13);
      } else if (exp != 0) {  // normal: rebias 15 -> 127
        bits = sign | ((exp + 112) << 23) | (mant << 13);
      } else {  // zero or subnormal: mant x 2^-24, exact in f32
        const float v = std::ldexp(static_cast<float>(mant), -24);
        std::memcpy(&bits, &v, 4);
        bits |= sign;
      }
    }
    std::memcpy(dst + i, &bits, 4);
  }
  return true;
}

uint16_t f32_to_bf16(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

std::string shape_string(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// ---------------------------------------------------------------------------------------------
// Writer

struct Writer::HashState {
  XXH3_state_t* state = XXH3_createState();
  HashState() {
    if (state == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(state);
  }
  ~HashState() { XXH3_freeState(state); }
  HashState(const HashState&) = delete;
  HashState& operator=(const HashState&) = delete;
};

namespace {

// The JSON header, in file order (ordered_json: readers sort by offsets anyway, people read it
// top to bottom), padded with spaces to keep the data section aligned.
std::string make_header(const std::vector<TensorInfo>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  for (const TensorInfo& t : tensors)
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  std::string text = h.dump();
  text.append((kDataAlignment - text.size() % kDataAlignment) % kDataAlignment, ' ');
  return text;
}

}  // namespace

Writer::Writer(std::string path, std::vector<TensorInfo> tensors,
               const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tensors_(std::move(tensors)), hash_(std::make_unique<HashState>()) {
  uint64_t offset = 0;
  for (TensorInfo& t : tensors_) {
    const size_t elem = dtype_bytes(t.dtype);
    uint64_t n = 0;
    REMAT_ASSERT(elem > 0 && byte_size(t.shape, elem, &n), "safetensors: bad tensor {} {}", t.name,
                 t.dtype);
    t.begin = offset;
    offset += n;
    t.end = offset;
  }
  const std::string header = make_header(tensors_, metadata);
  fd_ = create_file(path_);
  std::byte len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::byte>(header.size() >> (8 * i));
  write_raw(len, sizeof len);
  write_raw(header.data(), header.size());
}

Writer::~Writer() {
  if (fd_ >= 0) ::close(fd_);
}

void Writer::write(const void* data, size_t bytes) {
  REMAT_ASSERT(next_ < tensors_.size(), "safetensors: more tensors written than declared");
  REMAT_ASSERT(bytes == tensors_[next_].bytes(), "safetensors: tensor {} is {} bytes, got {}",
               tensors_[next_].name, tensors_[next_].bytes(), bytes);
  write_raw(data, bytes);
  ++next_;
}

void Writer::write_raw(const void* data, size_t bytes) {
  XXH3_64bits_update(hash_->state, data, bytes);
  write_all(fd_, data, bytes, path_);
  written_ += bytes;
}

void Writer::finish() {
  REMAT_ASSERT(next_ == tensors_.size(), "safetensors: {} of {} tensors written", next_,
               tensors_.size());
  // fsync reports write-back errors (EIO, ENOSPC on some file systems) that write() did not.
  if (::fsync(fd_) != 0) throw_io_error("fsync", path_, errno);
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) throw_io_error("close", path_, errno);
}

uint64_t Writer::checksum() const {
  return XXH3_64bits_digest(hash_->state);
}

// ---------------------------------------------------------------------------------------------
// MappedFile

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  RegularFile file = RegularFile::open_read(path_);
  if (file.problem() == RegularFile::Problem::Missing ||
      file.problem() == RegularFile::Problem::NotRegular)
    fail(path_, file.problem_text(), "give a checkpoint folder or a .safetensors file");
  if (!file.ok())
    throw IoError(fmt::format("[checkpoint] cannot open {}: {}", path_, file.problem_text()));
  size_ = file.size();
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
    if (p == MAP_FAILED)
      throw IoError(fmt::format("[checkpoint] cannot map {}: {}", path_, std::strerror(errno)));
    data_ = static_cast<std::byte*>(p);
  }
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept {
  *this = std::move(o);
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) ::munmap(data_, size_);
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

// ---------------------------------------------------------------------------------------------
// Reader: nothing in the file is trusted until checked, since a truncated or foreign file must
// become a message, never an out-of-bounds read.

namespace {

using Json = nlohmann::json;

std::map<std::string, std::string> parse_metadata(const std::string& path, const Json& j) {
  if (!j.is_object()) fail(path, "__metadata__ is not a JSON object");
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : j.items()) {
    if (!v.is_string()) fail(path, fmt::format("__metadata__ key '{}' is not a string", k));
    out[k] = v.get<std::string>();
  }
  return out;
}

std::vector<int64_t> parse_shape(const std::string& path, const std::string& name, const Json& j) {
  if (!j.is_array()) fail(path, fmt::format("tensor '{}': shape is not an array", name));
  std::vector<int64_t> shape;
  for (const Json& d : j) {
    if (!d.is_number_integer() || (!d.is_number_unsigned() && d.get<int64_t>() < 0))
      fail(path, fmt::format("tensor '{}': shape {} is not a list of non-negative integers", name,
                             j.dump()));
    if (d.is_number_unsigned() && d.get<uint64_t>() > uint64_t{INT64_MAX})
      fail(path, fmt::format("tensor '{}': dimension {} is too large", name, d.dump()));
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// One tensor entry: dtype, shape and offsets well-formed, and the byte span matches the shape.
TensorInfo parse_tensor(const std::string& path, const std::string& name, const Json& j) {
  if (!j.is_object()) fail(path, fmt::format("tensor '{}' is not a JSON object", name));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!j.contains(key)) fail(path, fmt::format("tensor '{}' has no \"{}\"", name, key));
  TensorInfo t;
  t.name = name;
  if (!j["dtype"].is_string() || dtype_bytes(j["dtype"].get<std::string>()) == 0)
    fail(path, fmt::format("tensor '{}': unknown dtype {}", name, j["dtype"].dump()));
  t.dtype = j["dtype"].get<std::string>();
  t.shape = parse_shape(path, name, j["shape"]);
  const Json& off = j["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned() || off[0].get<uint64_t>() > off[1].get<uint64_t>())
    fail(path, fmt::format("tensor '{}': data_offsets {} is not [begin, end] with begin <= end",
                           name, off.dump()));
  t.begin = off[0].get<uint64_t>();
  t.end = off[1].get<uint64_t>();
  uint64_t want = 0;
  if (!byte_size(t.shape, dtype_bytes(t.dtype), &want) || want != t.bytes())
    fail(path, fmt::format("tensor '{}': dtype {} shape {} needs {} bytes but data_offsets [{}, "
                           "{}] span {}: the header is inconsistent",
                           name, t.dtype, shape_string(t.shape), want, t.begin, t.end, t.bytes()));
  return t;
}

// Tensors sorted by offset must tile [0, data_bytes) exactly: no gap, no overlap, nothing past
// the end of the file and nothing after the last tensor.
void check_layout(const std::string& path, const std::vector<TensorInfo>& sorted,
                  uint64_t data_start, uint64_t file_bytes) {
  const uint64_t data_bytes = file_bytes - data_start;
  uint64_t expected = 0;
  for (const TensorInfo& t : sorted) {
    if (t.end > data_bytes)
      fail(path, fmt::format("tensor '{}' ends at byte {} past the end of the file ({} bytes): "
                             "the file is truncated",
                             t.name, data_start + t.end, file_bytes));
    if (t.begin != expected)
      fail(path,
           fmt::format("tensor '{}' starts at data byte {} but the previous tensor ends at "
                       "{}: tensors {}",
                       t.name, t.begin, expected, t.begin < expected ? "overlap" : "leave a gap"));
    expected = t.end;
  }
  if (expected != data_bytes)
    fail(path, fmt::format("{} bytes follow the last tensor (data ends at byte {} of {}): the "
                           "header does not describe the file",
                           data_bytes - expected, data_start + expected, file_bytes));
}

}  // namespace

Reader::Reader(MappedFile file) : file_(std::move(file)) {
  const std::string& path = file_.path();
  const uint64_t size = file_.size();
  if (size < 8)
    fail(path, fmt::format("the file is {} bytes, too short for a safetensors header: it is "
                           "truncated or not safetensors",
                           size));
  const uint64_t n = read_le64(file_.data());
  if (n > kMaxHeaderBytes)
    fail(path, fmt::format("header length {} is over the 100 MB limit: the file is corrupt or "
                           "not safetensors",
                           n));
  if (n > size - 8)
    fail(path, fmt::format("header length {} runs past the end of the file ({} bytes): the file "
                           "is truncated or not safetensors",
                           n, size));
  const auto* text = reinterpret_cast<const char*>(file_.data() + 8);
  Json header;
  try {
    header = Json::parse(text, text + n);
  } catch (const Json::exception& e) {  // parse_error, and out_of_range for a number too large
    fail(path, fmt::format("the header is not valid JSON ({})", e.what()));
  }
  if (!header.is_object()) fail(path, "the header is not a JSON object");
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__")
      metadata_ = parse_metadata(path, value);
    else
      tensors_.push_back(parse_tensor(path, key, value));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  check_layout(path, tensors_, 8 + n, size);
  data_start_ = file_.data() + 8 + n;
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

void Reader::release(const TensorInfo& t) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(data(t));
  const uintptr_t begin = (first + page - 1) / page * page;
  const uintptr_t end = (first + t.bytes()) / page * page;
  // Pages shared with a neighbouring tensor stay; advice is only advice, so a failure is ignored.
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

const TensorInfo* Reader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace remat::safetensors
