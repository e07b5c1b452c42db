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
  int64_t d_ff = 0;      // 0: the config's default, 4 x n_embd
  double dropout = 0.0;  // written only when above 0
  int64_t seq_len = 9, batch_size = 2, loss_chunk = 5, steps = 20;
  std::string position = "learned", policy = "none", task = "random";
};

/// The [model] table's keys of `g` (without the "[model]" line).
inline std::string gpt_model_table(const SmallGpt& g) {
  std::string t = fmt::format(
      "n_layer = {}\nn_head = {}\nn_embd = {}\nd_ff = {}\nvocab_size = {}\nn_ctx = {}\n"
      "position = \"{}\"\n",
      g.n_layer, g.n_head, g.n_embd, g.d_ff, g.vocab_size, g.n_ctx, g.position);
  if (g.dropout > 0) t += fmt::format("dropout = {}\n", g.dropout);
  return t;
}

inline std::string small_gpt_toml(const SmallGpt& g) {
  return "[model]\n" + gpt_model_table(g) +
         fmt::format(R"([train]
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

/// A small model of the Llama family: its [model] table, every key written (the config's default
/// where a test does not care).
struct SmallLlama {
  int64_t n_layer = 2, n_head = 4, n_kv_head = 0, head_dim = 0, n_embd = 32, d_ff = 0;
  int64_t vocab_size = 61;
  double rope_theta = 10000.0;
  // llama3 RoPE scaling (factor 8, low_freq_factor 1, high_freq_factor 4) from this
  // original_max_position_embeddings; 0: no scaling.
  int64_t llama3_context = 0;
  bool attention_bias = false, qk_norm = false, tie_embeddings = true;
};

/// Every option of the family on `l`'s sizes: grouped-query attention (4 query heads on 2
/// key/value heads with the default n_head), q/k/v biases (Qwen2), the per-head q/k norm (Qwen3)
/// and an untied head. The head size apart from n_embd / n_head and the llama3 scaling are the
/// caller's (head_dim, llama3_context).
inline SmallLlama every_llama_option(SmallLlama l) {
  l.n_kv_head = 2;
  l.attention_bias = l.qk_norm = true;
  l.tie_embeddings = false;
  return l;
}

/// The [model] table's keys of `l` (without the "[model]" line).
inline std::string llama_model_table(const SmallLlama& l) {
  std::string t = fmt::format(
      "kind = \"llama\"\nn_layer = {}\nn_head = {}\nn_kv_head = {}\nhead_dim = {}\nn_embd = {}\n"
      "d_ff = {}\nvocab_size = {}\nrope_theta = {:.1f}\n",
      l.n_layer, l.n_head, l.n_kv_head, l.head_dim, l.n_embd, l.d_ff, l.vocab_size, l.rope_theta);
  if (l.llama3_context > 0)
    t += fmt::format(
        "rope_scaling = {{ rope_type = \"llama3\", factor = 8.0, low_freq_factor = 1.0, "
        "high_freq_factor = 4.0, original_max_position_embeddings = {} }}\n",
        l.llama3_context);
  return t + fmt::format("attention_bias = {}\nqk_norm = {}\ntie_embeddings = {}\n",
                         l.attention_bias, l.qk_norm, l.tie_embeddings);
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
