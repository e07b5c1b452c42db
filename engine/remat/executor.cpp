// Remat plan resolution and the executor (see engine/remat/executor.h).
#include "engine/remat/executor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <utility>

#include "engine/config/policy.h"
#include "engine/core/error.h"
#include "engine/remat/weight_stream.h"

namespace remat {

// ---- ActStore ----

ActStore::ActStore(std::string prefix, size_t n_slots, std::vector<MemCategory> categories)
    : prefix_(std::move(prefix)), slots_(n_slots), categories_(std::move(categories)) {}

bool ActStore::complete() const {
  return std::all_of(slots_.begin(), slots_.end(), [](const Buffer& b) { return !b.empty(); });
}

const Tensor& ActStore::get(size_t slot) const {
  REMAT_ASSERT(!slots_[slot].empty(), "{}: activation slot {} used before it was computed", prefix_,
               slot);
  return slots_[slot].tensor();
}

const Tensor& ActStore::make(Backend& be, size_t slot, const std::vector<int64_t>& shape,
                             DType dtype, const std::vector<std::string>& names) {
  if (slots_[slot].empty())
    slots_[slot] = be.pool().allocate(shape, dtype, categories_[slot],
                                      fmt::format("{}.{}", prefix_, names[slot]));
  return slots_[slot].tensor();
}

void ActStore::keep_only(const std::vector<bool>& keep) {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!keep[i]) slots_[i].reset();
}

void ActStore::clear() {
  for (auto& s : slots_) s.reset();
}

// ---- plan ----

std::string RematPlan::describe() const {
  if (policy == "none") return "none (keep every activation)";
  size_t n_ckpt = 0;
  for (const auto& b : blocks) n_ckpt += b.checkpointed;
  return fmt::format("{} (every {}, {} of {} blocks checkpointed, {} segments)", policy, every,
                     n_ckpt, blocks.size(), segments.size());
}

std::vector<bool> policy_keep_set(const std::string& policy, const std::vector<std::string>& save,
                                  const Block& block) {
  const auto& names = block.act_names();
  const auto& kinds = block.act_kinds();
  const Policy* p = find_policy(policy);
  REMAT_ASSERT(p && (p->keeps_kind || policy == "names"), "no keep rule for policy \"{}\"", policy);
  std::vector<bool> keep(names.size(), false);
  for (size_t i = 0; i < names.size(); ++i)
    keep[i] = p->keeps_kind ? p->keeps_kind(kinds[i])
                            : std::find(save.begin(), save.end(), names[i]) != save.end();
  return keep;
}

RematPlan resolve_remat_plan(const Config& cfg, Model& model) {
  const RematConfig& rc = cfg.remat;
  const size_t L = model.n_blocks();
  RematPlan plan;
  plan.policy = rc.plan.empty() ? rc.policy : "per-block";
  plan.every = rc.every;
  // "auto" is the planner's: commands resolve it to a per-block plan (choose_auto_plan) first.
  if (rc.plan.empty() && rc.policy == "auto")
    throw_config_error(
        cfg, "remat.policy",
        "\"auto\" is chosen by the planner and this command does not resolve it",
        "choose a named policy (none, full, save_dots, save_attn) here; `remat-train plan "
        "--emit-config` prints the plan auto would choose");

  // The policy of each block: remat.plan, else remat.policy on the selected blocks.
  std::vector<std::string> policy(L, rc.policy);
  if (!rc.plan.empty()) {
    policy = rc.plan;
  } else if (!rc.blocks.empty()) {
    std::vector<bool> selected(L, false);
    for (int64_t b : rc.blocks) selected[static_cast<size_t>(b)] = true;
    for (size_t i = 0; i < L; ++i)
      if (!selected[i]) policy[i] = "none";
  }
  if (rc.policy == "names") {
    const auto& names = model.block(0).act_names();
    for (const auto& n : rc.save)
      if (std::find(names.begin(), names.end(), n) == names.end())
        throw_config_error(cfg, "remat.save", fmt::format("unknown activation name \"{}\"", n),
                           fmt::format("use names from: {}", fmt::join(names, ", ")));
  }

  plan.blocks.resize(L);
  for (size_t i = 0; i < L; ++i) {
    plan.blocks[i].keep = policy_keep_set(policy[i], rc.save, model.block(i));
    plan.blocks[i].checkpointed = policy[i] != "none";
  }
  // Runs of consecutive checkpointed blocks, cut every `every` blocks; each segment keeps the
  // input of its first block. Blocks under "none" are segments of their own.
  size_t i = 0;
  while (i < L) {
    size_t j = i + 1;
    if (plan.blocks[i].checkpointed) {
      while (j < L && plan.blocks[j].checkpointed && j - i < static_cast<size_t>(rc.every)) ++j;
      plan.blocks[i].keep[0] = true;
    }
    plan.segments.push_back({i, j});
    i = j;
  }
  plan.offload_checkpoints = rc.offloads_checkpoints();
  return plan;
}

