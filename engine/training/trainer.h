// The trainer: data -> forward/backward under the remat plan -> global-norm gradient clipping ->
// AdamW -> learning-rate schedule (linear warmup, cosine decay), one call per step.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/backend.h"
#include "engine/model.h"
#include "engine/remat/executor.h"

namespace remat {

class DistributedMoments;
class HostAdamW;
namespace parallel {
class Communicator;
class GradientSync;
class ShardedAdamW;
}  // namespace parallel

/// This trainer as one of `ranks` ranks (data x context, engine/parallel): it trains on its share
/// of each step's rows and tokens, and the gradients, the loss and the task metric are summed
/// over every rank.
struct DataParallel {
  int ranks = 1;                           // every rank of the job
  int rank = 0;                            // this one (what a dry run plans for)
  uint64_t bucket_bytes = 16ull << 20;     // parallel.bucket_bytes
  bool shard_optimizer = false;            // parallel.shard_optimizer (ZeRO-1)
  parallel::Communicator* comm = nullptr;  // null with ranks > 1: a dry run (memory, no exchange)
};
/// `cfg`'s [parallel] for a run on `comm` (a dry run when null). The optimizer is sharded only
/// over more than one rank (the tests shard it over one, to check the path).
DataParallel data_parallel(const Config& cfg, parallel::Communicator* comm);
/// How `dp.ranks` ranks sum `model`'s gradients on `be`: rank-order sums over MPI in host memory
/// (the CPU backend, and dry runs of CPU targets: their slots are in the pool), NCCL on CUDA
/// (dry runs of CUDA targets: nothing in the pool); null on one rank.
std::unique_ptr<parallel::GradientSync> make_gradient_sync(Backend& be, Model& model,
                                                           const DataParallel& dp);

/// Where batches come from (data/ implements it). Deterministic in (seed, step): the batch of a
/// step is a pure function of them, so a resumed run draws exactly what an uninterrupted one would.
class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual std::string describe() const = 0;
  /// Documents, packing and loss masks, once open (the run's banner line `docs`); "" when none.
  virtual std::string documents_summary() const { return ""; }
  /// What open() found legal but probably unmeant (each a "warning: [data] ..." line), for the
  /// run's banner; empty when nothing.
  virtual std::vector<std::string> warnings() const { return {}; }
  /// Opens and checks every input file (file-backed sources); throws DataError naming the file
  /// and the fix. Dry runs never call it: the planner needs the shapes, not the tokens.
  virtual void open() {}
  /// The batch of step `step` (0-based), allocated on `be` (category transient).
  virtual Batch next(Backend& be, int64_t step) = 0;
  /// The trained targets of batch `step` on this rank, what next(be, step) counts in
  /// Batch::trained_targets, counted on the host without making the batch (a source may keep
  /// what it read for next(be, step)); -1 when every target trains. The trainer needs a whole
  /// step's count before its first micro-batch's backward.
  virtual int64_t trained_targets(int64_t step) { return -1; }
  /// Validation: how many fixed batches make up `eval_tokens` tokens (0: no validation data), and
  /// batch `index` of them. The same batches at every evaluation, so the curve is comparable.
  virtual int64_t validation_batches(int64_t eval_tokens) const { return 0; }
  virtual Batch validation_batch(Backend& be, int64_t index);
  /// Where the stream stands after `steps` steps (epoch, rows drawn, ...), for state.json.
  virtual nlohmann::json cursor(int64_t steps) const { return nlohmann::json::object(); }
  /// A task-specific metric from the per-row losses (the copy task's second-half loss), if any.
  virtual std::optional<double> task_metric(const std::vector<float>& row_losses) const {
    return std::nullopt;
  }
  virtual std::string task_metric_name() const { return ""; }
  /// How many of this rank's positions task_metric averages (several ranks weigh by it).
  virtual int64_t task_metric_count() const { return 0; }
};

struct StepMetrics {
  int64_t step = 0;  // 1-based
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_ms = 0;
  double data_ms = 0;     // of step_ms: making the batch (read or generated, and uploaded)
  double data_flops = 0;  // FLOPs making the batch took, outside the step's op counts
  double tokens_per_s = 0;
  int64_t tokens = 0;       // of the optimizer step: every micro-batch's, on every rank
  uint64_t peak_bytes = 0;  // pool peak so far (setup included)
  std::optional<double> task_metric;
};

