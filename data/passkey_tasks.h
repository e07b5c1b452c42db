// Passkey retrieval tasks as scripts/prepare_data.py --passkey writes them into a folder:
// passkey.json (the index: each task's length, depth, key, and place in the shard), passkey.bin
// (every task's tokens, one after the other, as a token shard) and passkey.mask.bin (the shard's
// loss mask, data/token_corpus.h's LossMask: 1 on the answer's tokens, the targets scored). A task
// of length L is L + 1 tokens: a window of seq_len L. Opened and checked at once; every problem is
// a one-line DataError naming the file and the fix. Scoring is the caller's (cmd/eval_command.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/token_corpus.h"

namespace remat {

struct PasskeyTask {
  int64_t length = 0;  // seq_len the task is scored at (tokens - 1)
  double depth = 0;    // where the key sits in the filler, 0 (start) to 1 (end)
  int64_t sample = 0;  // which of the keys at this (length, depth)
  std::string key;     // the digits
  int64_t offset = 0;  // of its first token in the shard
  int64_t tokens = 0;  // length + 1
};

class PasskeyTasks {
 public:
  /// Opens `dir`'s three files and checks them against each other and against `vocab` (the
  /// model's vocabulary): every task inside the shard, every mask byte 0 or 1, at least one
  /// scored target per task.
  PasskeyTasks(const std::string& dir, int64_t vocab);
  const std::vector<PasskeyTask>& tasks() const { return tasks_; }
  /// The distinct lengths and depths, ascending.
  std::vector<int64_t> lengths() const;
  std::vector<double> depths() const;
  /// A task's tokens (task.tokens of them) and its mask bytes (1: a target that is scored).
  void read(const PasskeyTask& task, std::vector<int32_t>& tokens,
            std::vector<uint8_t>& mask) const;
  const std::string& dir() const { return dir_; }
  const std::string& tokenizer() const { return tokenizer_; }

 private:
  std::string dir_, tokenizer_;
  std::vector<PasskeyTask> tasks_;
  std::optional<Shard> shard_;
  std::optional<LossMask> mask_;
  int64_t vocab_ = 0;
};

}  // namespace remat
