// Synthetic tasks (see data/synthetic.h).
#include "data/synthetic.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "data/documents.h"
#include "data/gaussian.h"
#include "engine/core/rng.h"
#include "engine/cpu/gemm.h"

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
        share_(batch_share(cfg)),
        T_(cfg.train.seq_len),
        V_(cfg.model.vocab_size),
        seed_(cfg.train.seed),
        eot_(cfg.data.documents() ? cfg.data.eot_token : -1) {}

  std::string describe() const override {
    return fmt::format("synthetic {} tokens (V={})", task_, V_);
  }
  std::string documents_summary() const override {
    return eot_ < 0 ? ""
                    : fmt::format(
                          "documents end with token {}; each token attends within its "
                          "document, positions from 0",
                          eot_);
  }

  Batch next(Backend& be, int64_t step) override {
    Batch batch;
    MemoryPool& pool = be.pool();
    const int64_t Tl = share_.positions.tokens();  // this rank's tokens of each row
    batch.inputs =
        pool.allocate({share_.rows, Tl}, DType::I32, MemCategory::Transient, "batch.inputs");
    batch.targets =
        pool.allocate({share_.rows, Tl}, DType::I32, MemCategory::Transient, "batch.targets");
    if (eot_ >= 0)
      batch.doc_start =
          pool.allocate({share_.rows, Tl}, DType::I32, MemCategory::Transient, "batch.doc_start");
    batch.n_tokens = share_.rows * Tl;
    if (!be.computes()) return batch;  // a dry run needs the shapes, not the tokens
    std::vector<int32_t> inputs(static_cast<size_t>(share_.rows * Tl)), targets(inputs.size());
    if (eot_ >= 0) {
      documents_batch(be, batch, step, inputs, targets);
      return batch;
    }
    // A row has T+1 tokens; inputs are tokens 0..T-1, targets 1..T.
    for (int64_t b = 0; b < share_.rows; ++b)
      share_.positions.for_each([&](int64_t j, int64_t t) {
        inputs[static_cast<size_t>(b * Tl + j)] = token(step, b, t);
        targets[static_cast<size_t>(b * Tl + j)] = token(step, b, t + 1);
      });
    be.upload(batch.inputs, inputs.data());
    be.upload(batch.targets, targets.data());
    return batch;
  }

  // Documents: each row's T + 1 tokens, then the marking every token source shares
  // (data/documents.h), then this rank's positions. Returns the trained targets.
  int64_t document_rows(int64_t step, std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                        std::vector<int32_t>& docs) const {
    const int64_t Tl = share_.positions.tokens();
    std::vector<int32_t> row(static_cast<size_t>(T_ + 1)), row_targets(static_cast<size_t>(T_)),
        row_docs(row_targets.size());
    int64_t trained = 0;
    for (int64_t b = 0; b < share_.rows; ++b) {
      for (int64_t k = 0; k <= T_; ++k) row[static_cast<size_t>(k)] = token(step, b, k);
      mark_row(row.data(), nullptr, T_, eot_, row_targets.data(), row_docs.data());
      share_.positions.for_each([&](int64_t j, int64_t t) {
        const auto at = static_cast<size_t>(b * Tl + j), ti = static_cast<size_t>(t);
        inputs[at] = row[ti];
        targets[at] = row_targets[ti];
        docs[at] = row_docs[ti];
        trained += targets[at] >= 0;
      });
    }
    return trained;
  }

  void documents_batch(Backend& be, Batch& batch, int64_t step, std::vector<int32_t>& inputs,
                       std::vector<int32_t>& targets) const {
    std::vector<int32_t> docs(inputs.size());
    batch.trained_targets = document_rows(step, inputs, targets, docs);
    be.upload(batch.inputs, inputs.data());
    be.upload(batch.targets, targets.data());
    be.upload(batch.doc_start, docs.data());
  }

  int64_t trained_targets(int64_t step) override {
    if (eot_ < 0) return -1;
    const auto n = static_cast<size_t>(share_.rows * share_.positions.tokens());
    std::vector<int32_t> inputs(n), targets(n), docs(n);
    return document_rows(step, inputs, targets, docs);
  }

  // Token k (of T + 1) of this rank's row b at `step`.
  int32_t token(int64_t step, int64_t b, int64_t k) const {
    const uint64_t row = static_cast<uint64_t>(step * B_ + share_.first_row + b);
    const int64_t src = (task_ == "copy" && k >= T_ / 2) ? k % (T_ / 2) : k;
    return static_cast<int32_t>(rng_bits(seed_ ^ row, kTokenStream, static_cast<uint64_t>(src)) %
                                static_cast<uint64_t>(V_));
  }

  // Mean loss over the positions of the second half, whose next token repeats the first half.
  std::optional<double> task_metric(const std::vector<float>& row_losses) const override {
    if (task_ != "copy" || row_losses.empty()) return std::nullopt;
    double sum = 0;
    const int64_t Tl = share_.positions.tokens();
    for (int64_t b = 0; b < share_.rows; ++b)
      share_.positions.for_each([&](int64_t j, int64_t t) {
        if (t >= T_ / 2) sum += row_losses[static_cast<size_t>(b * Tl + j)];
      });
    return sum / static_cast<double>(task_metric_count());
  }
  int64_t task_metric_count() const override {
    return share_.positions.count_from(T_ / 2) * share_.rows;
  }
  std::string task_metric_name() const override { return task_ == "copy" ? "copy_loss" : ""; }

 private:
  std::string task_;
  int64_t B_;         // rows per step, over every data-parallel rank
  BatchShare share_;  // this rank's rows of each step's B_, and its positions of each row
  int64_t T_;
  int64_t V_;
  uint64_t seed_;
  int64_t eot_;  // documents end with this token (data.attention = "document"); -1: none
};

