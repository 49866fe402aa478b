#include "tandem/api/hybrid.h"

#include "tandem/models/recipe.h"

namespace tandem {

Config hybrid_config(const HybridModel& m) {
  Config cfg;
  cfg.model.preset = "amx-moe";
  cfg.model.n_layer = m.dense_blocks + m.moe_blocks;
  cfg.model.n_dense = m.dense_blocks;
  cfg.model.d_model = m.width;
  cfg.model.d_ff = m.hidden;
  cfg.model.n_experts = m.experts;
  cfg.model.top_k = m.top_k;
  cfg.model.vocab_size = m.vocab;
  cfg.model.max_seq_len = m.seq_len;
  cfg.offload.optimizer = OffloadTarget::kCpu;
  cfg.offload.host_ring = 0;  // per-block host buffers: a block runs on the CPU from them
  cfg.train.precision = resolve_device(cfg.train.device).is_cuda() ? Precision::kBf16 : Precision::kFp32;
  cfg.placement.policy = PlacementPolicyKind::kStatic;
  cfg.placement.blocks = StaticBlocks{};
  MovableBlocks movable{MovableBlocks::Kind::kNone, {}};
  for (int64_t i = 1; i <= m.dense_blocks; ++i) movable.blocks.push_back(i);
  if (!movable.blocks.empty()) movable.kind = MovableBlocks::Kind::kGiven;
  cfg.placement.movable = movable;
  apply_preset_recipe(cfg);
  return cfg;
}

void use_static(Config& cfg, const std::string& blocks) {
  cfg.placement.policy = PlacementPolicyKind::kStatic;
  cfg.placement.blocks = StaticBlocks::parse(blocks);
}

void use_threshold(Config& cfg, double gpu_power_w, double cpu_util_pct) {
  cfg.placement.policy = PlacementPolicyKind::kThreshold;
  cfg.placement.threshold_w = gpu_power_w;
  cfg.placement.threshold_cpu_pct = cpu_util_pct;
}

void use_cost_model(Config& cfg, double gpu_power_budget_w) {
  cfg.placement.policy = PlacementPolicyKind::kCost;
  cfg.placement.objective = PlacementObjective::kThroughput;
  cfg.placement.gpu_power_budget_w = gpu_power_budget_w;
}

void set_movable(Config& cfg, const std::string& blocks) { cfg.placement.movable = MovableBlocks::parse(blocks); }

}  // namespace tandem