// ---- executor ----

namespace {

std::vector<MemCategory> slot_categories(const BlockPlan& bp) {
  std::vector<MemCategory> cats(bp.keep.size(), MemCategory::Activations);
  if (bp.checkpointed && bp.keep[0]) cats[0] = MemCategory::Checkpoints;
  return cats;
}

MemCategory input_category(const RematPlan& plan, size_t i) {
  return i < plan.blocks.size() ? slot_categories(plan.blocks[i])[0] : MemCategory::Activations;
}

std::string input_name(size_t i, size_t L) {
  return i < L ? fmt::format("blocks.{}.x", i) : std::string("final.x");
}

// Per-row losses to the host, started where the head writes them and finished when the step's
// work is all enqueued: a download right after the head would stall the device until the host
// had enqueued the backward's first ops. A dry run has none to read (and at 64M tokens they are
// not free).
void start_reading_losses(Backend& be, const Tensor& losses, const Batch& batch, StepLoss& result) {
  result.counted = batch.trained_targets >= 0 ? batch.trained_targets : losses.numel();
  if (!be.computes()) return;
  result.row_losses.resize(static_cast<size_t>(losses.numel()));
  be.download_async(result.row_losses.data(), losses);
}

// Drops the losses' download if the step unwinds before finish_reading_losses: its destination
// dies with the step.
class LossDownload {
 public:
  explicit LossDownload(Backend& be) : be_(be) {}
  LossDownload(const LossDownload&) = delete;
  LossDownload& operator=(const LossDownload&) = delete;
  ~LossDownload() {
    if (std::uncaught_exceptions() > exceptions_) be_.discard_downloads();
  }

 private:
  Backend& be_;
  int exceptions_ = std::uncaught_exceptions();
};

// Waits for the device, then the mean over the trained targets (untrained rows' losses are 0; no
// trained target at all: 0).
void finish_reading_losses(Backend& be, StepLoss& result) {
  if (!be.computes()) return;
  be.synchronize();
  double sum = 0;
  for (float v : result.row_losses) sum += v;
  result.mean = result.counted > 0 ? sum / static_cast<double>(result.counted) : 0.0;
}

// The checkpoints of an offloading plan on their way between the device and the host pool (the
// rule is in engine/remat/executor.h). Each checkpoint is in exactly one place at a time as far as
// the pools are concerned, except while a copy is in flight: then both copies are live.
class CheckpointOffload {
 public:
  CheckpointOffload(Backend& be, const RematPlan& plan, std::vector<ActStore>& stores)
      : be_(be), plan_(plan), stores_(stores), host_(stores.size()) {}
  CheckpointOffload(const CheckpointOffload&) = delete;
  CheckpointOffload& operator=(const CheckpointOffload&) = delete;
  // An error mid-step unwinds through here before the stores free their buffers: every copy in
  // flight is ordered before those frees.
  ~CheckpointOffload() {
    for (Pending* p : {&retiring_, &to_host_, &to_device_}) try {
        if (p->ticket.id) be_.wait_copy(p->ticket);
      } catch (...) {  // the error already unwinding is the one to report
      }
  }

  /// After block i's forward (its store trimmed to the plan): starts copying its checkpoint out,
  /// then retires the previous block's copy, whose transfer overlapped this block's forward.
  void after_forward(size_t i) {
    retiring_ = std::exchange(to_host_, Pending{});  // a member, so an error here still waits
    if (offloaded(i)) {
      const Tensor& dev = stores_[i].get(0);
      host_[i] = be_.host_pool().allocate(dev.shape, dev.dtype, MemCategory::Checkpoints,
                                          fmt::format("blocks.{}.x", i));
      to_host_ = {i, be_.copy_to_host(host_[i], dev)};
    }
    retire_to_host(std::exchange(retiring_, Pending{}));
  }
  /// After the forward pass: the last copy out is retired.
  void finish_forward() { retire_to_host(std::exchange(to_host_, Pending{})); }

  /// Before segment `s` (an index into plan.segments) runs backward: its checkpoint is on the
  /// device, brought back now unless it was prefetched.
  void before_segment(size_t s) {
    const size_t b = plan_.segments[s].begin;
    if (!offloaded(b)) return;
    if (to_device_.ticket.id == 0) start_fetch(b);
    REMAT_ASSERT(to_device_.block == b, "offload: block {} prefetched, block {} needed",
                 to_device_.block, b);
    be_.wait_copy(to_device_.ticket);
    to_device_ = {};
    host_[b].reset();
  }
  /// Starts bringing back the checkpoint of segment s - 1, the next one needed: called once the
  /// first block of segment s to run backward is past its peak, so the copy overlaps the rest of
  /// this segment's backward without adding to the peak.
  void prefetch_before(size_t s) {
    if (s > 0 && offloaded(plan_.segments[s - 1].begin)) start_fetch(plan_.segments[s - 1].begin);
  }

