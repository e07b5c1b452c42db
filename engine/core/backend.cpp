// The backend's public ops: shape checks at the op boundary (REMAT_ASSERT, on in release) and
// FLOP / byte counting, then the implementation's *_impl. The counts are the same formulas on
// every backend, so the planner's FLOPs equal a real run's.
#include "engine/core/backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iterator>
#include <utility>
#include <vector>

#include "engine/core/cpu_workspace.h"
#include "engine/core/cuda_workspace.h"
#include "engine/core/nf4.h"

namespace remat {
namespace {

// The op's workspace on the backend whose rules apply (engine/core/workspace.h).
template <class Args>
WorkspaceList workspace_for(const WorkspaceTarget& t, const Args& a) {
  return t.device == DeviceKind::Cpu ? cpu::workspace(a, t) : cuda::workspace(a, t);
}

}  // namespace

const char* phase_name(Phase p) {
  static constexpr const char* kNames[] = {"forward", "recompute", "backward", "loss", "optimizer"};
  static_assert(std::size(kNames) == kNumPhases);
  const auto i = static_cast<size_t>(p);
  return i < std::size(kNames) ? kNames[i] : "?";
}

double model_flops(const std::array<OpCost, kNumPhases>& cost_by_phase) {
  return 3 * cost_by_phase[static_cast<size_t>(Phase::Forward)].flops +
         cost_by_phase[static_cast<size_t>(Phase::Loss)].flops -
         cost_by_phase[static_cast<size_t>(Phase::Backward)].skipped_flops;
}

double model_flops(const Backend& be) {
  std::array<OpCost, kNumPhases> by_phase{};
  for (int p = 0; p < kNumPhases; ++p)
    by_phase[static_cast<size_t>(p)] = be.cost(static_cast<Phase>(p));
  return model_flops(by_phase);
}

// Every op the same way: shapes, cost, then the kernel (with its workspace, when its
// implementation takes one: the rule of the backend whose rules apply).
template <class Args>
void Backend::run_op(const char* op, const Args& a, void (Backend::*impl)(const Args&)) {
  check(a);
  const OpCost c = remat::cost(a);
  count(c);
  timed(op, c, [&] { (this->*impl)(a); });
}

template <class Args>
void Backend::run_op(const char* op, const Args& a,
                     void (Backend::*impl)(const Args&, const OpWorkspace&)) {
  check(a);
  const OpCost c = remat::cost(a);
  count(c);
  const OpWorkspace ws(pool(), workspace_for(workspace_target(), a));
  timed(op, c, [&] { (this->*impl)(a, ws); });
}

template <class Run>
void Backend::timed(const char* op, const OpCost& c, Run&& run) {
  timed(op, std::span<const OpCost>(&c, 1), std::forward<Run>(run));
}

template <class Run>
void Backend::timed(const char* op, std::span<const OpCost> costs, Run&& run) {
  if (!op_timing_) {
    run();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  run();
  synchronize();  // an asynchronous backend's op ends when its kernels do
  OpTime& t = op_times_[{op, phase_}];
  t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const OpCost& c : costs) t.flops += c.flops;
  t.calls += static_cast<int64_t>(costs.size());
}

Backend::Backend(std::unique_ptr<MemoryPool> pool, std::unique_ptr<MemoryPool> host_pool)
    : pool_(std::move(pool)), host_pool_(std::move(host_pool)) {}

CopyTicket Backend::start_copy(const Tensor& dst, const Tensor& src, bool to_host) {
  REMAT_ASSERT(dst.bytes() == src.bytes(), "copy_to_{}: {} bytes into {}",
               to_host ? "host" : "device", src.bytes(), dst.bytes());
  // A copy has a ticket to wait on and a destination to fill: not something to replay.
  REMAT_ASSERT(!tile_counts_, "copy_to_{} inside a replayed tile", to_host ? "host" : "device");
  const double bytes = static_cast<double>(src.bytes());
  add_cost(to_host ? OpCost{.to_host_bytes = bytes} : OpCost{.to_device_bytes = bytes});
  const CopyTicket t{next_ticket_++};
  pending_copies_.insert(t.id);
  if (to_host)
    copy_to_host_impl(dst, src, t);
  else
    copy_to_device_impl(dst, src, t);
  return t;
}

CopyTicket Backend::copy_to_host(const Tensor& dst, const Tensor& src) {
  return start_copy(dst, src, true);
}

CopyTicket Backend::copy_to_device(const Tensor& dst, const Tensor& src) {
  return start_copy(dst, src, false);
}

void Backend::wait_copy(CopyTicket t) {
  REMAT_ASSERT(pending_copies_.erase(t.id) == 1, "wait_copy: ticket {} is not a pending copy",
               t.id);
  wait_copy_impl(t);
}

void Backend::fill_host(const Tensor& t, float value) {
  REMAT_ASSERT(t.dtype == DType::F32, "fill_host: {} tensor", dtype_name(t.dtype));
  fill_host_impl(t, value);
}

void Backend::copy_to_host_impl(const Tensor& dst, const Tensor& src, CopyTicket) {
  std::memcpy(dst.data, src.data, src.bytes());
}

void Backend::copy_to_device_impl(const Tensor& dst, const Tensor& src, CopyTicket) {
  std::memcpy(dst.data, src.data, src.bytes());
}

void Backend::fill_host_impl(const Tensor& t, float value) {
  std::fill_n(t.f32(), t.numel(), value);
}

void Backend::count(const OpCost& op) {
  add_cost({.flops = op.flops, .bytes = op.bytes, .skipped_flops = op.skipped_flops});
}

// Every field is added, zeros too: x + 0.0 is x, so a replay adds what the ops added, bit for bit.
void Backend::add_cost(const OpCost& op) {
  OpCost& c = cost_[static_cast<size_t>(phase_)];
  c.flops += op.flops;
  c.bytes += op.bytes;
  c.to_host_bytes += op.to_host_bytes;
  c.to_device_bytes += op.to_device_bytes;
  c.ring_bytes += op.ring_bytes;
  c.skipped_flops += op.skipped_flops;
  if (tile_counts_) tile_counts_->emplace_back(phase_, op);
}

Backend::TileReplay::TileReplay(Backend& be)
    : be_(be), phase_(be.phase()), live_before_(live_bytes()) {
  REMAT_ASSERT(!be_.tile_counts_, "row tiles inside row tiles");
  be_.tile_counts_ = &counts_;
}

Backend::TileReplay::LiveBytes Backend::TileReplay::live_bytes() const {
  LiveBytes b{};
  for (int c = 0; c < kNumMemCategories; ++c) {
    b[static_cast<size_t>(c)] = be_.pool().live_bytes(static_cast<MemCategory>(c));
    b[static_cast<size_t>(kNumMemCategories + c)] =
        be_.host_pool().live_bytes(static_cast<MemCategory>(c));
  }
  return b;
}

void Backend::TileReplay::repeat(int64_t times) {
  be_.tile_counts_ = nullptr;
  REMAT_ASSERT(be_.phase() == phase_ && live_bytes() == live_before_,
               "a replayed tile must end in its phase, with the pools as it found them");
  for (int64_t i = 0; i < times; ++i)
    for (const auto& [phase, cost] : counts_) {
      be_.phase_ = phase;
      be_.add_cost(cost);
    }
  be_.phase_ = phase_;
}

void Backend::fill(const Tensor& t, float value) {
  const OpCost c{0, act_bytes(t)};
  count(c);
  timed("fill", c, [&] { fill_impl(t, value); });
}

// Each tensor counted as its own fill, in order: the counters' sums keep their bits.
void Backend::fill_zero(std::span<const Tensor> tensors) {
  if (tensors.empty()) return;
  std::vector<OpCost> costs;
  costs.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    REMAT_ASSERT(t.dtype == DType::F32, "fill_zero: {} tensor", dtype_name(t.dtype));
    costs.push_back({0, act_bytes(t)});
    count(costs.back());
  }
  timed("fill", costs, [&] { fill_zero_impl(tensors); });
}

