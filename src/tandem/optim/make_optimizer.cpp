#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/cpu_optimizer.h"
#include "tandem/optim/optimizer.h"

namespace tandem {

namespace {

CpuIsa cpu_isa_of(CpuIsaChoice c) {
  switch (c) {
    case CpuIsaChoice::kScalar:
      return CpuIsa::kScalar;
    case CpuIsaChoice::kAvx2:
      return CpuIsa::kAvx2;
    case CpuIsaChoice::kAvx512:
      return CpuIsa::kAvx512;
    case CpuIsaChoice::kAvx512Bf16:
    case CpuIsaChoice::kAuto:
      break;
  }
  return CpuIsa::kAvx512Bf16;
}

UpdateRule rule_of(OptimizerType t) {
  switch (t) {
    case OptimizerType::kAdamW:
      return UpdateRule::kAdamW;
    case OptimizerType::kAdam:
      return UpdateRule::kAdam;
    case OptimizerType::kSgd:
      return UpdateRule::kSgd;
    case OptimizerType::kLion:
      break;
  }
  return UpdateRule::kLion;
}

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimConfig& o, std::vector<NamedTensor> params,
                                          const torch::Device& device) {
  const bool cpu = o.impl == OptimizerImpl::kCpu || (o.impl == OptimizerImpl::kAuto && device.is_cpu());
  if (!cpu) {
    TANDEM_CHECK(o.type == OptimizerType::kAdamW || o.type == OptimizerType::kAdam, "optim.type=", to_string(o.type),
                 " runs on tandem's CPU kernels, and the parameters are on ", device.str(),
                 "; train on the CPU (train.device=cpu) or use optim.type=adamw");
    TANDEM_CHECK(o.state_dtype == StateDtype::kFp32, "optim.state_dtype=", to_string(o.state_dtype),
                 " needs tandem's CPU kernels, and the parameters are on ", device.str(),
                 "; train on the CPU (train.device=cpu) or keep optim.state_dtype=fp32");
    AdamWOptions adam;
    adam.beta1 = o.beta1, adam.beta2 = o.beta2, adam.eps = o.eps;
    adam.weight_decay = o.weight_decay, adam.decoupled = o.type == OptimizerType::kAdamW;
    adam.decay_1d = o.decay_1d;
    return std::make_unique<FusedAdamW>(std::move(params), adam);
  }
  TANDEM_CHECK(device.is_cpu(), "optim.impl=cpu needs the parameters on the CPU, but train.device is ", device.str(),
               "; use train.device=cpu, or optim.impl=auto (the offload engine moves the update to the CPU)");
  if (o.cpu_isa != CpuIsaChoice::kAuto) set_cpu_isa(cpu_isa_of(o.cpu_isa));  // else TANDEM_CPU_ISA, else the best
  active_cpu_isa();  // a bad TANDEM_CPU_ISA fails here, before training starts
  const int threads = resolve_cpu_threads(static_cast<int>(o.cpu_threads));
  CpuThreadPool::configure_global(threads, o.cpu_pin);
  CpuOptimizerOptions c;
  UpdateHyper& h = c.hyper;
  h.rule = rule_of(o.type);
  h.beta1 = o.type == OptimizerType::kSgd ? o.momentum : o.beta1;
  h.beta2 = o.beta2, h.eps = o.eps, h.weight_decay = o.weight_decay;
  h.dampening = o.dampening, h.nesterov = o.nesterov;
  h.rounding = o.state_rounding == StateRounding::kStochastic ? Rounding::kStochastic : Rounding::kNearestEven;
  c.state_dtype = o.state_dtype == StateDtype::kBf16 ? Dtype::kBF16 : Dtype::kF32;
  c.decay_1d = o.decay_1d;
  log::info(strprintf("optimizer: %s on tandem's CPU kernels (%s, %d threads%s), %s states", to_string(o.type),
                      to_string(active_cpu_isa()), threads, o.cpu_pin ? ", pinned" : "", to_string(o.state_dtype)));
  return std::make_unique<CpuOptimizer>(std::move(params), c);
}

}  // namespace tandem
