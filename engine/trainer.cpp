// The training step (see engine/trainer.h).
#include "engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <tuple>
#include <utility>

#include "engine/error.h"

namespace remat {

double learning_rate(const TrainConfig& t, int64_t s) {
  if (s < t.warmup_steps)
    return t.lr * static_cast<double>(s + 1) / static_cast<double>(t.warmup_steps);
  const int64_t decay_steps = t.steps - t.warmup_steps;
  if (decay_steps <= 1) return t.lr;
  const double progress =
      static_cast<double>(s - t.warmup_steps) / static_cast<double>(decay_steps - 1);
  const double min_lr = t.lr * t.min_lr_ratio;
  return min_lr + 0.5 * (t.lr - min_lr) * (1.0 + std::cos(3.141592653589793 * progress));
}

Trainer::Trainer(TrainConfig train, RematPlan plan, Backend& be, Model& model, DataSource& data)
    : train_(std::move(train)), be_(be), model_(model), data_(data), plan_(std::move(plan)) {}

std::string Trainer::divergence_message(const StepMetrics& m) {
  std::string first = "none (the loss itself)";
  for (Param& p : model_.params()) {
    const Tensor g = p.grad;
    if (!std::isfinite(be_.sum_squares(std::span<const Tensor>(&g, 1)))) {
      first = p.name;
      break;
    }
  }
  return fmt::format(
      "[train] diverged at step {}: loss {}, gradient norm {}; first non-finite gradient: {}. "
      "Training stopped before the update; no checkpoint was written for this step. Fix: lower "
      "train.lr, raise train.warmup_steps or set train.grad_clip (e.g. 1.0), then resume from the "
      "last checkpoint",
      m.step, m.loss, m.grad_norm, first);
}

void Trainer::check_weights_finite() {
  for (Param& p : model_.params()) {
    const Tensor w = p.value;
    if (!std::isfinite(be_.sum_squares(std::span<const Tensor>(&w, 1))))
      throw Diverged(fmt::format(
          "[train] diverged by step {}: the weights are not finite (first: {}); no checkpoint was "
          "written for this step. Fix: lower train.lr, raise train.warmup_steps or set "
          "train.grad_clip (e.g. 1.0), then resume from the last checkpoint",
          step_, p.name));
  }
}

StepMetrics Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  MemoryPool& pool = be_.pool();
  StepMetrics m;
  m.step = step_ + 1;
  m.lr = learning_rate(train_, step_);

  pool.set_phase("data");
  Batch batch = data_.next(be_, step_);
  const int64_t n_tokens = batch.n_tokens;
  be_.set_phase(Phase::Backward);
  for (Param& p : model_.params()) be_.fill(p.grad, 0.0f);
  model_.begin_step(step_);
  StepLoss loss = forward_backward(be_, model_, plan_, batch);
  batch = Batch();
  m.loss = loss.mean;
  m.task_metric = data_.task_metric(loss.row_losses);

  // Global-norm clipping folds into AdamW as a gradient scale.
  be_.set_phase(Phase::Optimizer);
  pool.set_phase("optimizer step");
  std::vector<Tensor> grads;
  grads.reserve(model_.params().size());
  for (Param& p : model_.params()) grads.push_back(p.grad);
  m.grad_norm = std::sqrt(be_.sum_squares(grads));
  // Before AdamW: an update with a NaN or infinite gradient would poison every weight, and all
  // later steps would report "loss nan" while burning compute.
  if (!std::isfinite(m.loss) || !std::isfinite(m.grad_norm)) throw Diverged(divergence_message(m));
  float grad_scale = 1.0f;
  if (train_.grad_clip > 0 && m.grad_norm > train_.grad_clip)
    grad_scale = static_cast<float>(train_.grad_clip / m.grad_norm);
  update_weights(static_cast<float>(m.lr), grad_scale);
  ++step_;
  be_.synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  m.step_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  m.tokens_per_s = static_cast<double>(n_tokens) * 1000.0 / std::max(m.step_ms, 1e-9);
  m.peak_bytes = pool.peak_bytes();
  return m;
}

