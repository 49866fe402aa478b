// make_optimizer (optim/optimizer.h): which implementation a config and a device give, the config's
// rule and hyper-parameters as the kernels apply them (against a double-precision reference of each
// rule), state precision and rounding, the CPU kernel level and thread pool, and the refusals.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "../test_util.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/cpu_optimizer.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/optim/optimizer.h"

namespace tandem {
namespace {

using test::error_of;

// Puts the CPU kernel level and the global pool back as they were.
class KernelSettings {
 public:
  KernelSettings()
      : isa_(active_cpu_isa()), threads_(CpuThreadPool::global().size()), pin_(CpuThreadPool::global().pinned()) {}
  ~KernelSettings() {
    set_cpu_isa(isa_);
    CpuThreadPool::configure_global(threads_, pin_);
  }

 private:
  CpuIsa isa_;
  int threads_;
  bool pin_;
};

std::vector<NamedTensor> fresh_params(uint64_t seed) {
  torch::manual_seed(seed);
  return {{"w", torch::randn({37, 7}).requires_grad_(true)}, {"b", torch::randn({17}).requires_grad_(true)}};
}

// Gradients of magnitude 0.5 .. 1.5 and random sign: Lion's interpolation then takes the sign of
// the newest gradient (|0.9 m| < |0.1 g| over three steps at beta2 = 0.99) in both precisions.
torch::Tensor gradient_like(const torch::Tensor& p) {
  return torch::randn_like(p).sign() * (0.5 + torch::rand_like(p));
}

// One parameter's state in the double-precision reference.
struct RefState {
  torch::Tensor p, m, v;
};

// One update of `o`'s rule at learning rate lr, step t (1-based), in double.
void reference_step(const OptimConfig& o, double lr, int64_t t, RefState& s, const torch::Tensor& g_in, bool decays) {
  const double wd = decays ? o.weight_decay : 0.0;
  auto g = g_in.to(torch::kFloat64);
  switch (o.type) {
    case OptimizerType::kAdamW:
    case OptimizerType::kAdam: {
      if (o.type == OptimizerType::kAdam)
        g = g + wd * s.p;
      else
        s.p = s.p * (1 - lr * wd);
      s.m = o.beta1 * s.m + (1 - o.beta1) * g;
      s.v = o.beta2 * s.v + (1 - o.beta2) * g * g;
      const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
      s.p = s.p - lr * (s.m / bc1) / (torch::sqrt(s.v) / std::sqrt(bc2) + o.eps);
      break;
    }
    case OptimizerType::kSgd: {
      g = g + wd * s.p;
      if (o.momentum != 0) {
        s.m = t == 1 ? g : o.momentum * s.m + (1 - o.dampening) * g;
        g = o.nesterov ? g + o.momentum * s.m : s.m;
      }
      s.p = s.p - lr * g;
      break;
    }
    case OptimizerType::kLion: {
      const auto c = o.beta1 * s.m + (1 - o.beta1) * g;
      s.p = s.p * (1 - lr * wd) - lr * c.sign();
      s.m = o.beta2 * s.m + (1 - o.beta2) * g;
      break;
    }
  }
}

bool is_cpu_kernels(Optimizer* o) { return dynamic_cast<CpuOptimizer*>(o) != nullptr; }
bool is_fused(Optimizer* o) { return dynamic_cast<FusedAdamW*>(o) != nullptr; }

TEST(MakeOptimizer, TheDeviceAndOptimImplChooseTheImplementation) {
  KernelSettings restore;
  const torch::Device cpu(torch::kCPU), gpu("cuda:0");  // only the device's kind is read
  OptimConfig o;
  o.impl = OptimizerImpl::kAuto;
  EXPECT_TRUE(is_cpu_kernels(make_optimizer(o, fresh_params(1), cpu).get())) << "auto, CPU parameters";
  EXPECT_TRUE(is_fused(make_optimizer(o, fresh_params(1), gpu).get())) << "auto, GPU parameters";
  o.impl = OptimizerImpl::kFused;
  EXPECT_TRUE(is_fused(make_optimizer(o, fresh_params(1), cpu).get())) << "fused, CPU parameters";
  o.impl = OptimizerImpl::kCpu;
  EXPECT_TRUE(is_cpu_kernels(make_optimizer(o, fresh_params(1), cpu).get())) << "cpu, CPU parameters";
}

TEST(MakeOptimizer, TheFusedAdamWTakesTheConfigsHyperParameters) {
  OptimConfig o;
  o.impl = OptimizerImpl::kFused;
  o.beta1 = 0.8, o.beta2 = 0.97, o.eps = 1e-6, o.weight_decay = 0.03, o.decay_1d = true;
  for (const OptimizerType type : {OptimizerType::kAdamW, OptimizerType::kAdam}) {
    o.type = type;
    auto opt = make_optimizer(o, fresh_params(2), torch::kCPU);
    const auto* fused = dynamic_cast<FusedAdamW*>(opt.get());
    ASSERT_NE(fused, nullptr) << to_string(type);
    const AdamWOptions& a = fused->options();
    EXPECT_EQ(a.beta1, 0.8);
    EXPECT_EQ(a.beta2, 0.97);
    EXPECT_EQ(a.eps, 1e-6);
    EXPECT_EQ(a.weight_decay, 0.03);
    EXPECT_TRUE(a.decay_1d);
    EXPECT_EQ(a.decoupled, type == OptimizerType::kAdamW) << "adam is L2 decay, adamw decoupled";
  }
  // GPU parameters take the same path under impl=auto.
  o.impl = OptimizerImpl::kAuto;
  o.type = OptimizerType::kAdam;
  auto gpu = make_optimizer(o, fresh_params(2), torch::Device("cuda:0"));
  ASSERT_TRUE(is_fused(gpu.get()));
  EXPECT_FALSE(dynamic_cast<FusedAdamW*>(gpu.get())->options().decoupled);
}

struct RuleCase {
  const char* what;
  OptimConfig o;
};

std::vector<RuleCase> rule_cases() {
  std::vector<RuleCase> out;
  OptimConfig base;
  base.impl = OptimizerImpl::kCpu;
  base.cpu_isa = CpuIsaChoice::kScalar;
  base.cpu_threads = 2;
  base.beta1 = 0.85, base.beta2 = 0.99, base.eps = 1e-7, base.weight_decay = 0.2;
  OptimConfig adamw = base;
  adamw.type = OptimizerType::kAdamW;
  out.push_back({"adamw", adamw});
  adamw.decay_1d = true;
  out.push_back({"adamw, decay_1d", adamw});
  OptimConfig adam = base;
  adam.type = OptimizerType::kAdam;
  out.push_back({"adam", adam});
  OptimConfig sgd = base;
  sgd.type = OptimizerType::kSgd;
  sgd.momentum = 0.5, sgd.dampening = 0.25;  // not beta1: the momentum is optim.momentum
  out.push_back({"sgd, momentum and dampening", sgd});
  sgd.dampening = 0, sgd.nesterov = true;
  out.push_back({"sgd, nesterov", sgd});
  sgd.nesterov = false, sgd.momentum = 0;
  out.push_back({"sgd, no momentum", sgd});
  OptimConfig lion = base;
  lion.type = OptimizerType::kLion;
  lion.beta1 = 0.9;
  out.push_back({"lion", lion});
  return out;
}

TEST(MakeOptimizer, TheCpuKernelsFollowTheConfigsRuleAndHyperParameters) {
  KernelSettings restore;
  const double lr = 0.01;
  for (const RuleCase& c : rule_cases()) {
    SCOPED_TRACE(c.what);
    auto params = fresh_params(3);
    std::map<std::string, RefState> ref;
    for (auto& [n, p] : params) {
      const auto d = p.detach().to(torch::kFloat64);
      ref[n] = {d.clone(), torch::zeros_like(d), torch::zeros_like(d)};
    }
    auto opt = make_optimizer(c.o, params, torch::kCPU);
    ASSERT_TRUE(is_cpu_kernels(opt.get()));
    for (int64_t t = 1; t <= 3; ++t) {
      for (auto& [n, p] : params) {
        const auto g = gradient_like(p);
        p.mutable_grad() = g;
        reference_step(c.o, lr, t, ref[n], g, p.dim() >= 2 || c.o.decay_1d);
      }
      opt->step(lr);
    }
    // fp32 rounding of a few operations per step over three steps; updates up to a few lr. A wrong
    // mapping of the config moves the result by a sizeable fraction of lr.
    const double rtol = 3 * 8 * std::numeric_limits<float>::epsilon();
    for (auto& [n, p] : params) EXPECT_TRUE(test::AllClose(p, ref[n].p, rtol, rtol * 10 * lr)) << n;
  }
}

TEST(MakeOptimizer, SgdKeepsAMomentumBufferOnlyWithMomentum) {
  KernelSettings restore;
  OptimConfig o;
  o.impl = OptimizerImpl::kCpu;
  o.type = OptimizerType::kSgd;
  o.beta1 = 0.9;  // Adam's beta1 must not stand in for the momentum
  o.momentum = 0;
  std::set<std::string> names;
  for (auto& [n, t] : make_optimizer(o, fresh_params(4), torch::kCPU)->state()) names.insert(n);
  EXPECT_EQ(names, (std::set<std::string>{"w.step", "b.step"}));
  o.momentum = 0.9;
  names.clear();
  for (auto& [n, t] : make_optimizer(o, fresh_params(4), torch::kCPU)->state()) names.insert(n);
  EXPECT_EQ(names, (std::set<std::string>{"w.momentum_buffer", "w.step", "b.momentum_buffer", "b.step"}));
}

// The first moment after one step is (1 - beta1) g in fp32; bf16 states hold it rounded to nearest
// even, or stochastically to one of its two bf16 neighbours.
TEST(MakeOptimizer, StateDtypeAndRoundingReachTheKernels) {
  KernelSettings restore;
  OptimConfig o;
  o.impl = OptimizerImpl::kCpu;
  o.type = OptimizerType::kAdamW;
  std::map<std::string, torch::Tensor> m32;
  {
    auto params = fresh_params(5);
    auto opt = make_optimizer(o, params, torch::kCPU);
    torch::manual_seed(50);
    for (auto& [n, p] : params) p.mutable_grad() = gradient_like(p) * 1e-2;
    opt->step(1e-3);
    for (auto& [n, t] : opt->state()) {
      if (n.find(".exp_avg") != std::string::npos && n.find("_sq") == std::string::npos) m32[n] = t.clone();
      if (n.find(".step") == std::string::npos) {
        EXPECT_EQ(t.scalar_type(), torch::kFloat32) << n;
      }
    }
  }
  ASSERT_EQ(m32.size(), 2u);
  o.state_dtype = StateDtype::kBf16;
  for (const StateRounding rounding : {StateRounding::kNearest, StateRounding::kStochastic}) {
    o.state_rounding = rounding;
    auto params = fresh_params(5);
    auto opt = make_optimizer(o, params, torch::kCPU);
    torch::manual_seed(50);
    for (auto& [n, p] : params) p.mutable_grad() = gradient_like(p) * 1e-2;
    opt->step(1e-3);
    int64_t not_nearest = 0;
    for (auto& [n, t] : opt->state()) {
      if (m32.count(n) == 0) continue;
      ASSERT_EQ(t.scalar_type(), torch::kBFloat16) << n;
      const auto nearest = m32[n].to(torch::kBFloat16);
      const auto bits = t.contiguous().view(torch::kInt16).to(torch::kInt32) & 0xFFFF;
      const auto down = m32[n].contiguous().view(torch::kInt32).bitwise_right_shift(16) & 0xFFFF;  // toward zero
      const auto one_of_two = torch::logical_or(bits == down, bits == down + 1);
      EXPECT_TRUE(one_of_two.all().item<bool>()) << n << ": a bf16 state is not a neighbour of the fp32 value";
      not_nearest += t.ne(nearest).sum().item<int64_t>();
    }
    if (rounding == StateRounding::kNearest)
      EXPECT_EQ(not_nearest, 0) << "optim.state_rounding=nearest did not round to nearest";
    else
      EXPECT_GT(not_nearest, 0) << "optim.state_rounding=stochastic rounded every state to nearest";
  }
}

TEST(MakeOptimizer, TheKernelLevelAndThreadsComeFromTheConfig) {
  KernelSettings restore;
  OptimConfig o;
  o.impl = OptimizerImpl::kCpu;
  o.cpu_isa = CpuIsaChoice::kScalar;
  o.cpu_threads = 3;
  o.cpu_pin = false;
  make_optimizer(o, fresh_params(6), torch::kCPU);
  EXPECT_EQ(active_cpu_isa(), CpuIsa::kScalar);
  EXPECT_EQ(CpuThreadPool::global().size(), 3);
  EXPECT_FALSE(CpuThreadPool::global().pinned());
  // auto keeps the level already chosen (TANDEM_CPU_ISA or an earlier choice).
  o.cpu_isa = CpuIsaChoice::kAuto;
  o.cpu_threads = 2;
  make_optimizer(o, fresh_params(6), torch::kCPU);
  EXPECT_EQ(active_cpu_isa(), CpuIsa::kScalar);
  EXPECT_EQ(CpuThreadPool::global().size(), 2);
  // A level this CPU lacks is refused before training starts.
  const std::pair<CpuIsaChoice, CpuIsa> levels[] = {{CpuIsaChoice::kAvx2, CpuIsa::kAvx2},
                                                    {CpuIsaChoice::kAvx512, CpuIsa::kAvx512},
                                                    {CpuIsaChoice::kAvx512Bf16, CpuIsa::kAvx512Bf16}};
  for (const auto& [choice, isa] : levels) {
    o.cpu_isa = choice;
    const bool runs = error_of([&] { set_cpu_isa(isa); }).empty();
    set_cpu_isa(CpuIsa::kScalar);
    const std::string msg = error_of([&] { make_optimizer(o, fresh_params(6), torch::kCPU); });
    if (runs) {
      EXPECT_EQ(msg, "") << to_string(isa);
      EXPECT_EQ(active_cpu_isa(), isa);
    } else {
      EXPECT_NE(msg.find(std::string("this CPU cannot run the ") + to_string(isa) + " kernels"), std::string::npos)
          << msg;
    }
  }
}

TEST(MakeOptimizer, CombinationsThatCannotRunAreRefused) {
  KernelSettings restore;
  OptimConfig o;
  o.impl = OptimizerImpl::kCpu;
  std::string msg = error_of([&] { make_optimizer(o, fresh_params(7), torch::Device("cuda:0")); });
  EXPECT_NE(msg.find("optim.impl=cpu needs the parameters on the CPU, but train.device is cuda:0"), std::string::npos)
      << msg;
  o.impl = OptimizerImpl::kFused;
  o.type = OptimizerType::kSgd;
  msg = error_of([&] { make_optimizer(o, fresh_params(7), torch::kCPU); });
  EXPECT_NE(msg.find("optim.type=sgd runs on tandem's CPU kernels"), std::string::npos) << msg;
  o.type = OptimizerType::kAdam;
  o.state_dtype = StateDtype::kInt8;
  msg = error_of([&] { make_optimizer(o, fresh_params(7), torch::kCPU); });
  EXPECT_NE(msg.find("optim.state_dtype=int8 needs tandem's CPU kernels"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tandem
