// MLP-tutorial block forward/backward (see layers/mlp_block.h).
#include "layers/mlp_block.h"

namespace remat {

MlpBlock::MlpBlock(Param* fc_weight, Param* fc_bias, int64_t B, int64_t D, bool input_grad)
    : fc_weight_(fc_weight), fc_bias_(fc_bias), B_(B), D_(D), input_grad_(input_grad) {}

namespace {

// The saved activations: the input (for dW) and the pre-activation (for the ReLU mask).
constexpr SlotInfo<MlpBlock::Slot> kSlots[] = {
    {MlpBlock::X, "x", ActKind::Input},  // (B,D)
    {MlpBlock::Fc, "fc", ActKind::Dot},  // (B,D) fc GEMM output, before the ReLU
};
static_assert(std::size(kSlots) == MlpBlock::kNumSlots && slots_in_order(kSlots),
              "kSlots lists every slot of MlpBlock::Slot, in order");

}  // namespace

const std::vector<std::string>& MlpBlock::act_names() const {
  return slot_names<kSlots>();
}
const std::vector<ActKind>& MlpBlock::act_kinds() const {
  return slot_kinds<kSlots>();
}

void MlpBlock::forward(Backend& be, ActStore& a, const Tensor& y) {
  if (!a.has(Fc)) {  // with an output wanted, the ReLU is the GEMM's epilogue
    be.linear_forward({.out = a.make(be, Fc, {B_, D_}, be.act_dtype(), act_names()),
                       .inp = a.get(X),
                       .weight = fc_weight_->value,
                       .bias = fc_bias_->value,
                       .act_out = y,
                       .act = Activation::Relu});
  } else if (!y.empty()) {
    be.activation_forward({y, a.get(Fc), Activation::Relu});
  }
}

void MlpBlock::backward(Backend& be, ActStore& a, const Tensor& dresid) {
  Buffer dfc = be.pool().allocate({B_, D_}, be.act_dtype(), MemCategory::Transient, "grad.fc");
  be.activation_backward({dfc, dresid, a.get(Fc), Activation::Relu});
  be.linear_backward({input_grad_ ? dresid : Tensor(), fc_weight_->grad, fc_bias_->grad, dfc,
                      a.get(X), fc_weight_->value});
}

}  // namespace remat