void Backend::fill_zero_impl(std::span<const Tensor> tensors) {
  for (const Tensor& t : tensors) fill_impl(t, 0.0f);
}

void Backend::copy(const Tensor& dst, const Tensor& src) {
  REMAT_ASSERT(dst.numel() == src.numel(), "copy: {} elements into {}", src.numel(), dst.numel());
  const OpCost c{0, act_bytes(dst) + act_bytes(src)};
  count(c);
  timed("copy", c, [&] { copy_impl(dst, src); });
}

void Backend::linear_forward(const LinearForwardArgs& a) {
  run_op("linear_forward", a, &Backend::linear_forward_impl);
}

void Backend::linear_backward(const LinearBackwardArgs& a) {
  run_op("linear_backward", a, &Backend::linear_backward_impl);
}

void Backend::layernorm_forward(const LayerNormForwardArgs& a) {
  run_op("layernorm_forward", a, &Backend::layernorm_forward_impl);
}

void Backend::layernorm_backward(const LayerNormBackwardArgs& a) {
  run_op("layernorm_backward", a, &Backend::layernorm_backward_impl);
}

void Backend::rmsnorm_forward(const RmsNormForwardArgs& a) {
  run_op("rmsnorm_forward", a, &Backend::rmsnorm_forward_impl);
}

void Backend::rmsnorm_backward(const RmsNormBackwardArgs& a) {
  run_op("rmsnorm_backward", a, &Backend::rmsnorm_backward_impl);
}

void Backend::qk_norm_forward(const QkNormForwardArgs& a) {
  run_op("qk_norm_forward", a, &Backend::qk_norm_forward_impl);
}

