// The small models the tests build by hand, as TOML: one builder instead of a copy of the same
// [model]/[train] tables in every test file. Each test names the fields that matter to it.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace remat::test {

/// A small GPT on synthetic data with 2 CPU threads (the CI machine's cores).
struct SmallGpt {
  int64_t n_layer = 2, n_head = 2, n_embd = 16, vocab_size = 11, n_ctx = 16;
  int64_t d_ff = 0;  // 0: the config's default, 4 x n_embd
  int64_t seq_len = 9, batch_size = 2, loss_chunk = 5, steps = 20;
  std::string position = "learned", policy = "none", task = "random";
};

inline std::string small_gpt_toml(const SmallGpt& g) {
  return fmt::format(R"(
[model]
n_layer = {}
n_head = {}
n_embd = {}
d_ff = {}
vocab_size = {}
n_ctx = {}
position = "{}"
[train]
seq_len = {}
batch_size = {}
steps = {}
loss_chunk = {}
[data]
task = "{}"
[remat]
policy = "{}"
[device]
threads = 2
)",
                     g.n_layer, g.n_head, g.n_embd, g.d_ff, g.vocab_size, g.n_ctx, g.position,
                     g.seq_len, g.batch_size, g.steps, g.loss_chunk, g.task, g.policy);
}

/// The 4-block GPT of the remat tests (tests/test_remat.cpp): its peaks fall in the backward
/// pass of the last block, so every policy changes the peak.
inline SmallGpt remat_test_gpt() {
  return {.n_layer = 4,
          .n_head = 2,
          .n_embd = 32,
          .vocab_size = 37,
          .n_ctx = 64,
          .seq_len = 45,
          .batch_size = 2,
          .loss_chunk = 16,
          .steps = 3,
          .task = "copy"};
}

/// The tutorial MLP on the synthetic regression task, with 2 CPU threads.
inline std::string small_mlp_toml(int64_t n_layer, int64_t n_embd, int64_t batch_size,
                                  const std::string& policy = "none") {
  return fmt::format(R"(
[model]
kind = "mlp"
n_layer = {}
n_embd = {}
[train]
batch_size = {}
[data]
task = "regression"
[remat]
policy = "{}"
[device]
threads = 2
)",
                     n_layer, n_embd, batch_size, policy);
}

}  // namespace remat::test
