// The models remat-train trains, built from a config for one (batch, sequence) shape:
//   GptModel: token (+ learned position) embedding, L pre-LN blocks, final LayerNorm, LM head
//             tied to the token embedding, mean next-token cross-entropy (fused and chunked).
//   LlamaModel (layers/llama_model.cpp): token embedding, L Llama-family blocks (RMSNorm,
//             grouped-query attention with RoPE, SwiGLU), final RMSNorm, tied or untied LM head.
//   MlpModel: the checkpointing tutorial's L relu layers on synthetic regression, MSE loss.
#pragma once

#include <memory>

#include "engine/config/config.h"
#include "engine/model.h"

namespace remat {

namespace parallel {
class RingChannel;
}  // namespace parallel

/// What a model needs besides [model]: the shape of one step and the run's seed (parameter
/// initialization, dropout), LM-head chunking and the blocks' token tiling.
struct ModelShape {
  int64_t batch_size = 1;  // rows this rank trains on
  int64_t data_ranks = 1;  // data-parallel groups: the loss is the mean over all their rows
  int data_rank = 0;       // this rank's group (its rows follow the groups' before it)
  int64_t seq_len = 1;     // every row's tokens (all context ranks' together)
  // Context parallel (gpt): this rank holds 2 of 2 x context_ranks chunks of each row, and
  // attention is a ring over `ring_channel` (null: a dry run of rank context_rank).
  int context_ranks = 1, context_rank = 0;
  parallel::RingChannel* ring_channel = nullptr;
  uint64_t seed = 0;            // train.seed
  int64_t loss_chunk = 0;       // train.loss_chunk; 0 = chosen by the tool
  int64_t tile_tokens = 0;      // remat.tile_tokens (gpt): token rows per MLP chunk; 0 = untiled
  int64_t attention_chunk = 0;  // remat.attention_chunk: tokens per attention chunk; 0 = automatic
  // remat.offload = "checkpoints+optimizer": AdamW m, v on the host; parallel.shard_optimizer:
  // spread over the ranks, none per parameter.
  MomentHome moments = MomentHome::Device;
  // remat.offload = "checkpoints+optimizer+weights": weights and gradients on the host too.
  bool weights_on_host = false;
  // data.attention = "document": the documents' mean length the attention FLOP count assumes
  // (DataConfig::mean_document_tokens); 0: the causal upper bound.
  double mean_doc_tokens = 0;
  // [lora]: adapters on the chosen linears, every other parameter frozen but modules_to_save.
  LoraConfig lora{};
};
/// The shape of a single-rank run of `train` (make_model(Config) splits the batch over ranks).
ModelShape model_shape(const TrainConfig& train);

std::unique_ptr<Model> make_model(const ModelConfig& model, const ModelShape& shape, Backend& be);
/// The Llama family's model (layers/llama_model.cpp); make_model picks it for kind = "llama".
std::unique_ptr<Model> make_llama_model(const ModelConfig& model, const ModelShape& shape,
                                        Backend& be);
/// The model of `cfg`: [model] at the shape of [train], this rank's share of it under [parallel]
/// (cfg.parallel.rank), with ring attention over `ring_channel` (null: a dry run).
std::unique_ptr<Model> make_model(const Config& cfg, Backend& be,
                                  parallel::RingChannel* ring_channel = nullptr);

}  // namespace remat
