// Activation offload (Note [Activation offload]): what autograd saves inside the offloaded decoder
// layers goes through tandem's engine's hooks to the host and back, giving the gradients of
// keeping it; parameters and small tensors stay; the refusals of bad settings. On the CPU the
// hooks copy CPU tensors (host_tensors), so the path runs here; the GPU test runs it on CUDA.

#include "tandem/models/activation_offload.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "../test_util.h"
#include "tandem/core/device.h"
#include "tandem/memory/estimate.h"
#include "tandem/models/autocast.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"
#include "tandem/run/run_setup.h"

namespace tandem {
namespace {

using test::error_of;

// A preset's family (tied embeddings for tiny, not for 13B) at another size, a 96-token vocabulary.
struct Shape {
  int64_t layers, d_model, heads, kv_heads, d_ff, max_seq_len;
};
ModelSpec shaped(const char* preset, const Shape& sh) {
  ModelSpec s = preset_spec(preset);
  s.n_layer = sh.layers;
  s.d_model = sh.d_model;
  s.n_head = sh.heads;
  s.n_kv_head = sh.kv_heads;
  s.d_ff = sh.d_ff;
  s.vocab_size = 96;
  s.max_seq_len = sh.max_seq_len;
  return s;
}

ModelSpec small_spec() { return shaped("tiny", {3, 64, 4, 2, 160, 64}); }

std::vector<bool> every_layer(const Model& m) {
  std::vector<bool> flags;
  for (const auto& b : m.blocks()) flags.push_back(b->kind() == BlockKind::kLayer);
  return flags;
}

// Loss and the gradients of every parameter after one forward and backward.
std::pair<torch::Tensor, std::vector<torch::Tensor>> loss_and_grads(Model& m, const torch::Tensor& tokens,
                                                                    const torch::Tensor& targets) {
  m.zero_grad();
  const auto loss = m.loss(m.forward(tokens), targets);
  loss.backward();
  std::vector<torch::Tensor> grads;
  for (auto& [name, p] : m.hf_parameters()) grads.push_back(p.grad().clone());
  return {loss.detach(), grads};
}

TEST(ActivationOffload, AskingForItInstallsTandemsEngineInACppProgram) {
  EXPECT_TRUE(use_tandem_autograd_engine());
  EXPECT_TRUE(use_tandem_autograd_engine());  // a second call keeps it
}

TEST(ActivationOffload, GradientsEqualKeepingTheActivations) {
  const ModelSpec s = small_spec();
  for (const bool checkpointing : {false, true}) {
    torch::manual_seed(5);
    Model kept(s, false);
    torch::manual_seed(5);
    Model offloaded(s, checkpointing);  // offloaded layers are never recomputed
    ActivationOffload::Options o;
    o.min_bytes = 1024;
    o.host_tensors = true;
    auto offload = std::make_shared<ActivationOffload>(o);
    offloaded.set_activation_offload(offload, every_layer(offloaded));
    kept.train();
    offloaded.train();
    const auto tokens = torch::randint(0, s.vocab_size, {2, 33}, torch::kInt64);
    const auto targets = torch::randint(0, s.vocab_size, {2, 33}, torch::kInt64);
    // Two steps: the first outside the host arena's slab, the second in it (Note [Activation host arena]).
    for (int step = 0; step < 2; ++step) {
      const auto [la, ga] = loss_and_grads(kept, tokens, targets);
      const auto [lb, gb] = loss_and_grads(offloaded, tokens, targets);
      EXPECT_GT(offload->tensors(), 3 * 4) << "the layers' saved tensors did not go through the hooks";
      EXPECT_GT(offload->bytes(), 3 * 2 * 33 * s.d_model * 4);
      EXPECT_TRUE(torch::equal(la, lb)) << la.item<double>() << " against " << lb.item<double>();
      ASSERT_EQ(ga.size(), gb.size());
      for (size_t i = 0; i < ga.size(); ++i) EXPECT_TRUE(torch::equal(ga[i], gb[i])) << "parameter " << i;
    }
    EXPECT_GT(offload->arena().capacity(), 0);
    EXPECT_LT(offload->arena().fallback_bytes(), offload->bytes()) << "the second step did not use the slab";
    EXPECT_EQ(offload->arena().live(), 0) << "saved tensors outlived their backward";
  }
}

// The plan's host row for an offloaded layer (activation_cost without checkpointing) is what the
// hooks take from one layer: a 13B layer's proportions (multi-head attention, SwiGLU of 2.7 d).
TEST(ActivationOffload, ThePlansEstimateIsWhatALayerSaves) {
  const ModelSpec s = shaped("13B", {1, 640, 5, 5, 1728, 64});
  torch::manual_seed(4);
  Model m(s, false);
  ActivationOffload::Options o;
  o.min_bytes = 0;
  o.host_tensors = true;
  o.log = true;
  auto offload = std::make_shared<ActivationOffload>(o);
  m.set_activation_offload(offload, every_layer(m));
  m.train();
  const int64_t B = 2, T = 64;
  const auto tokens = torch::randint(0, s.vocab_size, {B, T}, torch::kInt64);
  {
    const AutocastGuard ac(torch::kCPU, Precision::kBf16);
    m.loss(m.forward(tokens), tokens).backward();
  }
  const int64_t estimate = activation_cost(s, B, T, Precision::kBf16, false).kept_per_layer;
  std::string log;
  for (const auto& l : offload->saved_log()) log += "  " + l + "\n";
  EXPECT_NEAR(double(offload->bytes()), double(estimate), 0.03 * double(estimate))
      << "per token: " << offload->bytes() / (B * T) << " bytes saved, " << estimate / (B * T) << " estimated\n"
      << log;
}

TEST(ActivationOffload, NothingIsTakenOutsideTheOffloadedLayersOrWithoutGradients) {
  const ModelSpec s = small_spec();
  torch::manual_seed(2);
  Model m(s, false);
  ActivationOffload::Options o;
  o.min_bytes = 0;
  o.host_tensors = true;
  auto offload = std::make_shared<ActivationOffload>(o);
  std::vector<bool> flags(m.blocks().size(), false);  // no layer flagged: set_activation_offload keeps none
  m.set_activation_offload(offload, flags);
  EXPECT_EQ(m.activation_offload(), nullptr);
  m.train();
  const auto tokens = torch::randint(0, s.vocab_size, {1, 9}, torch::kInt64);
  m.loss(m.forward(tokens), tokens).backward();
  flags[1] = true;  // layer.0
  m.set_activation_offload(offload, flags);
  {
    const torch::NoGradGuard no_grad;  // evaluation: nothing saved, nothing copied
    m.forward(tokens);
  }
  EXPECT_EQ(offload->tensors(), 0);
  m.loss(m.forward(tokens), tokens).backward();
  EXPECT_GT(offload->tensors(), 0);
}

TEST(ActivationOffload, ParametersTheirCastsAndSmallTensorsStayWhereTheyAre) {
  ActivationOffload::Options o;
  o.min_bytes = 4096;
  o.host_tensors = true;
  const ActivationOffload offload(o);
  const auto w = torch::randn({64, 64}).requires_grad_(true);  // a parameter
  EXPECT_FALSE(offload.takes(w));
  const auto big = torch::randn({64, 64}) * w;  // an activation
  EXPECT_TRUE(offload.takes(big));
  EXPECT_FALSE(offload.takes(torch::randn({8, 8}) * 2)) << "256 bytes under min_bytes";
  EXPECT_FALSE(offload.takes(torch::randint(0, 9, {64, 64}, torch::kInt64))) << "not floating point";
  EXPECT_FALSE(offload.takes(w.to(torch::kBFloat16))) << "a parameter's autocast copy";
  EXPECT_FALSE(offload.takes(w.to(torch::kBFloat16).t())) << "its transpose, as a matmul saves it";
  EXPECT_FALSE(offload.takes(w.t().to(torch::kBFloat16))) << "the cast of its transpose";
  EXPECT_TRUE(offload.takes(big.t())) << "an activation's transpose";
  EXPECT_FALSE(ActivationOffload().takes(big)) << "without host_tensors only CUDA tensors go";
}

TEST(ActivationOffload, RefusedOnTheCpuAndPastTheModelsLayers) {
  const ModelSpec s = small_spec();
  Model m(s, false);
  EXPECT_NO_THROW(offload_activations(m, 0, torch::kCPU));
  const std::string cpu = error_of([&] { offload_activations(m, 2, torch::kCPU); });
  EXPECT_NE(cpu.find("set model.activation_offload=0"), std::string::npos) << cpu;
  const std::string past = error_of([&] { offload_activations(m, 4, c10::Device(torch::kCUDA, 0)); });
  EXPECT_NE(past.find("has 3 decoder layers"), std::string::npos) << past;
  offload_activations(m, 2, c10::Device(torch::kCUDA, 0));  // only flags: nothing runs on the device here
  ASSERT_NE(m.activation_offload(), nullptr);
}

// Three steps of a 4-layer model on CUDA, kept or with every layer offloaded: the losses, the
// summed gradients, the device's peak over what it held before a step, and what the forward left on
// the device once its copies had ended (the largest of the steps).
struct GpuRun {
  torch::Tensor loss;
  std::vector<torch::Tensor> grads;
  int64_t peak = 0, after_forward = 0;
};

GpuRun run_on_gpu(bool offloaded) {
  const ModelSpec s = shaped("tiny", {4, 512, 8, 4, 1408, 1024});
  const c10::Device cuda(torch::kCUDA, 0);
  torch::manual_seed(9);
  const auto tokens =
      torch::randint(0, s.vocab_size, {4, 1024}, torch::TensorOptions().dtype(torch::kInt64).device(cuda));
  Model m(s, false);
  m.to(cuda, torch::kBFloat16);
  m.train();
  if (offloaded) offload_activations(m, -1, cuda);
  GpuRun r;
  // The first offloaded step outside the host arena's slab, the others in it, each overwriting the
  // step before once its copies back have ended.
  for (int step = 0; step < 3; ++step) {
    accelerator()->synchronize(0);
    accelerator()->reset_peak_memory(0);
    const int64_t before = accelerator()->memory_stats(0).allocated;
    {
      const AutocastGuard ac(torch::kCUDA, Precision::kBf16);
      r.loss = m.loss(m.forward(tokens), tokens);
    }
    accelerator()->synchronize(0);
    torch::empty({1}, torch::TensorOptions().device(cuda));  // the allocator frees blocks whose copies ended
    r.after_forward = std::max(r.after_forward, accelerator()->memory_stats(0).allocated - before);
    r.loss.backward();
    accelerator()->synchronize(0);
    r.peak = std::max(r.peak, accelerator()->memory_stats(0).peak_allocated - before);
  }
  r.loss = r.loss.cpu();
  for (auto& [name, p] : m.hf_parameters()) r.grads.push_back(p.grad().cpu());
  if (offloaded) {
    const ActivationOffload& o = *m.activation_offload();
    EXPECT_GT(o.bytes(), int64_t{3} * 4 * 4 * 1024 * 512 * 2 * 4);
    EXPECT_GE(o.arena().capacity(), o.bytes() / 3) << "the slab holds a step";
    EXPECT_LE(o.arena().fallback_bytes(), o.bytes() / 3) << "steps after the first left the slab";
    // Note [Activation prefetch]: every offloaded layer's tensors are copied back ahead of their
    // backward, the last layer's from the forward's end.
    EXPECT_EQ(o.fetched_ahead(), o.tensors());
  }
  return r;
}

TEST(ActivationOffloadGpu, GradientsEqualKeepingTheActivations) {
  if (!torch::cuda::is_available() || accelerator() == nullptr) GTEST_SKIP() << "no CUDA device";
  // Deterministic kernels, so that both runs sum in one order: the fused attention backwards add
  // dQ with atomics whatever the flag says (two kept runs differed in the last bits of the layers'
  // and the embedding's gradients on an H200), so NumericsGuard takes the reference attention.
  TrainConfig train;
  train.deterministic = true;
  const NumericsGuard numerics(train, c10::Device(torch::kCUDA, 0));
  const GpuRun kept = run_on_gpu(false), offloaded = run_on_gpu(true);
  EXPECT_TRUE(torch::equal(kept.loss, offloaded.loss));
  ASSERT_EQ(kept.grads.size(), offloaded.grads.size());
  for (size_t i = 0; i < kept.grads.size(); ++i)
    EXPECT_TRUE(torch::equal(kept.grads[i], offloaded.grads[i])) << "parameter " << i;
}

// Once its copies out have ended, an offloaded layer's saved tensors leave the device: after the
// forward only the last layer's copies back (Note [Activation prefetch]) are there of the four. The
// peak is not compared: at this width a layer's copy (117 MB, 2 ms) takes far longer than its forward,
// so every layer's tensors are still on the device when the forward ends, and the offloaded run's
// peak came out above the kept one's on an H200 (452 against 426 MB). Where the copies hide under
// the step is the question of Note [Automatic activation offload], answered by the benchmarks.
TEST(ActivationOffloadGpu, CopiedTensorsLeaveTheDevice) {
  if (!torch::cuda::is_available() || accelerator() == nullptr) GTEST_SKIP() << "no CUDA device";
  const GpuRun kept = run_on_gpu(false), offloaded = run_on_gpu(true);
  EXPECT_LT(offloaded.after_forward, kept.after_forward / 2)
      << "peaks: " << offloaded.peak << " offloaded, " << kept.peak << " kept";
}

}  // namespace
}  // namespace tandem
