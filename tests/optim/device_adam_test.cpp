// The device Adam (Note [Device Adam]) against the CPU kernels, bit for bit on the GPU: AdamW and
// Adam, fp32 and bf16 states rounded to nearest and stochastically, fp32, bf16 and fp16 gradients
// (fp16 widened, as the landing buffer widens them for the CPU), bf16, fp32 and fp16 working copies
// or none, a span with its own group and no weight decay; and what it refuses.

#include "tandem/kernels/device_adam.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../test_util.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/optim/device_coeffs.h"

namespace tandem {
namespace {

TEST(DeviceAdam, CpuTensorsAreNotTaken) {
  const auto t = torch::zeros({8});
  EXPECT_FALSE(device_adam_takes(t, t, t, t, t));
  const auto message = test::error_of([&] { device_adam(t, t, t, t, t, DeviceAdamCoeffs{}, 0); });
  EXPECT_NE(message.find("the device Adam takes"), std::string::npos) << message;
}

TEST(DeviceAdam, CoefficientsAreTheCpuKernelsOwn) {
  UpdateHyper h;
  h.lr = 2e-3;
  h.beta1 = 0.8;
  h.weight_decay = 0.1;
  h.step = 4;
  h.grad_scale = 0.25;
  const auto c = device_adam_coeffs(h, 0.5f, nullptr);
  UpdateSpan s;
  s.weight_decay_scale = 0.5f;
  const auto k = detail::make_coeffs(h, s);
  EXPECT_TRUE(c.decoupled);
  EXPECT_EQ(c.neg_step_size, k.neg_step_size);
  EXPECT_EQ(c.inv_sqrt_bc2, k.inv_sqrt_bc2);
  EXPECT_EQ(c.decay, k.decay);
  EXPECT_EQ(c.seed, k.seed);
  EXPECT_FLOAT_EQ(c.decay, static_cast<float>(1.0 - 2e-3 * 0.05));
  h.rule = UpdateRule::kSgd;
  EXPECT_ANY_THROW(device_adam_coeffs(h, 1.0f, nullptr));
}

struct Case {
  UpdateRule rule;
  torch::ScalarType state, grad, out;  // out kFloat64: none
  Rounding rounding;
  bool grouped;
};

std::string name_of(const Case& c) {
  std::ostringstream os;
  os << (c.rule == UpdateRule::kAdamW ? "AdamW" : "Adam") << ", states " << c.state << ", grad " << c.grad
     << ", out " << c.out << (c.rounding == Rounding::kStochastic ? ", stochastic" : ", nearest")
     << (c.grouped ? ", grouped" : "");
  return os.str();
}

void expect_cpu_bits(const Case& k) {
  const c10::Device cuda(c10::kCUDA, 0);
  constexpr int64_t n = 100003;  // odd: every kernel's tail
  constexpr uint64_t index_base = 123457;
  torch::manual_seed(11);
  const auto master0 = torch::randn({n}) * 0.05;
  const auto m0 = (torch::randn({n}) * 1e-3).to(k.state), v0 = (torch::rand({n}) * 1e-5).to(k.state);
  const auto g = (torch::randn({n}) * 1e-2).to(k.grad);
  UpdateHyper h;
  h.rule = k.rule;
  h.lr = 1e-3;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.weight_decay = 0.1;
  h.step = 3;
  h.grad_scale = 0.7;
  h.rounding = k.rounding;
  h.seed = 42;
  GroupHyper group{3e-3, 0.85, 0.99, 1e-6, 0.05, 1};
  const float wd_scale = k.grouped ? 0.0f : 1.0f;

  // The CPU kernels: fp16 gradients land widened to fp32.
  auto master = master0.clone(), m = m0.clone(), v = v0.clone();
  const auto g_cpu = k.grad == torch::kHalf ? g.to(torch::kFloat32) : g;
  auto out16 = torch::zeros({n}, torch::kBFloat16);
  UpdateSpan s;
  s.master = master.data_ptr<float>();
  s.grad = g_cpu.data_ptr();
  s.grad_dtype = g_cpu.scalar_type() == torch::kBFloat16 ? Dtype::kBF16 : Dtype::kF32;
  s.m = m.data_ptr();
  s.v = v.data_ptr();
  s.state_dtype = k.state == torch::kBFloat16 ? Dtype::kBF16 : Dtype::kF32;
  s.bf16_out = k.out == torch::kBFloat16 ? reinterpret_cast<uint16_t*>(out16.data_ptr()) : nullptr;
  s.n = n;
  s.index_base = static_cast<int64_t>(index_base);
  s.weight_decay_scale = wd_scale;
  s.group = k.grouped ? &group : nullptr;
  ASSERT_TRUE(cpu_update({s}, h, nullptr, nullptr).ok());

  const auto d_master = master0.to(cuda), d_m = m0.to(cuda), d_v = v0.to(cuda), d_g = g.to(cuda);
  const auto d_out = k.out == torch::kFloat64 ? torch::Tensor() : torch::zeros({n}, d_g.options().dtype(k.out));
  ASSERT_TRUE(device_adam_takes(d_master, d_g, d_m, d_v, d_out));
  device_adam(d_master, d_g, d_m, d_v, d_out, device_adam_coeffs(h, wd_scale, k.grouped ? &group : nullptr),
              index_base);
  EXPECT_TRUE(torch::equal(d_master.cpu(), master)) << name_of(k) << ": master";
  EXPECT_TRUE(torch::equal(d_m.cpu(), m)) << name_of(k) << ": m";
  EXPECT_TRUE(torch::equal(d_v.cpu(), v)) << name_of(k) << ": v";
  if (k.out != torch::kFloat64) {
    const auto want = k.out == torch::kBFloat16 ? out16 : master.to(k.out);
    EXPECT_TRUE(torch::equal(d_out.cpu(), want)) << name_of(k) << ": the working copy";
  }
  EXPECT_FALSE(torch::equal(master, master0)) << name_of(k) << ": nothing updated";
}

TEST(DeviceAdamGpu, GivesTheCpuKernelsBits) {
  if (!torch::cuda::is_available() || !device_adam_takes(torch::zeros({1}, torch::kCUDA), torch::zeros({1}, torch::kCUDA),
                                                          torch::zeros({1}, torch::kCUDA),
                                                          torch::zeros({1}, torch::kCUDA), {}))
    GTEST_SKIP() << "no CUDA device or no CUDA kernels in this build";
  for (const auto rule : {UpdateRule::kAdamW, UpdateRule::kAdam})
    for (const auto state : {torch::kFloat32, torch::kBFloat16})
      for (const auto grad : {torch::kFloat32, torch::kBFloat16, torch::kHalf}) {
        const auto out = grad == torch::kFloat32 ? torch::kFloat32 : grad;
        expect_cpu_bits({rule, state, grad, out, Rounding::kNearestEven, false});
        if (state == torch::kBFloat16) expect_cpu_bits({rule, state, grad, out, Rounding::kStochastic, false});
      }
  expect_cpu_bits({UpdateRule::kAdamW, torch::kBFloat16, torch::kBFloat16, torch::kFloat64, Rounding::kStochastic, true});
  expect_cpu_bits({UpdateRule::kAdam, torch::kFloat32, torch::kBFloat16, torch::kBFloat16, Rounding::kNearestEven, true});
  // Refused: mixed state dtypes, an fp16 master, a view that is not contiguous.
  const auto z = [](torch::ScalarType t) { return torch::zeros({8}, torch::TensorOptions().dtype(t).device(torch::kCUDA)); };
  EXPECT_FALSE(device_adam_takes(z(torch::kFloat32), z(torch::kBFloat16), z(torch::kBFloat16), z(torch::kFloat32), {}));
  EXPECT_FALSE(device_adam_takes(z(torch::kHalf), z(torch::kHalf), z(torch::kFloat32), z(torch::kFloat32), {}));
  EXPECT_FALSE(device_adam_takes(torch::zeros({16}, torch::kCUDA).slice(0, 0, 16, 2), z(torch::kFloat32),
                                 z(torch::kFloat32), z(torch::kFloat32), {}));
}

}  // namespace
}  // namespace tandem