void Backend::qk_norm_backward(const QkNormBackwardArgs& a) {
  run_op("qk_norm_backward", a, &Backend::qk_norm_backward_impl);
}

void Backend::attention_forward(const AttentionForwardArgs& a) {
  run_op("attention_forward", a, &Backend::attention_forward_impl);
}

void Backend::attention_backward(const AttentionBackwardArgs& a) {
  run_op("attention_backward", a, &Backend::attention_backward_impl);
}

void Backend::ring_split(const RingSplitArgs& a) {
  run_op("ring_split", a, &Backend::ring_split_impl);
}
void Backend::ring_merge_grad(const RingMergeGradArgs& a) {
  run_op("ring_merge_grad", a, &Backend::ring_merge_grad_impl);
}
void Backend::ring_block_forward(const RingBlockForwardArgs& a) {
  run_op("ring_block_forward", a, &Backend::ring_block_forward_impl);
}
void Backend::ring_finish(const RingFinishArgs& a) {
  run_op("ring_finish", a, &Backend::ring_finish_impl);
}
void Backend::ring_block_backward(const RingBlockBackwardArgs& a) {
  run_op("ring_block_backward", a, &Backend::ring_block_backward_impl);
}

void Backend::attention_delta(const AttentionDeltaArgs& a) {
  run_op("attention_delta", a, &Backend::attention_delta_impl);
}

void Backend::activation_forward(const ActivationForwardArgs& a) {
  run_op("activation_forward", a, &Backend::activation_forward_impl);
}

void Backend::activation_backward(const ActivationBackwardArgs& a) {
  run_op("activation_backward", a, &Backend::activation_backward_impl);
}

void Backend::swiglu_forward(const SwiGluForwardArgs& a) {
  run_op("swiglu_forward", a, &Backend::swiglu_forward_impl);
}

void Backend::swiglu_backward(const SwiGluBackwardArgs& a) {
  run_op("swiglu_backward", a, &Backend::swiglu_backward_impl);
}

void Backend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  REMAT_ASSERT(out.numel() == a.numel() && a.numel() == b.numel(), "add: {} {} {}", out.shape_str(),
               a.shape_str(), b.shape_str());
  const OpCost c{static_cast<double>(out.numel()), act_bytes(out) + act_bytes(a) + act_bytes(b)};
  count(c);
  timed("add", c, [&] { add_impl(out, a, b); });
}

void Backend::embedding_forward(const EmbeddingForwardArgs& a) {
  run_op("embedding_forward", a, &Backend::embedding_forward_impl);
}

void Backend::embedding_backward(const EmbeddingBackwardArgs& a) {
  run_op("embedding_backward", a, &Backend::embedding_backward_impl);
}

void Backend::lm_head_loss(const LmHeadLossArgs& a) {
  run_op("lm_head_loss", a, &Backend::lm_head_loss_impl);
}

void Backend::mse_loss(const MseLossArgs& a) {
  run_op("mse_loss", a, &Backend::mse_loss_impl);
}

void Backend::dropout(const DropoutArgs& a) {
  run_op("dropout", a, &Backend::dropout_impl);
}

double Backend::sum_squares(std::span<const Tensor> tensors) {
  double n = 0;
  for (const Tensor& t : tensors) n += static_cast<double>(t.numel());
  const OpCost c{2 * n, 4 * n};
  count(c);
  double sum = 0;
  timed("sum_squares", c, [&] { sum = sum_squares_impl(tensors); });
  return sum;
}

void Backend::adamw_update(const AdamWArgs& a) {
  run_op("adamw_update", a, &Backend::adamw_update_impl);
}

// Checked and counted update by update, in order, as run_op does for each single call.
void Backend::adamw_update(std::span<const AdamWArgs> all) {
  if (all.empty()) return;
  std::vector<OpCost> costs;
  costs.reserve(all.size());
  for (const AdamWArgs& a : all) {
    check(a);
    costs.push_back(remat::cost(a));
    count(costs.back());
  }
  timed("adamw_update", costs, [&] { adamw_updates_impl(all); });
}

void Backend::adamw_updates_impl(std::span<const AdamWArgs> all) {
  for (const AdamWArgs& a : all) adamw_update_impl(a);
}

int64_t default_loss_chunk_rows(int64_t n_rows, int64_t vocab) {
  const int64_t target_bytes = 32ll << 20;
  int64_t rows = std::max<int64_t>(64, target_bytes / (4 * std::max<int64_t>(vocab, 1)));
  rows = (rows + 63) / 64 * 64;
  return std::min(rows, n_rows);
}

void upload_weight(Backend& be, const Tensor& dst, const float* values) {
  if (dst.dtype == DType::F32) {
    be.upload(dst, values);
    return;
  }
  std::vector<uint8_t> stored(dst.bytes());
  encode_weight(dst.dtype, values, dst.numel(), stored.data());
  be.upload(dst, stored.data());
}

}  // namespace remat