// AdamW on every parameter. Moments in the host pool (remat.offload = "checkpoints+optimizer")
// pass through the device: a parameter's m and v come in while the previous parameter updates and
// go back while the next one does, so at most three parameters' moments are on the device at a
// time -- a fixed rule, which the planner's dry run follows to the byte.
void Trainer::update_weights(float lr, float grad_scale) {
  // A parameter's moments on the device, with the copies in flight. An error unwinding through
  // here orders those copies before the buffers are freed.
  struct Staged {
    Backend* be = nullptr;
    Buffer m{}, v{};
    CopyTicket m_copy{}, v_copy{};
    Staged() = default;
    Staged(Staged&& o) noexcept
        : be(std::exchange(o.be, nullptr)),
          m(std::move(o.m)),
          v(std::move(o.v)),
          m_copy(std::exchange(o.m_copy, CopyTicket{})),
          v_copy(std::exchange(o.v_copy, CopyTicket{})) {}
    Staged& operator=(Staged&&) = delete;
    void wait() {
      for (CopyTicket* t : {&m_copy, &v_copy})
        if (t->id) be->wait_copy(std::exchange(*t, CopyTicket{}));
    }
    ~Staged() {
      try {
        if (be) wait();
      } catch (...) {  // the error already unwinding is the one to report
      }
    }
  };
  auto stage_in = [&](Param& p) {
    Staged s;
    s.be = &be_;
    for (auto [dev, host, ticket] :
         {std::tuple{&s.m, &p.m, &s.m_copy}, std::tuple{&s.v, &p.v, &s.v_copy}}) {
      const Tensor& h = *host;
      *dev = be_.pool().allocate(h.dims(), DType::F32, MemCategory::Optimizer,
                                 p.name + (dev == &s.m ? ".adam_m" : ".adam_v") + " (staged)");
      *ticket = be_.copy_to_device(*dev, h);
    }
    return s;
  };
  std::vector<Param*> on_host;
  for (Param& p : model_.params())
    if (p.moments_on_host) on_host.push_back(&p);
  std::optional<Staged> going_out, current, next;
  size_t host_index = 0;
  for (Param& p : model_.params()) {
    AdamWArgs a{p.value, p.grad, p.m, p.v};
    if (p.moments_on_host) {
      if (next)
        current.emplace(std::move(*next));
      else
        current.emplace(stage_in(p));
      next.reset();
      if (++host_index < on_host.size()) next.emplace(stage_in(*on_host[host_index]));
      current->wait();
      a.m = current->m;
      a.v = current->v;
    }
    a.lr = lr;
    a.weight_decay = p.use_decay ? static_cast<float>(train_.weight_decay) : 0.0f;
    a.grad_scale = grad_scale;
    a.step = step_ + 1;
    be_.adamw_update(a);
    if (!p.moments_on_host) continue;
    current->m_copy = be_.copy_to_host(p.m, current->m);
    current->v_copy = be_.copy_to_host(p.v, current->v);
    if (going_out) going_out->wait();
    going_out.emplace(std::move(*current));
    current.reset();
  }
  if (going_out) going_out->wait();
}

double Trainer::evaluate(int64_t eval_tokens) {
  const int64_t n = data_.validation_batches(eval_tokens);
  if (n == 0) return std::nan("");
  struct TrainingAgain {  // dropout back on, also when a batch throws
    Model& m;
    ~TrainingAgain() { m.set_training(true); }
  } restore{model_};
  model_.set_training(false);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    be_.pool().set_phase("eval data");
    Batch batch = data_.validation_batch(be_, i);
    sum += forward_loss(be_, model_, batch).mean;
  }
  return sum / static_cast<double>(n);
}

}  // namespace remat
