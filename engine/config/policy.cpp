// The remat policy table (see engine/config/policy.h).
#include "engine/config/policy.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/core/error.h"
#include "engine/core/units.h"

namespace remat {

const std::vector<Policy>& policy_table() {
  static const std::vector<Policy> table = {
      {"none", "every activation: nothing is recomputed", true, 0, [](ActKind) { return true; }},
      {"full",
       "nothing but its segment's input `x`: the segment is recomputed, block by block, right "
       "before its backward pass",
       true, 3, [](ActKind) { return false; }},
      {"save_dots",
       "the GEMM and attention outputs; LayerNorms and activations are recomputed (JAX's "
       "`dots_saveable`): a few percent of memory for almost no recompute",
       true, 1, [](ActKind k) { return k == ActKind::Dot || k == ActKind::Attention; }},
      {"save_attn",
       "the attention outputs `attn attn.lse`: the O(T^2) attention is never recomputed", true, 2,
       [](ActKind k) { return k == ActKind::Attention; }},
      {"names",
       "exactly the activations named in `remat.save = [...]` (JAX's `save_only_these_names`)",
       false, 0, nullptr},
      {"auto",
       "per block, the built-in policy the planner picks: the least recompute whose peak fits "
       "`device.memory`; when no plan fits, it tiles the MLP (`remat.tile_tokens`) and tries "
       "again, "
       "then (GPU targets) moves checkpoints, then AdamW moments, then weights and gradients to "
       "host memory (`remat.offload`), then pairs blocks into checkpoint segments (`remat.every`)",
       false, 0, nullptr},
  };
  return table;
}

std::string policy_table_markdown() {
  std::string out =
      "| policy | a checkpointed block keeps after its forward pass | memory (1 keeps most) |\n"
      "|---|---|---|\n";
  for (const Policy& p : policy_table())
    out += fmt::format("| `{}` | {} | {} |\n", p.name, p.keeps,
                       p.builtin ? fmt::format("{}", p.memory_rank + 1) : "-");
  return out;
}

const Policy* find_policy(std::string_view name) {
  for (const Policy& p : policy_table())
    if (name == p.name) return &p;
  return nullptr;
}

std::vector<std::string> policy_names() {
  std::vector<std::string> out;
  for (const Policy& p : policy_table()) out.emplace_back(p.name);
  return out;
}

const std::vector<std::string>& builtin_policies() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const Policy& p : policy_table())
      if (p.builtin) out.emplace_back(p.name);
    return out;
  }();
  return names;
}

const std::vector<std::string>& builtin_policies_by_memory() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out = builtin_policies();
    std::stable_sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) {
      return find_policy(a)->memory_rank < find_policy(b)->memory_rank;
    });
    return out;
  }();
  return names;
}

PolicyVariant parse_policy_variant(const std::string& entry, const std::string& command) {
  PolicyVariant v;
  size_t at = entry.find(':');
  v.policy = entry.substr(0, at);
  const auto bad = [&](const std::string& what) {
    return ConfigError(
        fmt::format("--policies: [{}] \"{}\": {}. Fix: write POLICY[:tile=N][:offload=KIND], e.g. "
                    "full:tile=1024:offload=checkpoints (KIND: {})",
                    command, entry, what, offload_names(", ")));
  };
  while (at != std::string::npos) {
    const size_t next = entry.find(':', at + 1);
    const std::string setting =
        entry.substr(at + 1, next == std::string::npos ? next : next - at - 1);
    const size_t eq = setting.find('=');
    const std::string key = setting.substr(0, eq),
                      value = eq == std::string::npos ? "" : setting.substr(eq + 1);
    if (key == "tile" && !v.tile_tokens) {
      const std::optional<int64_t> n = parse_count(value);
      if (!n || *n < 0) throw bad(fmt::format("tile=\"{}\" is not a row count", value));
      v.tile_tokens = *n;
    } else if (key == "offload" && !v.offload) {
      for (OffloadKind k : offload_kinds())
        if (value == config_name(k)) v.offload = k;
      if (!v.offload) throw bad(fmt::format("offload=\"{}\" is not an offload kind", value));
    } else {
      throw bad(fmt::format("unknown or repeated setting \"{}\"", setting));
    }
    at = next;
  }
  return v;
}

std::vector<std::string> parse_policies(const std::vector<std::string>& given,
                                        const std::vector<std::string>& defaults,
                                        const std::string& command,
                                        const std::string& auto_refusal) {
  std::vector<std::string> accepted = builtin_policies();
  accepted.emplace_back("names");
  if (auto_refusal.empty()) accepted.emplace_back("auto");
  const std::vector<std::string>& policies = given.empty() ? defaults : given;
  for (size_t i = 0; i < policies.size(); ++i)
    if (std::find(policies.begin(), policies.begin() + static_cast<std::ptrdiff_t>(i),
                  policies[i]) != policies.begin() + static_cast<std::ptrdiff_t>(i))
      throw ConfigError(
          fmt::format("--policies: [{}] \"{}\" is listed twice. Fix: name each policy once",
                      command, policies[i]));
  for (const std::string& entry : policies) {
    const std::string p = parse_policy_variant(entry, command).policy;
    if (p == "auto" && !auto_refusal.empty())
      throw ConfigError(fmt::format("--policies: [{}] {}", command, auto_refusal));
    if (std::find(accepted.begin(), accepted.end(), p) == accepted.end())
      throw ConfigError(fmt::format("--policies: [{}] unknown policy \"{}\". Fix: use {}", command,
                                    p, fmt::join(accepted, ", ")));
  }
  return policies;
}

namespace {
const std::vector<std::string> kDefaultSavedNames = {"attn", "attn.lse"};
}  // namespace

Config with_policy(const Config& cfg, const std::string& entry) {
  const PolicyVariant v = parse_policy_variant(entry, "policy");
  const std::string& policy = v.policy;
  Config c = cfg;
  if (v.tile_tokens) c.remat.tile_tokens = *v.tile_tokens;
  if (v.offload) c.remat.offload = *v.offload;
  c.remat.policy = policy;
  c.remat.plan.clear();
  if (policy != "names")
    c.remat.save.clear();
  else if (c.remat.save.empty())
    c.remat.save = kDefaultSavedNames;
  return c;
}

std::vector<std::string> policy_overrides(const Config& cfg, const std::string& entry) {
  const PolicyVariant v = parse_policy_variant(entry, "policy");
  const std::string& policy = v.policy;
  std::vector<std::string> s = {"remat.policy=" + policy};
  if (v.tile_tokens) s.push_back(fmt::format("remat.tile_tokens={}", *v.tile_tokens));
  if (v.offload) s.push_back(fmt::format("remat.offload=\"{}\"", config_name(*v.offload)));
  if (!cfg.remat.plan.empty()) s.emplace_back("remat.plan=[]");
  if (policy != "names" && !cfg.remat.save.empty()) s.emplace_back("remat.save=[]");
  if (policy == "names" && cfg.remat.save.empty())
    s.emplace_back(fmt::format("remat.save=[\"{}\"]", fmt::join(kDefaultSavedNames, "\",\"")));
  return s;
}

}  // namespace remat
