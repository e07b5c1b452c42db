// Weights and gradients fetched per use (see engine/remat/weight_stream.h).
#include "engine/remat/weight_stream.h"

#include <algorithm>
#include <utility>

#include "engine/core/error.h"

namespace remat {

bool block_recomputes(const RematPlan& plan, size_t j) {
  const std::vector<bool>& keep = plan.blocks[j].keep;
  return !std::all_of(keep.begin() + 1, keep.end(), [](bool k) { return k; });
}

namespace {
// A frozen parameter stays on the device (engine/model.h): it is in no use.
std::vector<Param*> trainable(const std::vector<Param*>& params) {
  std::vector<Param*> out;
  for (Param* p : params)
    if (p->trainable()) out.push_back(p);
  return out;
}
}  // namespace

std::vector<ParamUse> eval_uses(Model& model) {
  std::vector<ParamUse> uses;
  uses.push_back({trainable(model.stem_params()), true, false});
  for (size_t i = 0; i < model.n_blocks(); ++i)
    uses.push_back({trainable(model.block_params(i)), true, false});
  uses.push_back({trainable(model.head_params()), true, true});
  return uses;
}

std::vector<ParamUse> step_uses(Model& model, const RematPlan& plan) {
  std::vector<ParamUse> uses = eval_uses(model);
  for (auto seg = plan.segments.rbegin(); seg != plan.segments.rend(); ++seg) {
    for (size_t j = seg->begin; j < seg->end; ++j)
      if (block_recomputes(plan, j))
        uses.push_back({trainable(model.block_params(j)), true, false});
    for (size_t j = seg->end; j-- > seg->begin;)
      uses.push_back({trainable(model.block_params(j)), true, true});
  }
  uses.push_back({trainable(model.stem_params()), false, true});
  return uses;
}

namespace {
bool contains(const std::vector<Param*>& v, const Param* p) {
  return std::find(v.begin(), v.end(), p) != v.end();
}
}  // namespace

WeightStream::WeightStream(Backend& be, std::vector<ParamUse> uses, bool keep_grads,
                           std::function<void(const Param&)> ready)
    : be_(be), uses_(std::move(uses)), keep_grads_(keep_grads), ready_(std::move(ready)) {
  for (size_t k = 0; k < uses_.size(); ++k)
    for (Param* p : uses_[k].params) {
      REMAT_ASSERT(p->on_host, "weight stream: {} is not a host parameter", p->name);
      State& s = states_[p];
      if (uses_[k].grads) s.last_grad_use = k;
    }
}

WeightStream::~WeightStream() {
  // The copies first (their sources and destinations are about to be freed or handed back).
  for (auto& [p, s] : states_)
    for (CopyTicket* t : {&s.fetch, &s.grad_out}) try {
        if (t->id) be_.wait_copy(std::exchange(*t, CopyTicket{}));
      } catch (...) {  // the error already unwinding is the one to report
      }
  for (auto& [p, s] : states_) restore(p);
}

void WeightStream::restore(Param* p) noexcept {
  State& s = states_.at(p);
  if (!s.host_value.empty()) p->value = std::move(s.host_value);
  if (!s.host_grad.empty()) p->grad = std::move(s.host_grad);
}

// The device copy is allocated before the swap, so an out-of-memory leaves the Param as it was.
void WeightStream::fetch(Param* p) {
  State& s = state(p);
  if (ready_) ready_(*p);  // the previous step's AdamW is done with it
  const Tensor& host = p->value;
  Buffer dev = be_.pool().allocate(host.shape, DType::F32, MemCategory::Weights, p->name);
  s.fetch = be_.copy_to_device(dev, host);
  s.host_value = std::exchange(p->value, std::move(dev));
  on_device_.push_back(p);
}

void WeightStream::wait_fetch(Param* p) {
  State& s = state(p);
  if (s.fetch.id) be_.wait_copy(std::exchange(s.fetch, CopyTicket{}));
}

void WeightStream::drop_value(Param* p) {
  wait_fetch(p);  // a prefetch the executor did not use (an error): never free under a copy
  State& s = state(p);
  p->value = std::move(s.host_value);  // frees the device copy
  on_device_.erase(std::find(on_device_.begin(), on_device_.end(), p));
}

void WeightStream::make_grad(Param* p) {
  State& s = state(p);
  Buffer dev = be_.pool().allocate(p->grad.tensor().shape, DType::F32, MemCategory::Grads,
                                   p->name + ".grad");
  be_.fill(dev, 0.0f);
  s.host_grad = std::exchange(p->grad, std::move(dev));
}

void WeightStream::begin(size_t k) {
  REMAT_ASSERT(k == next_ && k < uses_.size(), "weight stream: use {} begun, {} expected", k,
               next_);
  ++next_;
  const ParamUse& use = uses_[k];
  if (use.values)
    for (Param* p : use.params) {
      if (!contains(on_device_, p)) fetch(p);  // not prefetched: the step's first use
      wait_fetch(p);
    }
  // What the previous use read and this one does not goes, before the next use's weights come.
  for (Param* p : std::vector<Param*>(on_device_))
    if (!use.values || !contains(use.params, p)) drop_value(p);
  if (k + 1 < uses_.size() && uses_[k + 1].values)
    for (Param* p : uses_[k + 1].params)
      if (!contains(on_device_, p)) fetch(p);
  if (use.grads)
    for (Param* p : use.params)
      if (state(p).host_grad.empty()) make_grad(p);
}

void WeightStream::retire_grads() {
  for (Param* p : std::exchange(going_out_, {})) {
    State& s = state(p);
    be_.wait_copy(std::exchange(s.grad_out, CopyTicket{}));
    p->grad = std::move(s.host_grad);  // frees the device copy
  }
}

void WeightStream::end(size_t k) {
  REMAT_ASSERT(k + 1 == next_, "weight stream: use {} ended, {} running", k, next_ - 1);
  retire_grads();  // started at the previous end(): they overlapped this use
  if (!uses_[k].grads) return;
  for (Param* p : uses_[k].params) {
    State& s = state(p);
    if (s.last_grad_use != k || s.host_grad.empty()) continue;
    if (keep_grads_) {
      s.grad_out = be_.copy_to_host(s.host_grad, p->grad);
      going_out_.push_back(p);
    } else {
      p->grad = std::move(s.host_grad);
    }
  }
}

void WeightStream::finish() {
  REMAT_ASSERT(next_ == uses_.size(), "weight stream: finished after {} of {} uses", next_,
               uses_.size());
  retire_grads();
  for (Param* p : std::vector<Param*>(on_device_)) drop_value(p);
}

}  // namespace remat
