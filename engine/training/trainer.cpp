// The training step (see engine/training/trainer.h).
#include "engine/training/trainer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "engine/core/error.h"
#include "engine/cpu/host_optimizer.h"
#include "engine/cuda_api.h"
#include "engine/parallel/communicator.h"
#include "engine/parallel/grad_reducer.h"
#include "engine/parallel/sharded_adamw.h"
#include "engine/remat/weight_stream.h"

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

namespace {

// What a dry run of a CUDA target plans for NCCL: in-place all-reduces that take no pool memory
// (NCCL's own buffers are outside it, with the libraries' reserve) and send 2 (N - 1) / N of the
// gradient bytes from each rank.
class PlannedAllReduce final : public parallel::GradientSync {
 public:
  PlannedAllReduce(Model& model, int ranks) {
    uint64_t bytes = 0;
    for (Param& p : model.params())
      if (p.trainable()) bytes += p.grad.tensor().bytes();
    sent_ = parallel::allreduce_sent_bytes(bytes, ranks);
  }
  void block_done(size_t) override {}
  void finish() override {}
  uint64_t sent_bytes_per_step() const override { return sent_; }
  const char* describe() const override { return "all-reduced by NCCL (planned)"; }

 private:
  uint64_t sent_ = 0;
};

// What a dry run of a CUDA target plans for ZeRO-1 over NCCL: the buckets and the one slot of
// NcclShardedSync (engine/cuda/nccl_sync.cpp), nothing exchanged.
class PlannedShardedSync final : public parallel::EqualShardSync {
 public:
  PlannedShardedSync(Backend& be, Model& model, const DataParallel& dp)
      : EqualShardSync(be, model, dp.rank, dp.ranks, dp.bucket_bytes) {}
  void block_done(size_t) override {}
  void finish() override {}
  const char* describe() const override {
    return "reduce-scattered by NCCL, updated weights all-gathered (planned)";
  }
  void start_weight_gather(size_t) override {}
  void finish_weight_gathers() override {}
};

// ZeRO-1's gradient sync: rank-order sums of shards over MPI on the CPU backend (and dry runs of
// CPU targets), NCCL reduce-scatters on CUDA.
std::unique_ptr<parallel::ShardedGradientSync> make_sharded_sync(Backend& be, Model& model,
                                                                 const DataParallel& dp) {
  if (be.workspace_target().device == DeviceKind::Cuda) {
    if (!be.computes()) return std::make_unique<PlannedShardedSync>(be, model, dp);
    REMAT_ASSERT(dp.comm != nullptr, "a sharded optimizer on CUDA without a communicator");
    return cuda::make_nccl_sharded_sync(be, model, *dp.comm, dp.bucket_bytes);
  }
  return std::make_unique<parallel::GradientReducer>(be, model, dp.comm, dp.ranks, dp.rank,
                                                     dp.bucket_bytes, /*shard_only=*/true);
}

// Every gradient in device memory made zero by one batched call: on CUDA a few launches instead
// of one per parameter (147 for GPT-2 124M).
void zero_device_grads(Backend& be, Model& model) {
  std::vector<Tensor> grads;
  grads.reserve(model.params().size());
  for (Param& p : model.params())
    if (p.trainable() && !p.on_host) grads.push_back(p.grad);
  be.fill_zero(grads);
}

}  // namespace

// AdamW of the host parameters on a thread of its own, parameter by parameter in the order the
// next step fetches their weights (the stem, block 0, 1, ..., the head): that step's first
// blocks compute while the later ones update, and WeightStream waits (wait_for) only for a
// parameter it is about to copy. Each update is the same call as the synchronous path's, on the
// same numbers, so the bits do not depend on the thread.
class HostAdamW {
 public:
  ~HostAdamW() { wait_all(); }
  void start(std::vector<std::pair<const Param*, AdamWArgs>> updates) {
    wait_all();
    index_.clear();
    for (size_t i = 0; i < updates.size(); ++i) index_[updates[i].first] = i;
    done_ = 0;
    worker_ = std::thread([this, updates = std::move(updates)] {
      for (size_t i = 0; i < updates.size(); ++i) {
        cpu::host_adamw_update(updates[i].second);
        {
          std::lock_guard<std::mutex> lock(mutex_);
          done_ = i + 1;
        }
        updated_.notify_all();
      }
    });
  }
  void wait_for(const Param& p) {
    const auto it = index_.find(&p);
    if (!worker_.joinable() || it == index_.end()) return;
    std::unique_lock<std::mutex> lock(mutex_);
    updated_.wait(lock, [&] { return done_ > it->second; });
  }
  void wait_all() {
    if (worker_.joinable()) worker_.join();
  }

