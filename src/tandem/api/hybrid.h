#pragma once
// The short C++ API of seed 000: build a hybrid model from blocks (dense "AMX" blocks for the
// CPU feeding Mixture-of-Experts blocks for the GPU), give it a placement policy, train.
//
//   tandem::HybridModel model;           // 2 dense blocks, then 4 MoE blocks of 8 experts
//   tandem::Config cfg = tandem::hybrid_config(model);
//   tandem::use_threshold(cfg);          // the seed's rule: 200 W, 80 % CPU
//   tandem::train(cfg, {});
//
// Everything else is the ordinary configuration (cfg.train.steps, cfg.data.path, ...), so a run
// started here is the same as `tandem train` with the same keys (config.yaml in the run dir).

#include <cstdint>
#include <string>

#include "tandem/core/config.h"
#include "tandem/run/trainer.h"

namespace tandem {

/// Seed 000's model as blocks: `dense_blocks` dense MLP blocks feeding `moe_blocks` MoE blocks,
/// between a token embedding and an output head (Arch::kAmxMoe).
struct HybridModel {
  int64_t dense_blocks = 2;
  int64_t moe_blocks = 4;
  int64_t width = 1024;   ///< d_model
  int64_t hidden = 2048;  ///< the dense blocks' and each expert's hidden size
  int64_t experts = 8;
  int64_t top_k = 2;
  int64_t vocab = 8192;
  int64_t seq_len = 512;
};

/// A configuration that trains `model` with the offload engine (fp32 masters and optimizer state
/// on the CPU, the one weight source; bf16 on a GPU, fp32 on the CPU), every block on the GPU
/// until a policy says otherwise, the dense blocks the ones that may move. The optim keys are the
/// training recipe of the model's size on the generated corpus (models/recipe.h), the warmup for
/// the default train.steps, as `tandem train` would set them.
Config hybrid_config(const HybridModel& model);

/// Every step the same placement: "gpu", "cpu" (every movable block) or one letter per block
/// (embedding, blocks..., head), G or C.
void use_static(Config& cfg, const std::string& blocks);
/// The seed's rule: a block moves to the CPU while the GPU draws more than `gpu_power_w` and the
/// CPU is under `cpu_util_pct`, and comes back below gpu_power_w - 20 W or when the CPU is busy.
void use_threshold(Config& cfg, double gpu_power_w = 200, double cpu_util_pct = 80);
/// The cost model: the fastest placement whose average GPU power stays within `gpu_power_budget_w`
/// (0 = no budget: the fastest), from measured per-block times and energy.
void use_cost_model(Config& cfg, double gpu_power_budget_w = 0);
/// Which blocks may move: "" = every block of the model, else a comma list of block indices.
void set_movable(Config& cfg, const std::string& blocks);

}  // namespace tandem
