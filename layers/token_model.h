// What the two language models (GptModel in layers/models.cpp, LlamaModel in
// layers/llama_model.cpp) share: the rows of a step (this rank's tokens of each row under context
// parallelism, and the ring their attention runs over), the divisor of the mean loss, parameter
// creation, the token-embedding stem (plus the GPT's learned positions when it has them) and the
// fused LM head + cross-entropy call. Each model declares its own parameters, blocks and final
// norm in its own file, and names its own transient buffers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/config/lora.h"
#include "engine/model.h"
#include "engine/parallel/context_ring.h"
#include "layers/layer.h"
#include "layers/lora.h"
#include "layers/models.h"

namespace remat::detail {

class TokenModel : public Model {
 public:
  std::vector<int64_t> stream_shape() const override { return {B_, T_, n_embd_}; }
  int64_t loss_rows() const override { return B_ * T_; }
  int64_t loss_rows_all_ranks() const override { return loss_rows_all_ranks_; }
  /// Token embedding (+ learned positions when wpe_ is set) into "blocks.0.x".
  Buffer stem_forward(Backend& be, const Batch& batch, MemCategory category) override;
  void stem_backward(Backend& be, const Batch& batch, const Tensor& dx) override;

 protected:
  /// Sets up the ring (context_ranks > 1), this rank's rows and the loss chunking.
  TokenModel(const ModelShape& s, int64_t n_embd, int64_t vocab_size);

  /// Appends a parameter initialized from the run's seed, its moments and weights placed as
  /// `s` says (frozen under LoRA unless modules_to_save names it). params_ must be reserved for
  /// all of them first: blocks keep pointers into it.
  Param* add_param(Backend& be, const ModelShape& s, const std::string& name,
                   const std::vector<int64_t>& shape, ParamInit init);

  /// LoRA (layers/lora.h), before the first add_param: which linears of `m` take adapters (`s`'s
  /// [lora]), which base parameters still train, and the adapters' shared scale and dropout.
  void plan_lora(const ModelConfig& m, const ModelShape& s);
  /// How many parameters the adapters add (params_ must be reserved for them too).
  size_t lora_param_count() const { return 2 * sites_.size(); }
  /// The adapters of base weight `base` ("blocks.3.attn.qkv.weight"), their A and B added now:
  /// A uniform in +-1/sqrt(in) (peft's Kaiming-uniform with a = sqrt(5)), B zero, so the adapted
  /// model starts as the base. None when LoRA is off or `base` is not a target.
  std::vector<LoraAdapter> add_adapters(Backend& be, const ModelShape& s, const std::string& base);
  LoraShared lora_shared_;  // for the blocks' shapes

  /// The fused LM head and cross-entropy on the final norm's output `normed` (N, C): per-row
  /// losses (N) [=], d normed (N, C) [=], head.grad [+=]; the gradient of the mean over the
  /// step's trained targets (Batch::step_targets; all ranks' rows when it is 0). With `predictions`
  /// (N) i32 not empty, each row's argmax [=].
  void lm_head_loss(Backend& be, const Tensor& normed, Param& head, const Batch& batch,
                    const Tensor& losses, const Tensor& dnormed, const Tensor& predictions);

  std::unique_ptr<parallel::ContextRing> ring_;  // context parallel only
  // The step's documents (Batch::doc_start), set by stem_forward; empty: causal. The blocks read
  // it through the pointer their shape holds (GptBlockShape::doc_start).
  Tensor doc_start_;
  int64_t B_ = 0, T_ = 0, loss_chunk_ = 0;
  // The mean loss's divisor: this rank's rows times the data-parallel ranks, so that the
  // gradients summed over the ranks are those of the mean over the whole batch.
  int64_t loss_rows_all_ranks_ = 0;
  Param* wte_ = nullptr;
  Param* wpe_ = nullptr;  // learned positions (GPT with position = "learned"), else null

 private:
  int64_t n_embd_ = 0;
  bool lora_ = false;
  std::vector<lora::Site> sites_;         // the adapted linears, model order
  std::set<std::string> trainable_base_;  // modules_to_save's parameters
  // The frozen parameters stored below f32 (lora.base = "bf16", "nf4"): the blocks' linears as
  // lora.base says, the token table and the LM head in bf16. Every other parameter is f32.
  std::map<std::string, DType> stored_dtype_;
};

}  // namespace remat::detail