 private:
  std::thread worker_;
  std::unordered_map<const Param*, size_t> index_;
  std::mutex mutex_;
  std::condition_variable updated_;
  size_t done_ = 0;  // updates finished, in order
};

std::unique_ptr<parallel::GradientSync> make_gradient_sync(Backend& be, Model& model,
                                                           const DataParallel& dp) {
  if (dp.ranks <= 1) return nullptr;
  if (be.workspace_target().device == DeviceKind::Cuda) {
    if (!be.computes()) return std::make_unique<PlannedAllReduce>(model, dp.ranks);
    REMAT_ASSERT(dp.comm != nullptr, "data parallel on CUDA without a communicator");
    return cuda::make_nccl_sync(be, model, *dp.comm);
  }
  return std::make_unique<parallel::GradientReducer>(be, model, dp.comm, dp.ranks, dp.rank,
                                                     dp.bucket_bytes);
}

DataParallel data_parallel(const Config& cfg, parallel::Communicator* comm) {
  DataParallel dp;
  dp.ranks = static_cast<int>(cfg.parallel.world_ranks());
  dp.rank = comm ? comm->rank() : cfg.parallel.rank;
  dp.bucket_bytes = cfg.parallel.bucket_bytes;
  dp.shard_optimizer = cfg.parallel.shards_optimizer();
  dp.comm = comm;
  return dp;
}

Trainer::Trainer(TrainConfig train, RematPlan plan, Backend& be, Model& model, DataSource& data,
                 DataParallel dp)
    : train_(std::move(train)),
      be_(be),
      model_(model),
      data_(data),
      plan_(std::move(plan)),
      dp_(dp),
      host_update_(std::make_unique<HostAdamW>()),
      host_update_async_(!be.device_is_host() && be.computes()) {
  // The weight stream copies each micro-batch's gradients OVER the host ones (config validation
  // refuses train.grad_accum with weights offloaded).
  for (const Param& p : model.params())
    REMAT_ASSERT(train_.grad_accum == 1 || !p.on_host,
                 "train.grad_accum = {} with {} in host memory", train_.grad_accum, p.name);
  REMAT_ASSERT(train_.grad_accum >= 1, "train.grad_accum = {}", train_.grad_accum);
  if (!dp_.shard_optimizer) {
    grad_sync_ = make_gradient_sync(be, model, dp_);
    return;
  }
  std::unique_ptr<parallel::ShardedGradientSync> sync = make_sharded_sync(be, model, dp_);
  sharded_ = std::make_unique<parallel::ShardedAdamW>(be, *sync, dp_.comm);
  grad_sync_ = std::move(sync);
}

Trainer::~Trainer() = default;

void Trainer::wait_host_update() {
  host_update_->wait_all();
}

DistributedMoments* Trainer::sharded_moments() const {
  return sharded_.get();
}

std::string Trainer::gradient_sync() const {
  return grad_sync_ ? grad_sync_->describe() : "";
}

uint64_t Trainer::sent_bytes_per_step() const {
  return grad_sync_ ? grad_sync_->sent_bytes_per_step() : 0;
}

std::vector<double> Trainer::mean_over_ranks(const std::vector<double>& means,
                                             const std::vector<double>& weights) {
  if (!dp_.comm || dp_.ranks == 1) return means;
  std::vector<double> parts;
  for (size_t i = 0; i < means.size(); ++i) {
    parts.push_back(means[i] * weights[i]);
    parts.push_back(weights[i]);
  }
  const std::vector<double> sum = parallel::sum_over_ranks(*dp_.comm, parts);
  std::vector<double> out(means.size(), 0.0);
  for (size_t i = 0; i < means.size(); ++i)
    if (sum[2 * i + 1] > 0) out[i] = sum[2 * i] / sum[2 * i + 1];
  return out;
}