 private:
  struct Pending {
    size_t block = 0;
    CopyTicket ticket;
  };
  // The last segment's checkpoint stays: its backward comes first, right after the loss.
  bool offloaded(size_t i) const {
    return plan_.offload_checkpoints && i < plan_.blocks.size() && plan_.blocks[i].checkpointed &&
           plan_.blocks[i].keep[0] && i != plan_.segments.back().begin;
  }
  void retire_to_host(const Pending& p) {
    if (p.ticket.id == 0) return;
    be_.wait_copy(p.ticket);
    stores_[p.block].release(0);
  }
  void start_fetch(size_t i) {
    const Tensor& host = host_[i];
    stores_[i].put(0, be_.pool().allocate(host.shape, host.dtype, MemCategory::Checkpoints,
                                          input_name(i, plan_.blocks.size())));
    to_device_ = {i, be_.copy_to_device(stores_[i].get(0), host)};
  }

  Backend& be_;
  const RematPlan& plan_;
  std::vector<ActStore>& stores_;
  std::vector<Buffer> host_;  // per block: its checkpoint while it is in the host pool
  Pending retiring_, to_host_, to_device_;
};

// The executor's side of WeightStream: a no-op when the model's parameters live on the device.
// Each call names the use it expects, so the executor and step_uses() cannot drift apart.
class ParamUses {
 public:
  // `uses` is called only when there is a stream to make: listing them costs O(blocks x params).
  template <class Uses>
  ParamUses(Backend& be, Model& model, Uses&& uses, bool keep_grads, const ParamReady& ready = {}) {
    // Every trainable parameter lives in one place; frozen ones stay on the device.
    size_t trainable = 0;
    bool on_host = false;
    for (const Param& p : model.params())
      if (p.trainable()) {
        on_host = on_host || p.on_host;
        ++trainable;
      }
    if (!on_host) return;
    stream_.emplace(be, uses(), keep_grads, ready);
    // A parameter in no use would keep a stale gradient and skip the wait for its update.
    REMAT_ASSERT(stream_->params() == trainable,
                 "weight stream: {} of the model's {} trainable parameters are in a use",
                 stream_->params(), trainable);
  }
  void begin() {
    if (stream_) stream_->begin(next_);
  }
  void end() {
    if (stream_) stream_->end(next_++);
  }
  void finish() {
    if (stream_) stream_->finish();
  }

 private:
  std::optional<WeightStream> stream_;
  size_t next_ = 0;
};

// The loss head on the last block's output x, shared by the training step and the evaluation:
// d(loss)/dx and the per-row losses, both transient, dx allocated first and freed last (the
// pool's peak, which the planner must reproduce to the byte, depends on that order); with
// `predictions` (eval --passkey) each row's argmax too, allocated last.
struct LossHead {
  Buffer dx, losses, argmax;
};
LossHead run_loss_head(Backend& be, Model& model, ParamUses& params, const Buffer& x,
                       const Batch& batch, const std::vector<int64_t>& shape,
                       const char* pool_phase, bool predictions = false) {
  MemoryPool& pool = be.pool();
  be.set_phase(Phase::Loss);
  pool.set_phase(pool_phase);
  LossHead head;
  head.dx = pool.allocate(shape, be.act_dtype(), MemCategory::Transient, "dresid");
  head.losses = pool.allocate({model.loss_rows()}, DType::F32, MemCategory::Transient, "losses");
  if (predictions)
    head.argmax =
        pool.allocate({model.loss_rows()}, DType::I32, MemCategory::Transient, "predictions");
  params.begin();
  model.head_forward_backward(be, x, batch, head.losses, head.dx, head.argmax.tensor());
  params.end();
  return head;
}

}  // namespace