class RegressionTask : public DataSource {
 public:
  explicit RegressionTask(const Config& cfg)
      : B_(cfg.train.batch_size),
        share_(batch_share(cfg)),
        D_(cfg.model.n_embd),
        seed_(cfg.train.seed) {}
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
    batch.inputs = pool.allocate({share_.rows, D_}, DType::F32, MemCategory::Transient,
                                 "batch.inputs");  // cast by the stem
    batch.targets =
        pool.allocate({share_.rows, D_}, DType::F32, MemCategory::Transient, "batch.targets");
    batch.n_tokens = share_.rows;
    if (!be.computes()) return batch;
    open();
    const auto n = static_cast<size_t>(share_.rows * D_);
    // Counter-based: each pair of numbers is a function of its index alone. Number e of a step (of
    // all B_ rows) is number 2 * step * pairs_per_step + e of the stream; this rank's rows start
    // at e = share_.first_row * D_, which may be the second number of a pair.
    const auto pairs_per_step = static_cast<uint64_t>((B_ * D_ + 1) / 2);
    const uint64_t first = 2 * static_cast<uint64_t>(step) * pairs_per_step +
                           static_cast<uint64_t>(share_.first_row * D_);
    // Where device memory is host memory, straight into the batch (two 8 MiB copies fewer for the
    // tutorial's MLP); otherwise into host staging kept between steps (fresh vectors cost their
    // page faults and zeroing every step), then uploaded.
    const bool direct = be.device_is_host();
    if (!direct) {
      inputs_.resize(n);
      targets_.resize(n);
    }
    float* x = direct ? batch.inputs.f32() : inputs_.data();
    float* y = direct ? batch.targets.f32() : targets_.data();
    fill_normal_from({x, n}, seed_, kInputStream, first);
    // y = relu(x A^T): one host SGEMM (the teacher lives on the host, like the data), on the CPU
    // backend's tile grid so that the targets are the same bits for any thread count (OpenBLAS's
    // own split is not), with the ReLU on each tile while it is in cache.
    const int64_t ld = D_;
    cpu::sgemm(CblasNoTrans, CblasTrans, share_.rows, D_, D_, x, D_, teacher_.data(), D_, 0.0f, y,
               D_, [y, ld](int64_t r0, int64_t c0, int64_t m, int64_t cols) {
                 for (int64_t r = r0; r < r0 + m; ++r)
                   for (float* v = y + r * ld + c0; v < y + r * ld + c0 + cols; ++v)
                     *v = std::max(*v, 0.0f);
               });
    batch.making_flops = 2.0 * static_cast<double>(share_.rows * D_ * D_);
    if (!direct) {
      be.upload(batch.inputs, x);
      be.upload(batch.targets, y);
    }
    return batch;
  }

 private:
  int64_t B_;         // rows per step, over every data-parallel rank
  BatchShare share_;  // this rank's rows of each step's B_
  int64_t D_;
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
