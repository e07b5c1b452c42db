// Synthetic tasks (see data/synthetic.h).
#include "data/synthetic.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "data/gaussian.h"
#include "engine/cpu/gemm.h"
#include "engine/rng.h"

namespace remat {
namespace {

constexpr uint64_t kTokenStream = 0x746f6b656e73ull;  // "tokens"
constexpr uint64_t kInputStream = 0x696e70757473ull;  // "inputs"
constexpr uint64_t kTeacherStream = 0x7465616368ull;  // "teach"

class TokenTask : public DataSource {
 public:
  explicit TokenTask(const Config& cfg)
      : task_(cfg.data.task),
        B_(cfg.train.batch_size),
        T_(cfg.train.seq_len),
        V_(cfg.model.vocab_size),
        seed_(cfg.train.seed) {}

  std::string describe() const override {
    return fmt::format("synthetic {} tokens (V={})", task_, V_);
  }

  Batch next(Backend& be, int64_t step) override {
    Batch batch;
    MemoryPool& pool = be.pool();
    batch.inputs = pool.allocate({B_, T_}, DType::I32, MemCategory::Transient, "batch.inputs");
    batch.targets = pool.allocate({B_, T_}, DType::I32, MemCategory::Transient, "batch.targets");
    batch.n_tokens = B_ * T_;
    if (!be.computes()) return batch;  // a dry run needs the shapes, not the tokens
    std::vector<int32_t> inputs(static_cast<size_t>(B_ * T_)), targets(inputs.size());
    {
      const int64_t half = T_ / 2;
      for (int64_t b = 0; b < B_; ++b) {
        const uint64_t row = static_cast<uint64_t>(step * B_ + b);
        // s has T+1 tokens; inputs are s[0..T), targets s[1..T].
        auto token = [&](int64_t k) {
          const int64_t src = (task_ == "copy" && k >= half) ? k % half : k;
          return static_cast<int32_t>(
              rng_bits(seed_ ^ row, kTokenStream, static_cast<uint64_t>(src)) %
              static_cast<uint64_t>(V_));
        };
        for (int64_t t = 0; t < T_; ++t) {
          inputs[static_cast<size_t>(b * T_ + t)] = token(t);
          targets[static_cast<size_t>(b * T_ + t)] = token(t + 1);
        }
      }
    }
    be.upload(batch.inputs, inputs.data());
    be.upload(batch.targets, targets.data());
    return batch;
  }

  // Mean loss over the positions of the second half, whose next token repeats the first half.
  std::optional<double> task_metric(const std::vector<float>& row_losses) const override {
    if (task_ != "copy" || row_losses.empty()) return std::nullopt;
    double sum = 0;
    int64_t n = 0;
    for (int64_t b = 0; b < B_; ++b)
      for (int64_t t = T_ / 2; t < T_; ++t, ++n) sum += row_losses[static_cast<size_t>(b * T_ + t)];
    return sum / static_cast<double>(n);
  }
  std::string task_metric_name() const override { return task_ == "copy" ? "copy_loss" : ""; }

 private:
  std::string task_;
  int64_t B_, T_, V_;
  uint64_t seed_;
};

class RegressionTask : public DataSource {
 public:
  explicit RegressionTask(const Config& cfg)
      : B_(cfg.train.batch_size), D_(cfg.model.n_embd), seed_(cfg.train.seed) {}
  // The D x D teacher is made when the data is opened, not built: dry runs never need it, and a
  // model too wide for the budget must meet the pool's out-of-memory error, not a bad_alloc here.
  void open() override {
    if (!teacher_.empty()) return;
    teacher_.resize(static_cast<size_t>(D_ * D_));
    const double std = 1.0 / std::sqrt(static_cast<double>(D_));
    for (size_t i = 0; i < teacher_.size(); ++i)
      teacher_[i] = static_cast<float>(std * rng_normal(seed_, kTeacherStream, i));
  }
  std::string describe() const override {
    return fmt::format("synthetic regression y = relu(x A^T), D={}", D_);
  }

  Batch next(Backend& be, int64_t step) override {
    Batch batch;
    MemoryPool& pool = be.pool();
    batch.inputs = pool.allocate({B_, D_}, DType::F32, MemCategory::Transient,
                                 "batch.inputs");  // cast by the stem
    batch.targets = pool.allocate({B_, D_}, DType::F32, MemCategory::Transient, "batch.targets");
    batch.n_tokens = B_;
    if (!be.computes()) return batch;
    open();
    // Kept between steps: fresh 8 MiB vectors cost their page faults and zeroing every step.
    std::vector<float>& x = inputs_;
    std::vector<float>& y = targets_;
    x.resize(static_cast<size_t>(B_ * D_));
    y.resize(x.size());
    {
      // Counter-based: each pair of numbers is a function of its index alone.
      const uint64_t pairs_per_step = (x.size() + 1) / 2;
      fill_normal(x, seed_, kInputStream, static_cast<uint64_t>(step) * pairs_per_step);
      // y = relu(x A^T): one host SGEMM (the teacher lives on the host, like the data), on the
      // CPU backend's tile grid so that the targets are the same bits for any thread count
      // (OpenBLAS's own split is not).
      cpu::sgemm(CblasNoTrans, CblasTrans, B_, D_, D_, x.data(), D_, teacher_.data(), D_, 0.0f,
                 y.data(), D_);
      for (float& v : y) v = std::max(v, 0.0f);
    }
    be.upload(batch.inputs, x.data());
    be.upload(batch.targets, y.data());
    return batch;
  }

 private:
  int64_t B_, D_;
  uint64_t seed_;
  std::vector<float> teacher_;
  std::vector<float> inputs_, targets_;  // host staging of one batch
};

}  // namespace

std::unique_ptr<DataSource> make_synthetic_data(const Config& cfg) {
  if (cfg.data.task == "regression") return std::make_unique<RegressionTask>(cfg);
  return std::make_unique<TokenTask>(cfg);
}

}  // namespace remat
