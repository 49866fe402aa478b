#pragma once
// The update split of the offload engine: which Blocks keep fp32 master weights and optimizer
// states on the GPU (a fused AdamW on the compute stream) and which the CPU updates while the
// backward pass goes on. A small event simulation of one steady-state step predicts the step time
// of a split; the solver picks the fastest split that fits the GPU memory budget. No LibTorch.
// See Note [Update split].

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

/// Costs of one Block (embedding, a decoder layer or the head) on the compute stream.
struct BlockTiming {
  int64_t params = 0;  ///< parameters the Block owns (0 for a tied head)
  double fwd_s = 0;    ///< forward time
  double bwd_s = 0;    ///< backward time, recomputation included
};

/// Per-parameter costs of the two update paths and of the transfers between GPU and CPU.
struct SplitCosts {
  double cpu_update_s_per_param = 0;  ///< the CPU optimizer step (the updater is one serial resource)
  double gpu_update_s_per_param = 0;  ///< fused AdamW on the compute stream
  double d2h_s_per_param = 0;         ///< gradient download (one serial stream)
  double h2d_s_per_param = 0;         ///< new bf16 weights upload (one serial stream)
  /// Extra GPU bytes per parameter of a GPU-updated Block, e.g. 12 for an fp32 master and two
  /// fp32 Adam states.
  int64_t gpu_bytes_per_param_resident = 0;
  /// When the CPU updates may start (the engine's mode, Note [Speculative clipping]):
  /// kAsGradientsArrive: each Block as its gradient lands (speculative updates, or no clipping);
  /// kAfterBackward: once the whole backward is done and the global norm known, in forward order;
  /// kDelayed: the next forward does not wait (offload.delayed_update): a step is as long as its
  /// slowest resource, compute, D2H, CPU or H2D.
  enum class CpuStart { kAsGradientsArrive, kAfterBackward, kDelayed } cpu_start = CpuStart::kAsGradientsArrive;
};

/// One predicted steady-state step of a split. Times are in seconds.
struct StepPrediction {
  double step_s = 0;         ///< backward start to the end of the next forward: one period
  double gpu_idle_s = 0;     ///< compute stream waiting on uploads during the forward
  double compute_s = 0;      ///< forward + backward + GPU updates; step_s = compute_s + gpu_idle_s up to rounding
  double gpu_update_s = 0;   ///< GPU updates alone (on the compute stream)
  double cpu_update_s = 0;   ///< busy time of the CPU updater
  double last_upload_s = 0;  ///< end of the last upload, from the backward start (0: no CPU Blocks)
};

/// Simulates one steady-state step with the first `gpu_blocks` Blocks of `blocks` (forward order)
/// updated on the GPU and the others on the CPU. O(blocks). UserError for negative or non-finite
/// timings or costs, no Blocks, or gpu_blocks outside [0, blocks.size()].
StepPrediction predict_step(const std::vector<BlockTiming>& blocks, const SplitCosts& costs, int64_t gpu_blocks);

/// The chosen split and what the model predicted for it.
struct SplitDecision {
  int64_t gpu_blocks = 0;  ///< the first gpu_blocks Blocks (forward order) are updated on the GPU
  double k = 0;            ///< gpu_blocks / number of Blocks
  double alpha = 0;        ///< gpu_update_s_per_param / cpu_update_s_per_param
  double predicted_step_s = 0;
  /// Entry g: predicted step time with g GPU Blocks, for every g whose resident bytes fit the
  /// budget (g = 0 .. size() - 1; the fitting counts are always such a range).
  std::vector<double> predicted_by_gpu_blocks;
  int64_t gpu_resident_bytes = 0;  ///< extra GPU bytes of the chosen split
  std::string reason;              ///< one line for the log: the choice, its prediction and its limit
};

/// Picks the number of GPU-updated Blocks (a prefix in forward order). Without `fixed_k`: the
/// fastest predicted split whose resident bytes (params of the first g Blocks x
/// gpu_bytes_per_param_resident) fit `gpu_bytes_budget`; on a tie the fewer GPU Blocks. With
/// `fixed_k` in [0, 1]: round(k x Blocks), halves up, clamped down to what fits the budget.
/// Either choice is then raised to `min_gpu_blocks` (clamped to what fits): a floor set by other
/// tiers, e.g. host memory that cannot hold every Block's states.
/// UserError for bad timings or costs, cpu_update_s_per_param == 0, a negative budget or a
/// fixed_k outside [0, 1].
SplitDecision solve_update_split(const std::vector<BlockTiming>& blocks, const SplitCosts& costs,
                                 int64_t gpu_bytes_budget, std::optional<double> fixed_k = std::nullopt,
                                 int64_t min_gpu_blocks = 0);

}  // namespace tandem
