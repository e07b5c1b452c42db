// Config parsing and validation: every error names the file (or --set flag), line, key and fix.
#include <catch2/catch.hpp>

#include "engine/config/config.h"
#include "engine/core/error.h"
#include "engine/core/units.h"

using namespace remat;
using Catch::Matchers::Contains;

namespace {

std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  try {
    parse_config(text, "bad.toml", sets);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("sizes and counts parse the way people write them", "[config]") {
  CHECK(parse_size("512MiB") == 512ull << 20);
  CHECK(parse_size("80GiB") == 80ull << 30);
  CHECK(parse_size("1.5GB") == 1500000000ull);
  CHECK(parse_size("2 gib") == 2ull << 30);
  CHECK(parse_size("4096") == 4096ull);
  CHECK(parse_size("10EiB") == 10ull << 60);  // past 2^63 (llround overflowed there)
  CHECK_FALSE(parse_size("16EiB"));           // 2^64: past uint64_t
  CHECK_FALSE(parse_size("12 parsecs"));
  CHECK_FALSE(parse_size("GiB"));
  CHECK(parse_count("4k") == 4096);
  CHECK(parse_count("1M") == 1 << 20);
  CHECK(parse_count("1.5k") == 1536);
  CHECK_FALSE(parse_count("1.3"));
  CHECK_FALSE(parse_count("4q"));
  // ... and print back in the same units, or exactly.
  CHECK(format_count(4096) == "4k");
  CHECK(format_count(1 << 20) == "1M");
  CHECK(format_count(2598161) == "2598161");
  CHECK(format_grouped(2598161) == "2,598,161");
  CHECK(format_grouped(999) == "999");
  CHECK(format_grouped(1000) == "1,000");
  CHECK(format_grouped(-1234567) == "-1,234,567");
}

TEST_CASE("a valid config reads every section and defaults the rest", "[config]") {
  Config c = parse_config(R"(
[model]
n_layer = 3
n_embd = 48
n_head = 4
[train]
seq_len = "1k"
[device]
memory = "2GiB"
[remat]
policy = "full"
every = 3
blocks = [0, 1]
)",
                          "ok.toml");
  CHECK(c.model.n_layer == 3);
  CHECK(c.model.ff() == 192);
  CHECK(c.train.seq_len == 1024);
  CHECK(c.device.memory_bytes == 2ull << 30);
  CHECK(c.remat.blocks == std::vector<int64_t>{0, 1});
  CHECK(c.train.batch_size == 4);  // default
}

TEST_CASE("set overrides (--set) apply to any key with the same validation", "[config]") {
  Config c = parse_config(
      "[train]\nseq_len = 64\n", "ok.toml",
      {"train.seq_len=128", "remat.policy=full", "device.memory=1.5GB", "remat.blocks=[1]"});
  CHECK(c.train.seq_len == 128);
  CHECK(c.remat.policy == "full");
  CHECK(c.device.memory_bytes == 1500000000ull);
  CHECK(c.remat.blocks == std::vector<int64_t>{1});
  CHECK_THAT(error_of("", {"train.seq_len=abc"}),
             Contains("--set train.seq_len=abc") && Contains("train.seq_len"));
  CHECK_THAT(error_of("", {"model.n_layers=3"}),
             Contains("unknown key 'n_layers'") && Contains("n_layer"));
  CHECK_THAT(error_of("", {"nosection"}), Contains("malformed override"));
  CHECK_THAT(error_of("", {"optim.lr=1"}), Contains("unknown section [optim]"));
}

TEST_CASE("config errors name file, line, key and the fix", "[config]") {
  // unknown key, with line and column
  CHECK_THAT(error_of("[model]\nn_layer = 2\nn_heads = 4\n"),
             Contains("bad.toml:3:1") && Contains("model.n_heads") && Contains("unknown key") &&
                 Contains("Fix:"));
  // wrong type
  CHECK_THAT(error_of("[train]\nseq_len = 1.5\n"), Contains("bad.toml:2:") &&
                                                       Contains("train.seq_len") &&
                                                       Contains("expected an integer"));
  // out of range
  CHECK_THAT(error_of("[train]\nbatch_size = 0\n"),
             Contains("train.batch_size") && Contains("out of range"));
  CHECK_THAT(error_of("[train]\nlr = -1.0\n"), Contains("train.lr") && Contains("out of range"));
  // bad choice
  CHECK_THAT(
      error_of("[remat]\npolicy = \"sometimes\"\n"),
      Contains("remat.policy") && Contains("unknown value \"sometimes\"") && Contains("\"full\""));
  // inconsistent values, pointing at the key to change
  CHECK_THAT(error_of("[model]\nn_embd = 64\nn_head = 5\n"),
             Contains("bad.toml:3:") && Contains("model.n_head") && Contains("not divisible"));
  CHECK_THAT(error_of("[model]\nn_ctx = 128\n[train]\nseq_len = 256\n"),
             Contains("bad.toml:4:") && Contains("train.seq_len") && Contains("n_ctx"));
  CHECK_THAT(error_of("[model]\nn_layer = 2\n[remat]\nevery = 3\n"), Contains("remat.every"));
  CHECK_THAT(error_of("[model]\nn_layer = 2\n[remat]\nblocks = [0, 5]\n"),
             Contains("remat.blocks") && Contains("block 5"));
  CHECK_THAT(error_of("[remat]\nattention_chunk = 100\n"),
             Contains("bad.toml:2:") && Contains("remat.attention_chunk") &&
                 Contains("multiple of 64") && Contains("Fix:"));
  CHECK_THAT(error_of("[remat]\nattention_chunk = -64\n"),
             Contains("remat.attention_chunk") && Contains("out of range"));
  CHECK_THAT(error_of("[device]\nmemory = \"lots\"\n"),
             Contains("device.memory") && Contains("512MiB"));
  // A float TOML cannot hold, from --set (a word then): out of range, not "got a string".
  CHECK_THAT(error_of("", {"train.lr=1e400"}),
             Contains("train.lr: 1e400 is out of range") && Contains("[0, 10]"));
  CHECK_THAT(error_of("", {"model.norm_eps=1e-400"}),
             Contains("model.norm_eps: 0 is out of range (a float below 1e-308 reads as 0)"));
  CHECK_THAT(error_of("", {"model.norm_eps=0"}),
             Contains("model.norm_eps: 0 is out of range. Fix"));
  // Exbibytes are a size, too large for a budget (was "not a size").
  CHECK_THAT(error_of("[device]\nmemory = \"1EiB\"\n"),
             Contains("device.memory") && Contains("out of range (at most 1024.00 TiB)"));
  // A size with a range of its own says that range, not a memory budget's.
  CHECK_THAT(error_of("[parallel]\nbucket_bytes = 0\n"), Contains("parallel.bucket_bytes") &&
                                                             Contains("outside 4 KiB .. 4 GiB") &&
                                                             !Contains("1 PiB"));
  CHECK_THAT(error_of("[model]\nkind = \"mlp\"\n[data]\ntask = \"copy\"\n"), Contains("data.task"));
  // From --set, a sequence model's key is ignored by the MLP (one override list sweeps both
  // kinds), unless it would change the model: a RoPE scaling the user expects to apply.
  const std::string mlp = "[model]\nkind = \"mlp\"\n";
  CHECK(error_of(mlp, {"model.rope_theta=10000"}).empty());
  CHECK(error_of(mlp, {"model.rope_scaling={rope_type=\"default\"}"}).empty());
  CHECK_THAT(error_of(mlp, {"model.rope_scaling={rope_type=\"linear\",factor=4.0}"}),
             Contains("model.rope_scaling applies to model.kind = \"llama\", not "
                      "\"mlp\"") &&
                 Contains("Fix:"));
  CHECK_THAT(error_of("[model]\nposition = \"rope\"\nn_embd = 12\nn_head = 4\n"),
             Contains("even head size"));
  // a key or table given twice: the line says which (toml++ garbled a quoted key's name)
  CHECK_THAT(error_of("[train]\nseq_len = 64\n\"seq_len\" = 32\n"),
             Contains("bad.toml:3: [config] `\"seq_len\" = 32` defines a key or table given "
                      "earlier") &&
                 Contains("Fix: keep one of them"));
  CHECK_THAT(error_of("[train]\nsteps = 1\n[train]\n"), Contains("bad.toml:3: [config] `[train]`"));
  // unknown section and syntax errors
  CHECK_THAT(error_of("[optimizer]\nlr = 1\n"), Contains("unknown section [optimizer]"));
  CHECK_THAT(error_of("[model\nn_layer = 2\n"),
             Contains("bad.toml:1:") && Contains("TOML syntax error"));
  // each message is one line
  CHECK(error_of("[model]\nn_heads = 4\n").find('\n') == std::string::npos);
}

TEST_CASE("a missing config file is a config error naming the path", "[config]") {
  CHECK_THROWS_AS(load_config("/nonexistent/x.toml"), ConfigError);
  CHECK_THROWS_WITH(load_config("/nonexistent/x.toml"), Contains("/nonexistent/x.toml"));
}

TEST_CASE("rope lifts the n_ctx bound on seq_len", "[config]") {
  Config c = parse_config("[model]\nposition = \"rope\"\nn_ctx = 128\n[train]\nseq_len = 4096\n",
                          "ok.toml");
  CHECK(c.train.seq_len == 4096);
}

TEST_CASE("with learned positions seq_len may equal n_ctx, and one more is an error", "[config]") {
  const std::string learned = "[model]\nposition = \"learned\"\nn_ctx = 128\n[train]\nseq_len = ";
  CHECK(parse_config(learned + "128\n", "edge.toml").train.seq_len == 128);
  CHECK_THAT(error_of(learned + "129\n"), Contains("train.seq_len") && Contains("n_ctx = 128"));
}

TEST_CASE("the key table states what the readers accept, one row per key", "[config]") {
  const std::string table = config_keys_markdown();
  // The ranges come from the readers themselves: the bounds below are the ones they enforce.
  CHECK_THAT(table, Contains("| `model.n_layer` | integer | `2` | 1..4096 |"));
  CHECK_THAT(table, Contains("| `train.seq_len` | count | `256` | 1..4096M |"));
  CHECK_THAT(table, Contains("| `remat.policy` | string | `\"none\"` | \"none\" \\| \"full\""));
  CHECK_THROWS(parse_config("[model]\nn_layer = 4097\n", "t.toml"));
  CHECK_NOTHROW(parse_config("[model]\nn_layer = 4096\n", "t.toml"));  // reading works after
  size_t rows = 0;
  for (size_t at = 0; (at = table.find("\n| `", at)) != std::string::npos; ++at) ++rows;
  CHECK_THAT(table, Contains("| `parallel.data` | integer | `0` | 0..65536 |"));
  CHECK_THAT(table, Contains("| `lora.rank` | integer | `0` | 0..65536 |"));
  CHECK_THAT(table, Contains("| `lora.alpha` | number | `16` |"));
  CHECK(rows == 73);
}
