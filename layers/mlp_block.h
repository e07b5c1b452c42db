// The checkpointing tutorial's MLP block: y = relu(x W^T + b), width D.
//   backward: dfc = dy * [fc > 0];  dx = dfc W;  dW += dfc^T x;  db += sum_rows dfc.
// Saves x (for dW) and fc (for the ReLU mask). The model's first block takes no input gradient
// (`input_grad` false): its input is the data, whose gradient nothing reads, so dx = dfc W is not
// computed (1/(3L) of a step's FLOPs without remat: a twelfth of configs/mlp4.toml's).
#pragma once

#include <string>
#include <vector>

#include "engine/model.h"

namespace remat {

class MlpBlock : public Block {
 public:
  enum Slot : size_t { X, Fc, kNumSlots };
  MlpBlock(Param* fc_weight, Param* fc_bias, int64_t B, int64_t D, bool input_grad = true);
  const std::vector<std::string>& act_names() const override;
  const std::vector<ActKind>& act_kinds() const override;
  void forward(Backend& be, ActStore& acts, const Tensor& y) override;
  void backward(Backend& be, ActStore& acts, const Tensor& dresid) override;

 private:
  Param* fc_weight_;
  Param* fc_bias_;
  int64_t B_, D_;
  bool input_grad_;  // false: backward leaves dresid as it is (no one reads dL/dx)
};

}  // namespace remat
