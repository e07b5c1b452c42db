// `remat-train plan`: predict peak memory, FLOPs and the longest context per policy without
// computing anything (the executor on the count backend; engine/planner/planner.h), including the
// plan remat.policy = "auto" chooses; --emit-config prints only that plan, as a [remat] table.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "cmd/commands.h"
#include "cmd/report.h"
#include "cmd/train_lora.h"
#include "engine/config/config.h"
#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/planner/planner.h"
#include "layers/models.h"

namespace remat::cli {
namespace {

struct PolicyRow {
  std::string label;
  DryRun run;
  int64_t longest = 0;
  int64_t max_batch = 0;
};

double phase_flops(const DryRun& r, Phase p) {
  return r.cost[static_cast<size_t>(p)].flops;
}

nlohmann::json row_json(const PolicyRow& r, const Planner& planner) {
  const PlanTarget& t = planner.target();
  nlohmann::json cats = nlohmann::json::object();
  for (int i = 0; i < kNumMemCategories; ++i)
    cats[mem_category_name(static_cast<MemCategory>(i))] =
        r.run.peak.by_category[static_cast<size_t>(i)];
  nlohmann::json largest = nlohmann::json::array();
  for (const auto& l : r.run.peak.largest)
    largest.push_back({{"name", l.name}, {"bytes", l.bytes}});
  nlohmann::json flops = nlohmann::json::object();
  for (int i = 0; i < kNumPhases; ++i)
    flops[phase_name(static_cast<Phase>(i))] = phase_flops(r.run, static_cast<Phase>(i));
  const CopyTime ct = copy_time(r.run, t);
  nlohmann::json copies = {{"to_host_bytes", r.run.to_host_bytes()},
                           {"to_device_bytes", r.run.to_device_bytes()}};
  nlohmann::json by_phase = nlohmann::json::object();
  for (int i = 0; i < kNumPhases; ++i) {
    const OpCost& c = r.run.cost[static_cast<size_t>(i)];
    if (c.to_host_bytes + c.to_device_bytes > 0)
      by_phase[phase_name(static_cast<Phase>(i))] = {{"to_host_bytes", c.to_host_bytes},
                                                     {"to_device_bytes", c.to_device_bytes}};
  }
  copies["by_phase"] = by_phase;
  if (ct.modelled) {
    copies["copy_seconds"] = ct.copy_s;
    copies["compute_seconds_at_peak"] = ct.compute_s;
    copies["exposed_seconds"] = ct.exposed_s;
    copies["host_update_seconds"] = ct.host_update_s;
  }
  nlohmann::json row = {{"policy", r.label},
                        {"peak_bytes", r.run.peak.total_bytes},
                        {"predicted_device_bytes", r.run.peak.total_bytes + t.reserve_bytes},
                        {"host_peak_bytes", r.run.host_peak.total_bytes},
                        {"fits", planner.fits(r.run)},
                        {"copies_per_step", copies},
                        {"peak_by_category", cats},
                        {"peak_phase", r.run.peak.phase},
                        {"largest_at_peak", largest},
                        {"flops", flops},
                        {"recompute_overhead", r.run.recompute_overhead()},
                        {"longest_seq_len", r.longest},
                        {"largest_batch", r.max_batch}};
  if (r.run.ranks > 1) {  // every figure above is one rank's
    nlohmann::json ex = {{"ranks", r.run.ranks},
                         {"context_ranks", r.run.context_ranks},
                         {"gradient_bytes_per_rank", r.run.grad_sent_bytes},
                         {"shard_optimizer", r.run.sharded_optimizer},
                         {"ring_bytes_per_rank", r.run.ring_bytes()}};
    if (const ExchangeTime et = exchange_time(r.run, t); et.modelled) {
      ex["gradient_seconds"] = et.gradient_s;
      ex["ring_seconds"] = et.ring_s;
      ex["compute_seconds_at_peak"] = et.compute_s;
      ex["exposed_seconds"] = et.exposed_s;
      ex["gradient_link"] = et.gradient_link;
      ex["ring_link"] = et.ring_link;
    }
    row["parallel"] = ex;
  }
  return row;
}

// What `train` does to the LM head's chunk for the configured plan on this target
// (resolve_loss_chunk): with room, on a GPU or for a frozen head on the CPU, larger chunks than the
// default the rows above use.
struct HeadChunk {
  int64_t default_rows = 0, train_rows = 0;
  uint64_t train_peak_bytes = 0;
};
std::optional<HeadChunk> head_chunk(const Planner& planner, Config cfg) {
  if (largest_loss_chunk(planner, cfg) == 0) return std::nullopt;
  HeadChunk h;
  h.default_rows = default_loss_chunk(cfg);
  h.train_rows = resolve_loss_chunk(planner, cfg).value_or(h.default_rows);
  h.train_peak_bytes = planner.dry_run(cfg, false).peak.total_bytes;
  return h;
}

}  // namespace

int run_plan(const PlanOptions& opt) {
  std::vector<std::string> sets = opt.overrides;
  if (opt.seq_len) {
    add_flag_override(sets, fmt::format("train.seq_len={}", *opt.seq_len),
                      fmt::format("--seq-len {}", *opt.seq_len));
  }
  if (opt.batch_size) {
    add_flag_override(sets, fmt::format("train.batch_size={}", *opt.batch_size),
                      fmt::format("--batch-size {}", *opt.batch_size));
  }
  add_rank_sets(sets, opt.config_path, opt.ranks, opt.context);
  Config cfg = load_config(opt.config_path, sets);
  // A GPU plan at a --seq-len sizes a learned position table to it; the MLP has none.
  // A Hugging Face model's table is its config.json's (model.from_hf), n_positions included.
  if (!opt.gpu.empty() && opt.seq_len && cfg.model.has_sequence() && cfg.model.from_hf.empty()) {
    sets.push_back("model.n_ctx=" + std::to_string(std::max<int64_t>(*opt.seq_len, 1)));
    cfg = load_config(opt.config_path, sets);
  }
  const PlanTarget target = plan_target(cfg, opt.gpu, opt.memory);
  const Planner planner(target, make_run_parts);
  const AutoPlan chosen = choose_auto(planner, cfg);
  if (opt.emit_config) {
    if (!chosen.fits) throw OutOfMemory(chosen.infeasible_message());
    fmt::print("{}", auto_remat_table(chosen, target));
    return 0;
  }

  std::vector<PolicyRow> rows;
  auto add_row = [&](const std::string& label, const Config& c) {
    PolicyRow r{label, planner.dry_run(c), 0, 0};
    if (c.model.has_sequence()) r.longest = planner.longest_seq_len(c, &r.run);
    r.max_batch = planner.largest_batch(c, &r.run);
    rows.push_back(std::move(r));
  };
  for (const auto& p : builtin_policies()) {
    Config c = cfg;
    c.remat.policy = p;
    c.remat.plan.clear();
    c.remat.blocks.clear();
    c.remat.every = 1;
    add_row(p, c);
  }
  const bool configured_auto = cfg.remat.policy == "auto";
  add_row(chosen.fits ? (configured_auto ? "auto (configured)" : "auto") : "auto: nothing fits",
          with_auto_plan(cfg, chosen));
  if (!configured_auto) {
    const std::string configured =
        cfg.remat.plan.empty() ? fmt::format("{} (every {}{})", cfg.remat.policy, cfg.remat.every,
                                             cfg.remat.blocks.empty() ? "" : ", some blocks")
                               : "per-block plan";
    const auto& builtins = builtin_policies();
    const auto same = std::find(builtins.begin(), builtins.end(), cfg.remat.policy);
    if (cfg.remat.plan.empty() && cfg.remat.blocks.empty() && cfg.remat.every == 1 &&
        same != builtins.end()) {
      // The configured policy is one of the rows above, run on the same config: reuse it.
      PolicyRow r = rows[static_cast<size_t>(same - builtins.begin())];
      r.label = "configured: " + configured;
      rows.push_back(std::move(r));
    } else {
      add_row("configured: " + configured, cfg);
    }
  }
  const std::optional<HeadChunk> head =
      head_chunk(planner, configured_auto ? with_auto_plan(cfg, chosen) : cfg);
  std::string auto_plan;
  for (const auto& p : chosen.policies)
    auto_plan += fmt::format("{}\"{}\"", auto_plan.empty() ? "" : ", ", p);

  if (opt.json) {
    nlohmann::json out = {{"config", cfg.path},
                          {"target", target.name},
                          {"device_bytes", target.device_bytes},
                          {"reserve_bytes", target.reserve_bytes},
                          {"reserve_note", target.reserve_note},
                          {"pool_budget_bytes", target.pool_budget()},
                          {"host_budget_bytes", target.host_bytes},
                          {"host_note", target.host_note},
                          {"link_bytes_per_s", target.link_bytes_per_s},
                          {"peak_flops_per_s", target.peak_flops_per_s},
                          {"activation_dtype", dtype_name(target.count.act_dtype)},
                          {"seq_len", cfg.train.seq_len},
                          {"batch_size", cfg.train.batch_size},
                          {"tile_tokens", cfg.remat.tile_tokens},
                          {"offload", config_name(cfg.remat.offload)},
                          {"n_params", rows.front().run.n_params},
                          {"policies", nlohmann::json::array()}};
    for (const auto& r : rows) out["policies"].push_back(row_json(r, planner));
    if (cfg.train.grad_accum > 1) out["grad_accum"] = cfg.train.grad_accum;  // CPU plans keep shape
    if (cfg.lora.enabled())  // so that plans without adapters keep their shape
      out["lora"] = lora_json(cfg, rows.front().run.n_trainable_params);
    // Only where attention runs over chunks (remat.attention_chunk, or a CUDA target past cuDNN's
    // limit), so that plans without it keep their shape.
    if (const AttentionChunks ch = attention_chunks_of(cfg, target.count.device); ch.chunked())
      out["attention_chunks"] = {
          {"tokens", ch.L}, {"count", ch.count()}, {"automatic", cfg.remat.attention_chunk == 0}};
    if (head)  // GPU targets and frozen heads only, so that other CPU plans keep their shape
      out["loss_chunk"] = {{"default_rows", head->default_rows},
                           {"train_rows", head->train_rows},
                           {"train_peak_bytes", head->train_peak_bytes}};
    out["auto"] = {{"plan", chosen.policies},
                   {"fits", chosen.fits},
                   {"peak_bytes", chosen.peak_bytes},
                   {"min_peak_bytes", chosen.min_peak_bytes},
                   {"recompute_flops", chosen.recompute_flops},
                   {"recompute_overhead", chosen.recompute_overhead},
                   {"dry_runs", chosen.n_dry_runs},
                   {"tile_tokens", chosen.tile_tokens},
                   {"offload", config_name(chosen.offload)},
                   {"every", chosen.every},
                   {"host_peak_bytes", chosen.host_peak_bytes}};
    fmt::print("{}\n", json_text(out, 2));
    return 0;
  }

  fmt::print("plan  {} on {} | device {} - reserve {} = budget {} | {} activations\n", cfg.path,
             target.name, format_bytes(target.device_bytes), format_bytes(target.reserve_bytes),
             format_bytes(target.pool_budget()), dtype_name(target.count.act_dtype));
  fmt::print("      reserve: {}\n", target.reserve_note);
  fmt::print("      host memory for offload: {} ({}){}\n", format_bytes(target.host_bytes),
             target.host_note,
             target.rates_note.empty() ? "" : fmt::format(" | {}", target.rates_note));
  fmt::print("model {} L={} C={} | {:.2f}M params{} | batch {} x seq_len {}{}{}{}\n\n",
             cfg.model.kind, cfg.model.n_layer, cfg.model.n_embd,
             static_cast<double>(rows.front().run.n_params) / 1e6,
             lora_summary(cfg, rows.front().run.n_trainable_params), cfg.train.batch_size,
             cfg.train.seq_len,
             cfg.train.grad_accum > 1
                 ? fmt::format(" x grad_accum {} (FLOPs per optimizer step)", cfg.train.grad_accum)
                 : std::string(),
             parallel_note(cfg), tiling_note(cfg) + attention_chunk_note(cfg, target.count.device));
  fmt::print("{:<28} {:>11} {:>11} {:>11} {:>11} {:>10} {:>5}  {:<22} {:>12} {:>9}\n", "policy",
             "peak", "activations", "checkpoints", "host peak", "recompute", "fits", "peak during",
             "longest T", "max batch");
  for (const auto& r : rows) {
    const auto& pk = r.run.peak;
    fmt::print(
        "{:<28} {:>11} {:>11} {:>11} {:>11} {:>9.1f}% {:>5}  {:<22} {:>12} {:>9}\n", r.label,
        format_bytes(pk.total_bytes),
        format_bytes(pk.by_category[static_cast<size_t>(MemCategory::Activations)]),
        format_bytes(pk.by_category[static_cast<size_t>(MemCategory::Checkpoints)]),
        r.run.host_peak.total_bytes ? format_bytes(r.run.host_peak.total_bytes) : std::string("-"),
        100.0 * r.run.recompute_overhead(), planner.fits(r.run) ? "yes" : "NO", pk.phase,
        cfg.model.has_sequence() ? format_count(r.longest) : std::string("-"), r.max_batch);
  }
  if (chosen.fits)
    fmt::print("\nauto: {}\n      plan = [{}] (--emit-config prints it as a [remat] table)\n",
               chosen.summary(), auto_plan);
  else
    fmt::print(
        "\nauto: nothing fits: the smallest achievable peak is {} (every block \"full\"), over the "
        "budget of {}\n",
        format_bytes(chosen.min_peak_bytes), format_bytes(chosen.budget_bytes));
  const PolicyRow& c = rows.back();
  fmt::print("\nconfigured policy in detail: peak {} ({} B) during {}\n",
             format_bytes(c.run.peak.total_bytes), c.run.peak.total_bytes, c.run.peak.phase);
  for (int i = 0; i < kNumMemCategories; ++i) {
    const uint64_t b = c.run.peak.by_category[static_cast<size_t>(i)];
    if (b)
      fmt::print("  {:<13} {:>12}\n", mem_category_name(static_cast<MemCategory>(i)),
                 format_bytes(b));
  }
  fmt::print("  largest live at the peak:");
  for (const auto& l : c.run.peak.largest) fmt::print(" {} {};", l.name, format_bytes(l.bytes));
  fmt::print(
      "\n  FLOPs per step: forward {}, loss {}, backward {}, recompute {} (+{:.1f}%), optimizer "
      "{}{}\n",
      format_flops(phase_flops(c.run, Phase::Forward)),
      format_flops(phase_flops(c.run, Phase::Loss)),
      format_flops(phase_flops(c.run, Phase::Backward)),
      format_flops(phase_flops(c.run, Phase::Recompute)), 100.0 * c.run.recompute_overhead(),
      format_flops(phase_flops(c.run, Phase::Optimizer)), attention_flops_note(cfg));
  if (c.run.host_peak.total_bytes || c.run.to_host_bytes() > 0) {
    // What the host holds at its peak, by category (checkpoints; moments; weights, gradients).
    std::string parts;
    for (MemCategory cat : {MemCategory::Checkpoints, MemCategory::Optimizer, MemCategory::Weights,
                            MemCategory::Grads})
      if (const uint64_t b = c.run.host_peak.by_category[static_cast<size_t>(cat)]; b > 0)
        parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", format_bytes(b),
                             mem_category_name(cat));
    fmt::print("  host pool: peak {} ({} B) of budget {}: {}\n",
               format_bytes(c.run.host_peak.total_bytes), c.run.host_peak.total_bytes,
               format_bytes(target.host_bytes), parts.empty() ? "nothing" : parts);
    fmt::print("{}\n", copy_line(c.run, target));
    fmt::print("{}\n", copy_phase_line(c.run, target));
  }
  if (c.run.ranks > 1) fmt::print("{}\n", exchange_line(c.run, target));
  const bool head_grows = head && head->train_rows != head->default_rows;
  if (head_grows)
    fmt::print(
        "  LM head: the rows above run it in chunks of {} rows; train gives it {} where the budget "
        "has room (peak {})\n",
        head->default_rows, head->train_rows, format_bytes(head->train_peak_bytes));
  if (!target.reserve_bytes)  // with the head's larger chunk, the peak train gives it
    fmt::print("  (on the CPU a real run measures exactly {} peak)\n",
               head_grows ? "that" : "this");
  return 0;
}

}  // namespace remat::cli