std::string Trainer::divergence_message(const StepMetrics& m) {
  // Sharded, each rank holds the sums of its shards only: the ranks agree on the first parameter
  // with a non-finite sum anywhere (every rank diverges at the same step, so all of them call).
  std::vector<double> bad;
  std::vector<const Param*> trained;
  for (Param& p : model_.params()) {
    if (!p.trainable()) continue;  // a frozen parameter has no gradient
    const bool finite =
        sharded_ ? sharded_->grad_finite(p) : std::isfinite(sum_squares({p.grad.tensor()}, p));
    bad.push_back(finite ? 0.0 : 1.0);
    trained.push_back(&p);
  }
  if (sharded_ && dp_.comm) bad = parallel::sum_over_ranks(*dp_.comm, bad);
  std::string first = "none (the loss itself)";
  for (size_t i = 0; i < bad.size(); ++i)
    if (bad[i] > 0) {
      first = trained[i]->name;
      break;
    }
  return fmt::format(
      "[train] diverged at step {}: loss {}, gradient norm {}; first non-finite gradient: {}. "
      "Training stopped before the update; no checkpoint was written for this step. Fix: lower "
      "train.lr, raise train.warmup_steps or set train.grad_clip (e.g. 1.0), then resume from the "
      "last checkpoint",
      m.step, m.loss, m.grad_norm, first);
}

void Trainer::check_weights_finite() {
  wait_host_update();
  for (Param& p : model_.params()) {
    if (!p.trainable()) continue;  // never updated: as finite as it was loaded
    if (!std::isfinite(sum_squares({p.value.tensor()}, p)))
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
  const MicroBatchLoss loss = accumulate_gradients(m);
  // Context ranks hold a token or two more or less than each other: means weigh by tokens. The
  // third is the mean of the ranks' token counts, which times the ranks is the job's tokens.
  const std::vector<double> means =
      mean_over_ranks({loss.mean, loss.task_metric.value_or(0.0), loss.tokens},
                      {loss.rows, static_cast<double>(data_.task_metric_count()), 1.0});
  m.loss = means[0];
  if (loss.task_metric) m.task_metric = means[1];
  const double job_tokens = std::round(means[2] * dp_.ranks);
  m.tokens = static_cast<int64_t>(job_tokens);

  // Global-norm clipping folds into AdamW as a gradient scale.
  be_.set_phase(Phase::Optimizer);
  pool.set_phase("optimizer step");
  m.grad_norm = std::sqrt(grad_sum_squares());
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
  m.tokens_per_s = job_tokens * 1000.0 / std::max(m.step_ms, 1e-9);
  m.peak_bytes = pool.peak_bytes();
  return m;
}

// Gradient accumulation: the step's train.grad_accum micro-batches run one after the other, each
// freeing its batch and activations before the next is drawn, and their gradients add up in the
// grad buffers (the ops' [+=]). Each micro-batch's loss gradient is scaled by 1 / (every target
// of the step), so the sum is the gradient of the step's mean loss: that of one batch of
// grad_accum x batch_size rows, up to the order of the float sums. Micro-batch k of step s is
// batch s * grad_accum + k of the data stream, so the step trains on exactly the rows one batch of
// grad_accum x batch_size would hold, and a resume at step s draws them again. The ranks exchange
// gradients once, during the last micro-batch's backward, when every gradient is complete.
Trainer::MicroBatchLoss Trainer::accumulate_gradients(StepMetrics& m) {
  MemoryPool& pool = be_.pool();
  const int64_t micro = train_.grad_accum;
  // The mean loss's divisor: every target of the optimizer step, over the micro-batches and the
  // ranks. Packed documents with a loss mask would count the step's trained targets here.
  const int64_t step_targets = micro * model_.loss_rows_all_ranks();
  parallel::GradientSync* sync = grad_sync_.get();
  HostAdamW& host_update = *host_update_;
  MicroBatchLoss out;
  double loss_sum = 0, metric_sum = 0;
  for (int64_t k = 0; k < micro; ++k) {
    const auto d0 = std::chrono::steady_clock::now();
    const int64_t index = step_ * micro + k;  // this micro-batch in the data stream
    pool.set_phase("data");
    Batch batch = data_.next(be_, index);
    // A device's upload may still be running: timed ops (bench) must not be charged for it.
    if (be_.op_timing()) be_.synchronize();
    m.data_ms +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - d0).count();
    m.data_flops += batch.making_flops;
    out.tokens += static_cast<double>(batch.n_tokens);
    batch.step_targets = step_targets;
    be_.set_phase(Phase::Backward);
    // Host parameters' gradients are made zero on the device and copied over the host ones.
    if (k == 0) zero_device_grads(be_, model_);
    model_.begin_step(index);
    const bool last = k + 1 == micro;
    StepLoss loss = forward_backward(
        be_, model_, plan_, batch,
        sync && last ? BlockGradsReady([sync](size_t block) { sync->block_done(block); })
                     : BlockGradsReady(),
        [&host_update](const Param& p) { host_update.wait_for(p); });
    wait_host_update();  // every weight was fetched, so every update is done; the thread ends
    batch = Batch();
    loss_sum += loss.mean;
    out.rows += static_cast<double>(loss.row_losses.size());
    if (const std::optional<double> t = data_.task_metric(loss.row_losses)) {
      metric_sum += *t;
      out.task_metric = metric_sum / static_cast<double>(k + 1);
    }
  }
  if (sync) sync->finish();  // every gradient is the sum over the ranks (sharded: this rank's)
  // Micro-batches of equal rows: the step's mean is the mean of theirs.
  out.mean = loss_sum / static_cast<double>(micro);
  return out;
}

