#pragma once
// Training checkpoints: one directory per step, written under a temporary name, every file
// fsynced, then renamed into place (Note [Checkpoint layout] in checkpoint.cpp).

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/models/model.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

class SafetensorsFile;

/// Everything besides tensors that a resumed run needs to continue exactly.
struct TrainerState {
  int64_t step = 0;           ///< optimizer steps completed
  int64_t data_position = 0;  ///< sampler position (micro-batches handed out)
  int64_t tokens_seen = 0;
  double loss_scale = 1.0;
  int64_t growth_tracker = 0;
  std::string config_hash;
};

/// What a checkpoint holds, taken between steps (Note [Asynchronous checkpoints]).
struct CheckpointSnapshot {
  std::vector<NamedTensor> model, optimizer, rng;
  std::string hf_config, tandem_yaml;
  TrainerState state;
  /// Note [Sharded checkpoints]: the ranks' optimizer shard files, written beside the checkpoint
  /// and moved into it; zero_world > 0 replaces optimizer.safetensors by them.
  int zero_world = 0;
  std::vector<std::string> adopt;
  /// Files copied in as they are: the tokenizer of the model.init_from folder (Note [Checkpoint
  /// companions]).
  std::vector<std::string> companions;
};

/// The name of rank r's shard file in a sharded checkpoint (Note [Sharded checkpoints]).
std::string zero_shard_file(int rank);
/// Where the ranks write their shard files for step `step` before rank 0 moves them in.
std::string zero_staging_dir(const std::string& parent, int64_t step);
/// The number of ranks whose shards a checkpoint holds; 0 for a whole (unsharded) checkpoint.
int checkpoint_zero_world(const std::string& dir);

/// The shards of a sharded checkpoint, read at any world size (Note [Sharded checkpoints]).
class ZeroShards {
 public:
  explicit ZeroShards(const std::string& dir);
  ~ZeroShards();
  /// Copies elements [offset, offset + n) of Block `block`'s whole range of `kind` ("master",
  /// "exp_avg", "exp_avg_sq") into `out` (n elements), from whichever shards hold them.
  void read(const std::string& block, const std::string& kind, int64_t offset, int64_t n, torch::Tensor out) const;
  int world() const { return static_cast<int>(files_.size()); }

 private:
  struct Piece {
    int64_t offset, numel;  // the shard's slice of the Block's range
  };
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::map<std::string, Piece>> layout_;  // per rank: Block -> its slice
  std::map<std::string, int64_t> numel_;              // Block -> numel
};

/// Where a checkpoint's weights go: `lookup(name)` gives a tensor of model.safetensors (nullopt when
/// absent); `source` names the file for errors.
using WeightLoader = std::function<void(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                                        const std::string& source)>;

/// The model's side of a checkpoint, whoever defined the model (Note [Block sequence]): a preset
/// (checkpoint_model) or a Python module (python/engine_core).
struct CheckpointModel {
  /// The weights under their checkpoint names (the live tensors; with the offload engine, called
  /// while the fp32 masters are bound).
  std::function<std::vector<NamedTensor>()> weights;
  std::string hf_config;  ///< config.json text ("" = none)
  WeightLoader load;      ///< copies a checkpoint's weights in
};
/// A preset's: HF-shaped weights, its HF config, load_hf_state_dict.
CheckpointModel checkpoint_model(Model& model);

/// The checkpoint's contents now; `copy` clones every tensor into host memory (for a write that
/// overlaps training), otherwise the snapshot refers to the live tensors.
CheckpointSnapshot take_checkpoint_snapshot(Model& model, Optimizer& optimizer, const TrainerState& state,
                                            const Config& config, int device_index, bool copy);
/// The same for any model.
CheckpointSnapshot take_checkpoint_snapshot(const CheckpointModel& model, Optimizer& optimizer,
                                            const TrainerState& state, const Config& config, int device_index,
                                            bool copy);

/// Host bytes a copy of the snapshot's tensors needs (weights and optimizer state).
int64_t checkpoint_snapshot_bytes(const CheckpointSnapshot& snapshot);
/// Replaces the snapshot's references to live tensors with host copies.
void own_checkpoint_snapshot(CheckpointSnapshot& snapshot);

/// Writes a snapshot as `<parent>/step_XXXXXXXX` atomically and returns its path (any thread).
std::string write_checkpoint(const std::string& parent, const CheckpointSnapshot& snapshot);

/// Writes `<parent>/step_XXXXXXXX` atomically and returns its path.
std::string save_checkpoint(const std::string& parent, Model& model, Optimizer& optimizer, const TrainerState& state,
                            const Config& config, int device_index);

/// Restores model, optimizer and RNG from a checkpoint directory and returns the trainer state.
/// UserError when the directory is not a complete checkpoint or does not match the model.
TrainerState load_checkpoint(const std::string& dir, Model& model, Optimizer& optimizer, int device_index);
/// The same for any model.
TrainerState load_checkpoint(const std::string& dir, const CheckpointModel& model, Optimizer& optimizer,
                             int device_index);
/// Restores only the RNG and returns the trainer state (a sharded checkpoint's weights and states
/// come from ZeroShards).
TrainerState load_checkpoint_state(const std::string& dir, int device_index);

/// "" when the checkpoint directory is intact (manifest present, every file of its size and
/// SHA-256), otherwise what is wrong with it.
std::string verify_checkpoint(const std::string& dir);

/// The newest intact checkpoint under <run_dir>/checkpoints, or "" when there is none; the damaged
/// ones passed over are added to *skipped with their reasons.
std::string newest_intact_checkpoint(const std::string& run_dir, std::vector<std::string>* skipped);

/// A checkpoint directory itself, or the newest complete checkpoint under a run directory.
/// `what` names the caller in errors ("--resume", "engine.load").
std::string resolve_checkpoint_dir(const std::string& path, const std::string& what = "--resume");

/// The directory name of the checkpoint at `step`: step_XXXXXXXX.
std::string step_name(int64_t step);

/// The tandem config stored in a checkpoint (tandem.yaml), applied onto cfg.
void load_checkpoint_config(Config& cfg, const std::string& checkpoint_dir);

/// Complete checkpoints under `parent`, oldest first.
std::vector<std::string> list_checkpoints(const std::string& parent);

/// Removes all but the newest `keep` checkpoints under `parent`.
void prune_checkpoints(const std::string& parent, int64_t keep);

}  // namespace tandem