StepLoss forward_backward(Backend& be, Model& model, const RematPlan& plan, const Batch& batch,
                          const BlockGradsReady& grads_ready, const ParamReady& param_ready) {
  const size_t L = model.n_blocks();
  REMAT_ASSERT(plan.blocks.size() == L, "plan has {} blocks, model {}", plan.blocks.size(), L);
  MemoryPool& pool = be.pool();
  const std::vector<int64_t> shape = model.stream_shape();

  std::vector<ActStore> stores;
  stores.reserve(L);
  for (size_t i = 0; i < L; ++i)
    stores.emplace_back(fmt::format("blocks.{}", i), model.block(i).act_names().size(),
                        slot_categories(plan.blocks[i]));
  CheckpointOffload offload(be, plan, stores);  // declared after stores: destroyed before them
  ParamUses params(
      be, model, [&] { return step_uses(model, plan); }, true, param_ready);

  // ---- forward ----
  be.set_phase(Phase::Forward);
  pool.set_phase("forward (embedding)");
  params.begin();
  Buffer x = model.stem_forward(be, batch, input_category(plan, 0));
  params.end();
  for (size_t i = 0; i < L; ++i) {
    pool.set_phase(fmt::format("forward block {}", i));
    stores[i].put(0, std::move(x));
    Buffer y =
        pool.allocate(shape, be.act_dtype(), input_category(plan, i + 1), input_name(i + 1, L));
    params.begin();
    model.block(i).forward(be, stores[i], y);
    params.end();
    stores[i].keep_only(plan.blocks[i].keep);
    offload.after_forward(i);
    x = std::move(y);
  }
  offload.finish_forward();

  // ---- loss head: loss and dL/dx in one pass ----
  auto [dresid, losses, no_argmax] = run_loss_head(be, model, params, x, batch, shape, "loss");
  x.reset();
  StepLoss result;
  const LossDownload unwinding_drops_it(be);
  start_reading_losses(be, losses, batch, result);
  losses.reset();

  // ---- backward, segment by segment ----
  for (auto seg = plan.segments.rbegin(); seg != plan.segments.rend(); ++seg) {
    const auto s = static_cast<size_t>(plan.segments.rend() - seg - 1);
    pool.set_phase(fmt::format("backward block {}", seg->end - 1));
    offload.before_segment(s);
    stores[seg->end - 1].on_peak_passed([&offload, s] { offload.prefetch_before(s); });
    for (size_t j = seg->begin; j < seg->end; ++j) {
      REMAT_ASSERT(stores[j].complete() != block_recomputes(plan, j),
                   "block {}: recomputed {}, planned {}", j, !stores[j].complete(),
                   block_recomputes(plan, j));
      if (stores[j].complete()) continue;
      be.set_phase(Phase::Recompute);
      pool.set_phase(fmt::format("recompute block {}", j));
      Buffer y;
      if (j + 1 < seg->end && !stores[j + 1].has(0))
        y = pool.allocate(shape, be.act_dtype(), MemCategory::Activations, input_name(j + 1, L));
      params.begin();
      model.block(j).forward(be, stores[j], y);
      params.end();
      if (!y.empty()) stores[j + 1].put(0, std::move(y));
    }
    for (size_t j = seg->end; j-- > seg->begin;) {
      be.set_phase(Phase::Backward);
      pool.set_phase(fmt::format("backward block {}", j));
      params.begin();
      model.block(j).backward(be, stores[j], dresid);
      params.end();
      stores[j].peak_passed();
      stores[j].clear();
      if (grads_ready) grads_ready(j);
    }
  }
  be.set_phase(Phase::Backward);
  pool.set_phase("backward (embedding)");
  params.begin();
  model.stem_backward(be, batch, dresid);
  params.end();
  params.finish();
  finish_reading_losses(be, result);
  return result;
}

StepLoss forward_loss(Backend& be, Model& model, const Batch& batch, bool predictions) {
  const size_t L = model.n_blocks();
  MemoryPool& pool = be.pool();
  const std::vector<int64_t> shape = model.stream_shape();
  be.set_phase(Phase::Forward);
  pool.set_phase("eval forward");
  ParamUses params(
      be, model, [&] { return eval_uses(model); }, false);
  params.begin();
  Buffer x = model.stem_forward(be, batch, MemCategory::Activations);
  params.end();
  for (size_t i = 0; i < L; ++i) {
    const Block& block = model.block(i);
    ActStore store(fmt::format("blocks.{}", i), block.act_names().size(),
                   std::vector<MemCategory>(block.act_names().size(), MemCategory::Activations));
    store.put(0, std::move(x));
    Buffer y = pool.allocate(shape, be.act_dtype(), MemCategory::Activations, input_name(i + 1, L));
    params.begin();
    model.block(i).forward(be, store, y);
    params.end();
    store.clear();
    x = std::move(y);
  }
  LossHead head = run_loss_head(be, model, params, x, batch, shape, "eval loss", predictions);
  params.finish();
  StepLoss result;
  start_reading_losses(be, head.losses, batch, result);
  if (predictions && be.computes()) {
    result.predictions.resize(static_cast<size_t>(model.loss_rows()));
    be.download_async(result.predictions.data(), head.argmax);
  }
  finish_reading_losses(be, result);  // waits for both downloads
  return result;
}

}  // namespace remat