double Trainer::grad_sum_squares() {
  if (sharded_) return sharded_->grad_sum_squares();  // each rank holds the sums of its shards
  std::vector<Tensor> grads;
  const Param* like = nullptr;
  for (Param& p : model_.params())
    if (p.trainable()) {
      grads.push_back(p.grad);
      if (!like) like = &p;
    }
  return like ? sum_squares(grads, *like) : 0.0;
}

// Host parameters (remat.offload = "checkpoints+optimizer+weights") are summed on the host's
// cores, by the CPU backend's own code: the same bits as the CPU backend without the offload.
// Every trainable parameter of a model lives in the same place, so `like` stands for all of
// `tensors`.
double Trainer::sum_squares(const std::vector<Tensor>& tensors, const Param& like) {
  if (!like.on_host) return be_.sum_squares(tensors);
  if (!be_.computes()) return 0.0;
  be_.synchronize();  // the gradients' copies to the host are done
  return cpu::host_sum_squares(tensors);
}

// AdamW on every parameter (sharded: on this rank's shards, engine/parallel/sharded_adamw.h).
// Moments in the host pool (remat.offload = "checkpoints+optimizer") pass through the device: a
// parameter's m and v come in while the previous parameter updates and go back while the next one
// does, so at most three parameters' moments are on the device at a time -- a fixed rule, which
// the planner's dry run follows to the byte. Parameters whose weights live in the host pool too
// ("checkpoints+optimizer+weights") never come to the device here: the host's cores update them
// (after grad_sum_squares, which waited for their gradients' copies).
void Trainer::update_weights(float lr, float grad_scale) {
  if (sharded_) {
    AdamWArgs hyper;
    hyper.lr = lr;
    hyper.weight_decay = static_cast<float>(train_.weight_decay);
    hyper.grad_scale = grad_scale;
    hyper.step = step_ + 1;
    return sharded_->update(hyper);
  }
  // One parameter's moments on the device with their copies in flight. Both buffers are allocated
  // before either copy starts, so an allocation failure leaves no copy behind; the destructor
  // orders the copies before the buffers are freed (also while an error unwinds).
  struct Staged {
    Backend& be;
    Buffer m, v;
    CopyTicket m_copy{}, v_copy{};
    Staged(Backend& b, const Param& p)
        : be(b),
          m(b.pool().allocate(p.m.tensor().shape, DType::F32, MemCategory::Optimizer,
                              p.name + ".adam_m (staged)")),
          v(b.pool().allocate(p.v.tensor().shape, DType::F32, MemCategory::Optimizer,
                              p.name + ".adam_v (staged)")) {
      m_copy = be.copy_to_device(m, p.m);
      v_copy = be.copy_to_device(v, p.v);
    }
    Staged(const Staged&) = delete;
    Staged& operator=(const Staged&) = delete;
    void wait() {
      for (CopyTicket* t : {&m_copy, &v_copy})
        if (t->id) be.wait_copy(std::exchange(*t, CopyTicket{}));
    }
    ~Staged() {
      try {
        wait();
      } catch (...) {  // the error already unwinding is the one to report
      }
    }
  };
  std::vector<Param*> on_host;
  for (Param& p : model_.params())
    if (p.trainable() && p.moments_on_host && !p.on_host) on_host.push_back(&p);
  std::vector<std::pair<const Param*, AdamWArgs>> host_updates;  // weights in host memory
  // Parameters whose state is all in device memory, updated together (a few launches on CUDA):
  // each run of them is issued before the next staged parameter's update, so the updates are
  // counted in the order of the parameters, as one call each would be.
  std::vector<AdamWArgs> on_device;
  // Host parameter k's moments sit in slot k % 3: k + 1 comes in, k updates, k - 1 goes out.
  std::array<std::unique_ptr<Staged>, 3> slots;
  size_t k = 0;
  for (Param& p : model_.params()) {
    if (!p.trainable()) continue;  // frozen: no gradient, no moments, never updated
    AdamWArgs a{p.value, p.grad, p.m, p.v};
    a.lr = lr;
    a.weight_decay = p.use_decay ? static_cast<float>(train_.weight_decay) : 0.0f;
    a.grad_scale = grad_scale;
    a.step = step_ + 1;
    if (p.on_host) {  // everything is in host memory: the host's cores update it in place
      if (be_.computes()) host_updates.emplace_back(&p, a);
      continue;
    }
    if (!p.moments_on_host) {
      on_device.push_back(a);
      continue;
    }
    be_.adamw_update(std::exchange(on_device, {}));
    if (k == 0) slots[0] = std::make_unique<Staged>(be_, p);
    if (k + 1 < on_host.size()) slots[(k + 1) % 3] = std::make_unique<Staged>(be_, *on_host[k + 1]);
    Staged& staged = *slots[k % 3];
    staged.wait();
    a.m = staged.m;
    a.v = staged.v;
    be_.adamw_update(a);
    staged.m_copy = be_.copy_to_host(p.m, staged.m);
    staged.v_copy = be_.copy_to_host(p.v, staged.v);
    if (k > 0) slots[(k - 1) % 3].reset();  // its copies out are done, then freed
    ++k;
  }
  be_.adamw_update(on_device);
  for (auto& slot : slots) slot.reset();
  if (host_updates.empty()) return;
  // In the order the next step fetches them (the stem's first), each parameter once.
  std::vector<std::pair<const Param*, AdamWArgs>> ordered;
  for (const ParamUse& use : eval_uses(model_))
    for (const Param* p : use.params)
      for (auto& u : host_updates)
        if (u.first == p && std::none_of(ordered.begin(), ordered.end(),
                                         [p](const auto& o) { return o.first == p; }))
          ordered.push_back(u);
  REMAT_ASSERT(ordered.size() == host_updates.size(), "host AdamW: {} of {} parameters ordered",
               ordered.size(), host_updates.size());
  be_.synchronize();  // every gradient's copy to the host is done before the host reads them
  if (host_update_async_) {
    host_update_->start(std::move(ordered));
  } else {
    for (const auto& u : ordered) cpu::host_adamw_update(u.second);
  }
}

double Trainer::evaluate(int64_t eval_tokens) {
  wait_host_update();
  const int64_t n = data_.validation_batches(eval_tokens);
  if (n == 0) return std::nan("");
  struct TrainingAgain {  // dropout back on, also when a batch throws
    Model& m;
    ~TrainingAgain() { m.set_training(true); }
  } restore{model_};
  model_.set_training(false);
  double sum = 0, tokens = 0;
  for (int64_t i = 0; i < n; ++i) {
    be_.pool().set_phase("eval data");
    Batch batch = data_.validation_batch(be_, i);
    const StepLoss loss = forward_loss(be_, model_, batch);
    sum += loss.mean;
    tokens = static_cast<double>(loss.row_losses.size());
  }
  return mean_over_ranks({sum / static_cast<double>(n)}, {tokens})[0];
}

}  // namespace remat
