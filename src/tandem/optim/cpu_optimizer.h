#pragma once
// The Optimizer interface over tandem's CPU update kernels, for parameters that live on the CPU
// (training on the CPU, and the CPU side of the offload engine's tests).

#include <torch/torch.h>

#include "tandem/optim/cpu_update.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

/// Rule, hyper-parameters and state precision of a CpuOptimizer.
struct CpuOptimizerOptions {
  UpdateHyper hyper;  ///< rule and coefficients; lr and step are set per step
  Dtype state_dtype = Dtype::kF32;
  CpuThreadPool* pool = nullptr;  ///< null: the global pool
  bool decay_1d = false;          ///< optim.decay_1d: 1-D parameters decay too
};

/// Updates fp32 CPU parameters in place from their fp32 or bf16 .grad with one cpu_update() call
/// per step over all parameters. Matrices and embeddings get weight decay, 1-D parameters only with
/// decay_1d (as FusedAdamW). State names match FusedAdamW's ("<param>.exp_avg", ...), so checkpoints move
/// between the two; bf16 states are widened or rounded on the way.
class CpuOptimizer : public Optimizer {
 public:
  CpuOptimizer(std::vector<NamedTensor> params, CpuOptimizerOptions options);
  void step(double lr, const std::optional<torch::Tensor>& found_inf = std::nullopt) override;
  void zero_grad() override;
  std::vector<NamedTensor> state() override;
  int64_t steps_taken() const { return static_cast<int64_t>(step_.item<float>()); }

 private:
  struct Entry {
    std::string name;
    torch::Tensor param, m, v;  // (numel) state_dtype; m/v undefined where the rule keeps none
    float weight_decay_scale;
    int64_t index_base;
  };
  CpuOptimizerOptions options_;
  std::vector<Entry> entries_;
  torch::Tensor step_;  // 0-d fp32, shared by every parameter's ".step" entry
};

}  // namespace tandem