/// Learning rate at 0-based step `s`: linear warmup to train.lr, then cosine to lr*min_lr_ratio.
double learning_rate(const TrainConfig& t, int64_t s);

class Trainer {
 public:
  /// Trains `model` on `data` with the [train] settings `train` under `plan`
  /// (resolve_remat_plan); the trainer reads no other section. `model` and `data` are this rank's
  /// (make_model and make_data_source split the batch over cfg.parallel).
  Trainer(TrainConfig train, RematPlan plan, Backend& be, Model& model, DataSource& data,
          DataParallel dp = {});
  ~Trainer();
  /// One optimizer step over train.grad_accum micro-batches (accumulate_gradients in
  /// trainer.cpp). Throws Diverged (before the optimizer update) when the loss or the gradient
  /// norm is not finite.
  StepMetrics step();
  /// Throws Diverged naming the first parameter whose value is not finite (an update can overflow
  /// the weights while the step's loss was still finite). Run before a checkpoint is written.
  void check_weights_finite();
  /// Gradient bytes this rank sends per step (0 on one rank).
  uint64_t sent_bytes_per_step() const;
  /// How the gradients are summed over the ranks ("" on one rank).
  std::string gradient_sync() const;
  /// The AdamW moments when they are spread over the ranks (parallel.shard_optimizer), for
  /// checkpoints; null when every parameter holds its own.
  DistributedMoments* sharded_moments() const;
  /// Mean validation loss over the data's fixed validation batches (forward only in effect:
  /// the gradients it leaves are zeroed by the next step). Dropout is off during evaluation.
  double evaluate(int64_t eval_tokens);
  const RematPlan& plan() const { return plan_; }
  int64_t steps_done() const { return step_; }
  /// Continues after `steps` steps (resume): the LR schedule, AdamW bias correction and the data
  /// stream pick up there.
  void set_steps_done(int64_t steps) { step_ = steps; }
  /// With the weights in host memory on a device that is not the host (CUDA), AdamW runs on a
  /// host thread while the next step starts, in the order that step fetches the weights; this
  /// waits until it is done. Whatever reads the weights or moments between steps calls it first
  /// (check_weights_finite and evaluate do it themselves).
  void wait_host_update();
  /// Tests: run that update on its thread on the CPU backend too (off there: the thread would
  /// compete with the step's own for the same cores).
  void set_host_update_async(bool on) { host_update_async_ = on; }

 private:
  /// This rank's loss over the step's micro-batches: their mean, the rows and tokens it averages.
  struct MicroBatchLoss {
    double mean = 0, rows = 0, tokens = 0;
    std::optional<double> task_metric;
  };
  /// Forward and backward of every micro-batch of the step, gradients summed (and over the ranks);
  /// adds the data's time and FLOPs to `m`.
  MicroBatchLoss accumulate_gradients(StepMetrics& m);
  std::string divergence_message(const StepMetrics& m);
  /// Means over every rank, each rank's weighted by how many values it averaged; as is on one.
  std::vector<double> mean_over_ranks(const std::vector<double>& means,
                                      const std::vector<double>& weights);
  /// The divisor of the step's mean loss (Batch::step_targets): its trained targets over its
  /// `micro` micro-batches and every rank.
  int64_t targets_in_step(int64_t micro);
  /// Of the summed gradients (the global norm's square).
  double grad_sum_squares();
  /// be_.sum_squares, or the host's for parameters in host memory (like `like`).
  double sum_squares(const std::vector<Tensor>& tensors, const Param& like);
  void update_weights(float lr, float grad_scale);
  TrainConfig train_;
  Backend& be_;
  Model& model_;
  DataSource& data_;
  RematPlan plan_;
  DataParallel dp_;
  std::unique_ptr<parallel::GradientSync> grad_sync_;  // ranks > 1 only
  std::unique_ptr<parallel::ShardedAdamW> sharded_;    // uses grad_sync_ (declared after it)
  std::unique_ptr<HostAdamW> host_update_;             // host parameters' AdamW, off the step
  bool host_update_async_ = false;
  int64_t step_ = 0;
};

}  // namespace remat
