// PasskeyTasks (see data/passkey_tasks.h).
#include "data/passkey_tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/core/regular_file.h"

namespace remat {
namespace {

constexpr const char* kRegenerate =
    "write the tasks again with scripts/prepare_data.py --passkey (docs/context-extension.md)";

[[noreturn]] void fail(const std::string& path, const std::string& problem,
                       const std::string& fix = kRegenerate) {
  throw DataError(fmt::format("[data] {}: {}. Fix: {}", path, problem, fix));
}

}  // namespace

PasskeyTasks::PasskeyTasks(const std::string& dir, int64_t vocab) : dir_(dir), vocab_(vocab) {
  namespace fs = std::filesystem;
  const std::string index = (fs::path(dir) / "passkey.json").string();
  // The index is small: read whole, through RegularFile (a FIFO or a folder is refused, never
  // waited on); 64 MiB bounds what a wrong file could make us hold.
  constexpr uint64_t kIndexMax = uint64_t{64} << 20;
  RegularFile file = RegularFile::open_read(index);
  std::string text;
  const int err = file.ok() ? file.read_all(text, kIndexMax) : 0;
  if (!file.ok() || err != 0)
    fail(index, file.ok() ? std::strerror(err) : file.problem_text(),
         "pass the --out folder of scripts/prepare_data.py --passkey to eval --passkey");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(index, fmt::format("not JSON ({})", e.what()));
  }
  try {
    if (j.at("format") != "remat-train passkey tasks" || j.at("version") != 1)
      fail(index, "not a passkey task index (format \"remat-train passkey tasks\", version 1)");
    tokenizer_ = j.at("tokenizer").get<std::string>();
    const int64_t their_vocab = j.at("vocab_size").get<int64_t>();
    if (their_vocab > vocab)
      fail(index,
           fmt::format("tasks of tokenizer {} (vocabulary {}) for a model of vocabulary {}",
                       tokenizer_, their_vocab, vocab),
           "write the tasks with the model's own tokenizer");
    for (const nlohmann::json& t : j.at("tasks"))
      tasks_.push_back({t.at("length").get<int64_t>(), t.at("depth").get<double>(),
                        t.at("sample").get<int64_t>(), t.at("key").get<std::string>(),
                        t.at("offset").get<int64_t>(), t.at("tokens").get<int64_t>()});
    const std::string shard = (fs::path(dir) / j.at("shard").get<std::string>()).string();
    const std::string mask = (fs::path(dir) / j.at("mask").get<std::string>()).string();
    try {
      shard_.emplace(shard, DataFormat::Tokens);
      mask_.emplace(mask, shard, shard_->size());
    } catch (const DataError& e) {
      // The shard's and mask's own checks name the problem; their fixes are a training run's
      // (data.loss_mask = "off", re-tokenizing), while a task folder is written whole, at once.
      std::string what = e.what();
      const size_t at = what.find(". Fix: ");
      if (at == std::string::npos) throw;
      throw DataError(what.substr(0, at) + ". Fix: " + kRegenerate);
    }
  } catch (const nlohmann::json::exception& e) {
    fail(index, fmt::format("a key is missing or of the wrong type ({})", e.what()));
  }
  if (tasks_.empty()) fail(index, "no tasks");
  for (const PasskeyTask& t : tasks_) {
    // The labels of eval's table: a depth is where in the context the key was hidden.
    if (!(t.depth >= 0.0 && t.depth <= 1.0) || t.sample < 0 || t.key.empty())
      fail(index, fmt::format("task (length {}, depth {}, sample {}, key \"{}\"): a depth is in "
                              "[0, 1], a sample number >= 0 and a key not empty",
                              t.length, t.depth, t.sample, t.key));
    if (t.length < 1 || t.tokens != t.length + 1 || t.offset < 0 ||
        t.offset + t.tokens > shard_->size())
      fail(index,
           fmt::format("task (length {}, depth {}, sample {}) at tokens [{}, {}) of a shard of {}",
                       t.length, t.depth, t.sample, t.offset, t.offset + t.tokens, shard_->size()));
  }
  std::vector<int32_t> tokens;
  std::vector<uint8_t> bytes;
  for (const PasskeyTask& t : tasks_) {  // every task scores something, every token fits
    read(t, tokens, bytes);
    if (std::find(bytes.begin() + 1, bytes.end(), 1) == bytes.end())
      fail(mask_->path(), fmt::format("task (length {}, depth {}, sample {}) has no scored target",
                                      t.length, t.depth, t.sample));
  }
}

namespace {

// One field of every task, each value once, ascending.
template <class T>
std::vector<T> distinct(const std::vector<PasskeyTask>& tasks, T PasskeyTask::*field) {
  std::vector<T> out;
  for (const PasskeyTask& t : tasks) out.push_back(t.*field);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

std::vector<int64_t> PasskeyTasks::lengths() const {
  return distinct(tasks_, &PasskeyTask::length);
}

std::vector<double> PasskeyTasks::depths() const {
  return distinct(tasks_, &PasskeyTask::depth);
}

void PasskeyTasks::read(const PasskeyTask& task, std::vector<int32_t>& tokens,
                        std::vector<uint8_t>& mask) const {
  tokens.resize(static_cast<size_t>(task.tokens));
  mask.resize(static_cast<size_t>(task.tokens));
  shard_->read(task.offset, task.tokens, tokens.data(), vocab_);
  mask_->read(task.offset, task.tokens, mask.data());
  shard_->check_unchanged();
  mask_->check_unchanged();
}

}  // namespace remat
