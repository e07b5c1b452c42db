// The remat policies, as one table: every list of policy names (config validation, per-block
// plans, auto's candidates, the rows of plan / fit / sweep / compare, their --policies checks)
// is read from it, so adding a policy is one row here plus its keep rule. A policy is a value of
// remat.policy, so its table lives with the config that checks it; engine/remat turns the chosen
// one into a plan and runs it.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/config/act_kind.h"
#include "engine/config/config.h"

namespace remat {

struct Policy {
  const char* name;
  /// What a block keeps after its forward pass, besides its segment's checkpoint input (Markdown).
  const char* keeps;
  /// A built-in policy: a whole-model choice of its own, a row of `plan`, `fit` and `sweep`, a
  /// per-block choice in remat.plan and one of auto's candidates.
  bool builtin;
  /// Built-in only: 0 keeps the most (no recompute); each next rank keeps a subset of the
  /// previous one's tensors (auto searches in this order).
  int memory_rank;
  /// Built-in only: keeps activations of this kind.
  bool (*keeps_kind)(ActKind);
};

/// The table, in the order the tool lists policies: none, full, save_dots, save_attn, names, auto.
const std::vector<Policy>& policy_table();
/// The table as Markdown (`remat-train keys --policies`, the list of policies in docs/remat.md).
std::string policy_table_markdown();
/// The table row named `name`, or nullptr.
const Policy* find_policy(std::string_view name);
/// Every name the config accepts for remat.policy.
std::vector<std::string> policy_names();
/// The built-in policies, in listing order (none, full, save_dots, save_attn).
const std::vector<std::string>& builtin_policies();
/// The built-in policies from the most memory to the least (auto's order).
const std::vector<std::string>& builtin_policies_by_memory();

/// One entry of --policies: a policy, optionally with the MLP tiled and/or offload, so that
/// compare, fit and sweep can set combinations side by side: "full", "full:tile=1024",
/// "full:offload=checkpoints", "save_attn:tile=512:offload=checkpoints+optimizer".
struct PolicyVariant {
  std::string policy;
  std::optional<int64_t> tile_tokens;  // remat.tile_tokens
  std::optional<OffloadKind> offload;  // remat.offload
};
/// Parses one --policies entry; throws ConfigError naming --policies and the accepted forms.
PolicyVariant parse_policy_variant(const std::string& entry, const std::string& command);

/// --policies of `command` ("compare", "fit", "sweep"): the given entries (or `defaults` when
/// none are given), each a built-in, "names", or (when `auto_refusal` is empty) "auto", with
/// optional ":tile=N" and ":offload=KIND" settings (PolicyVariant). An unknown name or setting,
/// or auto where `auto_refusal` explains why it has no place, is a ConfigError naming the flag
/// and the accepted names.
std::vector<std::string> parse_policies(const std::vector<std::string>& given,
                                        const std::vector<std::string>& defaults,
                                        const std::string& command,
                                        const std::string& auto_refusal = "");

/// `cfg` with its policy swapped for `policy` (a --policies entry) on every block: its
/// remat.tile_tokens and remat.offload when the entry sets them, remat.policy set, a per-block
/// remat.plan cleared (it would override the policy), remat.save cleared unless the policy is
/// "names" (which, given no names, keeps the attention outputs "attn" and "attn.lse");
/// remat.every and remat.blocks stay as configured. What compare, fit, sweep and train's
/// "policies that fit" mean by "the same run under policy p".
Config with_policy(const Config& cfg, const std::string& policy);

/// with_policy as --set overrides, for a child process (fit --measure, sweep).
std::vector<std::string> policy_overrides(const Config& cfg, const std::string& policy);

}  // namespace remat
