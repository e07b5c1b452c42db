// Checkpoints: one folder per checkpoint, `DIR/step_00000100/`, holding
//   model.safetensors      the trainable parameters by name (f32), e.g. "blocks.3.attn.qkv.weight"
//                          (a LoRA run's adapters and modules_to_save: frozen ones are not
//                          written, its state.json names the base they come from)
//   optimizer.safetensors  AdamW moments, "<param>.exp_avg" and "<param>.exp_avg_sq" (f32)
//   state.json             step, the full resolved config (TOML text), the data cursor, versions,
//                          and each tensor file's size and XXH3-64 checksum
// A folder is written as `DIR/.tmp-step_00000100/`, every file fsync'd, then renamed into place
// and DIR fsync'd: a run killed at any instant leaves the previous complete checkpoint or the new
// one, and nothing named step_* is ever half-written. Readers verify sizes and checksums before
// they trust a byte, and every problem is a CheckpointError naming the file and the fix.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/model.h"
#include "engine/parallel/distributed_moments.h"
#include "engine/training/checkpoint_state.h"

namespace remat {

/// Folder name of checkpoint `step`: "step_00000100".
std::string checkpoint_folder_name(int64_t step);

/// The pool buffer a checkpoint write stages tensors through. On a device that is the host (the
/// CPU backend, or a dry run for it) the staging buffer is device memory, so it comes from the
/// pool (category Transient, "checkpoint.staging", the size of the largest parameter) and the
/// planner sees it; elsewhere staging is host memory outside the device pool and this is empty.
Buffer allocate_checkpoint_staging(Backend& be, Model& model);

/// Writes checkpoint `state.step` of `model` (weights and AdamW moments) under `dir` atomically
/// (see above). Creates `dir` if needed. Returns the final folder path. Throws IoError (with the
/// path) when a write, fsync or rename fails; a failed write leaves no step_* folder behind.
/// `moments` (sharded AdamW moments; null when every Param holds its own): every other rank calls
/// send_checkpoint_moments at the same time.
std::string write_checkpoint(const std::string& dir, Backend& be, Model& model,
                             const CheckpointState& state, DistributedMoments* moments = nullptr);
/// A rank other than 0's part of rank 0's write_checkpoint with sharded moments.
void send_checkpoint_moments(Model& model, DistributedMoments& moments);

/// Deletes all but the newest `keep_last` complete checkpoints in `dir` (0: keep all), and any
/// leftover .tmp-* folder of an earlier killed run.
void prune_checkpoints(const std::string& dir, int64_t keep_last);

/// The newest complete checkpoint folder in `dir`, or "" when there is none.
std::string latest_checkpoint(const std::string& dir);

/// The entries of `dir` named as checkpoints of steps after `step` (step_<digits>, complete or
/// not, folders or not), sorted: what a run continuing from `step` there would write over.
std::vector<std::string> step_entries_after(const std::string& dir, int64_t step);

/// The state.json of checkpoint folder `path` alone, parsed and validated (the tensor files are
/// not read: Checkpoint verifies them). Throws CheckpointError.
CheckpointState read_checkpoint_state(const std::string& path);

/// One checkpoint opened for reading: state.json parsed, both tensor files checked against it
/// (size, checksum) and as safetensors (header, dtypes, offsets), memory-mapped.
class Checkpoint {
 public:
  /// `path` is a checkpoint folder. Throws CheckpointError.
  explicit Checkpoint(const std::string& path);
  ~Checkpoint();
  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  const std::string& path() const;
  const CheckpointState& state() const;
  /// Copies every parameter (and, with `with_optimizer`, its AdamW moments: into `moments` when
  /// they are sharded) into `model` by name. A missing tensor, an extra one or another shape is a
  /// CheckpointError naming the tensor.
  void load_into(Backend& be, Model& model, bool with_optimizer,
                 DistributedMoments* moments = nullptr) const;
  /// Both files hold exactly `model`'s parameters and their moments, by name and shape, where
  /// `model` is the one state.json's config describes (built by the caller, on a count backend):
  /// otherwise a CheckpointError naming the first tensor missing, left over or mis-shaped. A
  /// state.json edited after the write (n_embd, vocab_size, d_ff, tie_embeddings) is caught here.
  void check_matches(Model& model) const;
  /// Names of the tensors in model.safetensors, in file order.
  std::vector<std::string> weight_names() const;
  /// One weight as host f32 and its shape (for sampling). Throws CheckpointError if absent.
  std::vector<float> weight(const std::string& name, std::vector<int64_t>* shape = nullptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// `--init FILE`: copies weights only (no optimizer state, no step) into `model` from a
/// model.safetensors file or a checkpoint folder. Shapes must match. Throws CheckpointError.
void load_weights(const std::string& path, Backend& be, Model& model);

}  // namespace remat
