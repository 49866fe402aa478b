#pragma once
// The optimizer interface the step loop talks to. The on-device implementation below is
// LibTorch's fused multi-tensor AdamW; the CPU kernels over flat buffers plug in behind the same
// interface.

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/models/block.h"

namespace tandem {

/// AdamW hyper-parameters (lr is passed per step by the schedule).
struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  bool decoupled = true;  ///< false = plain Adam (L2 added to the gradient)
  bool decay_1d = false;  ///< optim.decay_1d: 1-D parameters decay too
};

/// Updates parameters from their .grad.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  /// One update at learning rate `lr`. When `found_inf` (a 0-d float tensor on the
  /// parameters' device) is non-zero, the update is skipped without a host synchronisation.
  virtual void step(double lr, const std::optional<torch::Tensor>& found_inf = std::nullopt) = 0;
  virtual void zero_grad() = 0;
  /// State tensors by name ("<param>.exp_avg", ...), for checkpoints.
  virtual std::vector<NamedTensor> state() = 0;
  /// Restores state written by state() by copying into the tensors state() returns (converting
  /// dtypes, so fp32 and bf16 states interchange); UserError naming the first missing or
  /// mismatched tensor.
  virtual void load_state(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                          const std::string& source);
};

/// AdamW through ATen's fused multi-tensor kernel (CPU and CUDA). Matrices and embeddings get
/// weight decay; 1-D parameters (norm scales) do not.
class FusedAdamW : public Optimizer {
 public:
  FusedAdamW(std::vector<NamedTensor> params, AdamWOptions options);
  void step(double lr, const std::optional<torch::Tensor>& found_inf = std::nullopt) override;
  void zero_grad() override;
  std::vector<NamedTensor> state() override;
  const AdamWOptions& options() const { return options_; }

 private:
  struct Group {
    double weight_decay;
    std::vector<std::string> names;
    std::vector<torch::Tensor> params, exp_avg, exp_avg_sq, steps;
  };
  AdamWOptions options_;
  std::vector<Group> groups_;
};

/// The optimizer a config asks for: LibTorch's fused AdamW for parameters on a GPU, tandem's CPU
/// kernels (CpuOptimizer) for parameters on the CPU (optim.impl=auto), or the one optim.impl names.
/// Configures the CPU kernel level and thread pool from optim.cpu_*. UserError for combinations
/// that cannot run (SGD, Lion or bf16 states with GPU parameters).
std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& o, std::vector<NamedTensor> params,
                                          const torch::Device& device);

}  // namespace tandem
