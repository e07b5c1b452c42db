// Errors of remat-train: a small exception hierarchy for user and environment errors, and
// REMAT_ASSERT for programmer errors at op boundaries (stays on in release builds).
// Library code throws; only cmd/ maps exceptions to exit codes (see cmd/main.cpp).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace remat {

/// Base of every error the tool reports to the user. Messages start with "[component]".
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad configuration or flags: names the file (or --set), line, column and key. Exit code 2.
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// Bad input data (a token or text file): names the file and the byte offset or token index, and
/// the fix. Exit code 2, like a config error: the run cannot start until the input is fixed.
class DataError : public Error {
 public:
  using Error::Error;
};

/// A data file that changed while a run read it (truncated, replaced, rewritten or appended to):
/// names the file and what changed. Exit code 2 (a DataError); `train` stops like on SIGTERM first,
/// keeping the steps done in a checkpoint, and the batch that saw the change is never used.
class DataChanged : public DataError {
 public:
  using DataError::DataError;
};

/// A checkpoint that cannot be resumed from: missing, truncated, corrupt, or made by a model of
/// another shape. Names the file (and the key or tensor). Exit code 2.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A file could not be read or written. Exit code 1.
class IoError : public Error {
 public:
  using Error::Error;
};

/// A backend library (BLAS, CUDA, cuBLAS, cuDNN) failed or is unavailable. Exit code 1.
class BackendError : public Error {
 public:
  using Error::Error;
};

/// Training diverged: the loss or the gradient norm is not finite. The message names the step and
/// the first parameter whose gradient is non-finite. Exit code 1; no checkpoint is written over
/// the last finite one.
class Diverged : public Error {
 public:
  using Error::Error;
};

/// The run does not fit the memory budget. The message carries the per-category breakdown.
/// Exit code 3, so scripts can retry with another policy.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

namespace detail {
[[noreturn]] void assert_fail(const char* file, int line, const char* cond, const std::string& msg);
}  // namespace detail

}  // namespace remat

/// Programmer error: prints file:line, the condition and the message, then aborts.
#define REMAT_ASSERT(cond, ...)                                                            \
  do {                                                                                     \
    if (!(cond)) [[unlikely]]                                                              \
      ::remat::detail::assert_fail(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
  } while (0)

#ifdef NDEBUG
#define REMAT_DCHECK(cond, ...) \
  do {                          \
  } while (0)
#else
#define REMAT_DCHECK(cond, ...) REMAT_ASSERT(cond, __VA_ARGS__)
#endif
