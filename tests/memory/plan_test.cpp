#include "tandem/memory/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "../error_of.h"
#include "tandem/core/error.h"
#include "tandem/memory/estimate.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

// Parameter counts of the presets, by hand from their shapes (spec.cpp), as stored:
// 7B: L=32, d=4096, 32 heads (no GQA), d_ff=11008, vocab 32000 (a multiple of 64), untied.
//   layer = 4 d^2 (q, k, v, o) + 3 d d_ff + 2 d (norms) = 67108864 + 135266304 + 8192
//   embedding = lm_head = 32000 d = 131072000; head = lm_head + final norm (d)
constexpr int64_t k7bLayer = 202383360;
constexpr int64_t k7bEmbedding = 131072000;
constexpr int64_t k7bHead = 131072000 + 4096;
constexpr int64_t k7bParams = k7bEmbedding + 32 * k7bLayer + k7bHead;  // 6738415616 (LLaMA-2 7B)
constexpr int64_t kGiB = int64_t{1} << 30;

Config bf16_config() {
  Config c;
  c.train.precision = Precision::kBf16;
  c.train.micro_batch = 4;
  return c;
}

/// The bytes of the one row of `tier` whose purpose starts with `prefix`; -1 when there is none,
/// -2 when several match.
int64_t row_bytes(const MemoryPlan& p, const std::string& tier, const std::string& prefix) {
  int64_t found = -1;
  for (const auto& r : p.rows)
    if (r.tier == tier && r.purpose.rfind(prefix, 0) == 0) found = found == -1 ? r.bytes : -2;
  return found;
}

/// Sum of the rows of `tier` whose purpose contains `word`.
int64_t rows_containing(const MemoryPlan& p, const std::string& tier, const std::string& word) {
  int64_t sum = 0;
  for (const auto& r : p.rows)
    if (r.tier == tier && r.purpose.find(word) != std::string::npos) sum += r.bytes;
  return sum;
}

using test::error_of;

TEST(MemoryPlan, SevenBAtZeroGpuBlocksHoldsBf16WeightsAndGradientsOnTheGpu) {
  const ModelSpec s = preset_spec("7B");
  ASSERT_EQ(s.num_params(), k7bParams);
  const Config c = bf16_config();
  const MemoryPlan p = plan_offload_memory(s, c, 2048, 0);
  EXPECT_EQ(row_bytes(p, kTierGpu, "working weights"), 2 * k7bParams);
  EXPECT_EQ(row_bytes(p, kTierGpu, "gradients"), 2 * k7bParams);
  EXPECT_EQ(row_bytes(p, kTierGpu, "fp32 master"), -1);  // no GPU-updated block
  EXPECT_EQ(rows_containing(p, kTierGpu, "states"), 0);
  // The whole GPU tier: weights, gradients, the estimate's activations and logits, the reserve.
  const auto e = estimate_training_memory(s, 4, 2048, Precision::kBf16, false);
  EXPECT_EQ(p.gpu_bytes(), 4 * k7bParams + e.activations + e.logits + kGpuWorkspaceReserveBytes);
  // Every block CPU-updated: master 4n, states 8n, landing 2n, staging 2n, undo (speculation) 12n.
  EXPECT_EQ(p.pinned_bytes(), (4 + 8 + 2 + 2 + 12) * k7bParams);
  EXPECT_EQ(p.pageable_bytes(), 4 * k7bParams);
}

TEST(MemoryPlan, EachBlockMovedToTheCpuAddsItsMasterAndStatesToThePinnedTier) {
  const ModelSpec s = preset_spec("7B");
  Config c = bf16_config();
  c.offload.speculate = Speculation::kNever;
  const MemoryPlan g2 = plan_offload_memory(s, c, 2048, 2), g1 = plan_offload_memory(s, c, 2048, 1);
  const int64_t n = k7bLayer;  // layer.1 moves from GPU- to CPU-updated
  const auto master_and_states = [](const MemoryPlan& p) {
    return row_bytes(p, kTierPinned, "fp32 master") + rows_containing(p, kTierPinned, "states");
  };
  EXPECT_EQ(master_and_states(g1) - master_and_states(g2), 4 * n + 2 * 4 * n);
  // The block's landing and staging buffers (bf16) come with it; the GPU loses what the host gains
  // of master and states.
  EXPECT_EQ(g1.pinned_bytes() - g2.pinned_bytes(), 4 * n + 2 * 4 * n + 2 * 2 * n);
  EXPECT_EQ(g2.gpu_bytes() - g1.gpu_bytes(), 4 * n + 2 * 4 * n);
  // g = 1 -> 0 also moves the embedding.
  const MemoryPlan g0 = plan_offload_memory(s, c, 2048, 0);
  EXPECT_EQ(master_and_states(g0) - master_and_states(g1), 12 * (n + k7bEmbedding));
  EXPECT_EQ(row_bytes(g2, kTierGpu, "fp32 master"), 4 * (k7bEmbedding + 2 * n));
  EXPECT_EQ(row_bytes(g2, kTierPinned, "fp32 master"), 4 * (30 * n + k7bHead));
}

TEST(MemoryPlan, Bf16StatesHalveTheStateRows) {
  const ModelSpec s = preset_spec("7B");
  Config c = bf16_config();
  const int64_t n_gpu = k7bEmbedding + 4 * k7bLayer, n_cpu = 28 * k7bLayer + k7bHead;
  const MemoryPlan f = plan_offload_memory(s, c, 2048, 4);
  c.optim.state_dtype = StateDtype::kBf16;
  const MemoryPlan b = plan_offload_memory(s, c, 2048, 4);
  EXPECT_EQ(rows_containing(f, kTierGpu, "states"), 2 * 4 * n_gpu);
  // Note [Device Adam]: GPU-updated Blocks' states follow to bf16 (auto), or stay fp32 when asked.
  EXPECT_EQ(rows_containing(b, kTierGpu, "states"), 2 * 2 * n_gpu);
  EXPECT_EQ(row_bytes(b, kTierGpu, "optimizer states m, v (bf16), GPU-updated blocks"), 2 * 2 * n_gpu);
  EXPECT_EQ(rows_containing(f, kTierPinned, "states"), 2 * 4 * n_cpu);
  EXPECT_EQ(rows_containing(b, kTierPinned, "states"), 2 * 2 * n_cpu);
  // The undo log keeps the fp32 master and the states as they are: 4n + 2sn.
  EXPECT_EQ(row_bytes(f, kTierPinned, "undo log"), (4 + 8) * n_cpu);
  EXPECT_EQ(row_bytes(b, kTierPinned, "undo log"), (4 + 4) * n_cpu);
  c.optim.device_state_dtype = DeviceStateDtype::kFp32;
  EXPECT_EQ(rows_containing(plan_offload_memory(s, c, 2048, 4), kTierGpu, "states"), 2 * 4 * n_gpu);
  c.optim.state_dtype = StateDtype::kInt8;  // 8-bit host states: bf16 on the device (auto)
  c.optim.device_state_dtype = DeviceStateDtype::kAuto;
  EXPECT_EQ(rows_containing(plan_offload_memory(s, c, 2048, 4), kTierGpu, "states"), 2 * 2 * n_gpu);
  c.optim.state_dtype = StateDtype::kFp32;  // fp32 host states, bf16 ones asked for on the device
  c.optim.device_state_dtype = DeviceStateDtype::kBf16;
  EXPECT_EQ(rows_containing(plan_offload_memory(s, c, 2048, 4), kTierGpu, "states"), 2 * 2 * n_gpu);
}

// Note [bf16 master]: a stochastically rounded bf16 master halves the host master and its undo
// copy; Kahan's keeps 4 bytes (the bf16 pair); GPU-updated Blocks keep fp32 masters either way.
TEST(MemoryPlan, ABf16MasterHalvesTheMasterKindRowsOrKeepsThemWithKahan) {
  const ModelSpec s = preset_spec("7B");
  Config c = bf16_config();
  const int64_t n_gpu = k7bEmbedding + 4 * k7bLayer, n_cpu = 28 * k7bLayer + k7bHead;
  const MemoryPlan f = plan_offload_memory(s, c, 2048, 4);
  c.optim.master_dtype = MasterDtype::kBf16;
  const MemoryPlan b = plan_offload_memory(s, c, 2048, 4);
  EXPECT_EQ(row_bytes(b, kTierPinned, "bf16 master (stochastic rounding)"), 2 * n_cpu);
  EXPECT_EQ(row_bytes(b, kTierPinned, "fp32 master"), -1);
  EXPECT_EQ(row_bytes(b, kTierGpu, "fp32 master"), 4 * n_gpu);
  EXPECT_EQ(row_bytes(b, kTierPinned, "undo log"), (2 + 8) * n_cpu);
  EXPECT_EQ(f.pinned_bytes() - b.pinned_bytes(), (2 + 2) * n_cpu);
  c.optim.master_rounding = MasterRounding::kKahan;
  const MemoryPlan k = plan_offload_memory(s, c, 2048, 4);
  EXPECT_EQ(row_bytes(k, kTierPinned, "bf16 master with its bf16 Kahan compensation"), 4 * n_cpu);
  EXPECT_EQ(k.pinned_bytes(), f.pinned_bytes());
}

TEST(MemoryPlan, UndoRowsFollowSpeculationAndAccumulationAddsNoHostRow) {
  const ModelSpec s = preset_spec("7B");
  Config c = bf16_config();
  const int64_t n_cpu = 24 * k7bLayer + k7bHead;
  const MemoryPlan spec = plan_offload_memory(s, c, 2048, 8);
  EXPECT_EQ(row_bytes(spec, kTierPinned, "undo log (speculative updates)"), 12 * n_cpu);
  c.offload.speculate = Speculation::kNever;
  c.train.grad_accum = 2;  // gradients accumulate in the device's gradient buffers
  const MemoryPlan plain = plan_offload_memory(s, c, 2048, 8);
  EXPECT_EQ(row_bytes(plain, kTierPinned, "undo log"), -1);
  EXPECT_EQ(spec.pinned_bytes() - plain.pinned_bytes(), 12 * n_cpu);
  // A delayed update waits for the norm and keeps no undo log, unless exact updates come first.
  Config delayed = bf16_config();
  delayed.offload.delayed_update = true;
  EXPECT_EQ(row_bytes(plan_offload_memory(s, delayed, 2048, 8), kTierPinned, "undo log"), -1);
  delayed.offload.delayed_after = 40;
  EXPECT_EQ(row_bytes(plan_offload_memory(s, delayed, 2048, 8), kTierPinned, "undo log (speculative updates)"),
            12 * n_cpu);
}

TEST(MemoryPlan, PageableHostWhenPinningIsOff) {
  const ModelSpec s = preset_spec("7B");
  Config c = bf16_config();
  c.offload.speculate = Speculation::kNever;
  c.offload.pin_memory = false;
  const MemoryPlan p = plan_offload_memory(s, c, 2048, 0);
  EXPECT_EQ(p.pinned_bytes(), 0);
  EXPECT_EQ(p.pageable_bytes(), (4 + 8 + 2 + 2) * k7bParams + 4 * k7bParams);
}

TEST(MemoryPlan, TiedHeadOwnsOnlyTheFinalNorm) {
  // tiny: L=4, d=128, 4 heads, 2 kv heads (head_dim 32), d_ff 384, vocab 256, tied.
  // layer = 2 d^2 + 2 d (2 x 32) + 3 d d_ff + 2 d = 32768 + 16384 + 147456 + 256
  const MemoryPlan p = plan_offload_memory(preset_spec("tiny"), Config{}, 128, 4);
  ASSERT_EQ(p.blocks.size(), 6u);
  EXPECT_EQ(p.blocks[0].params, 256 * 128);
  EXPECT_EQ(p.blocks[1].params, 196864);
  EXPECT_EQ(p.blocks[5].params, 128);
  EXPECT_EQ(p.blocks[0].update, UpdateSide::kGpu);
  EXPECT_EQ(p.blocks[4].update, UpdateSide::kGpu);
  EXPECT_EQ(p.blocks[5].update, UpdateSide::kCpu);
  // fp32 precision: working weights 4 bytes.
  EXPECT_EQ(row_bytes(p, kTierGpu, "working weights"), 4 * (256 * 128 + 4 * 196864 + 128));
  EXPECT_EQ(row_bytes(p, kTierPinned, "fp32 master"), 4 * 128);
}

TEST(MemoryPlan, ThirteenBRefusedOn24GiBWithTheGpuNumbers) {
  const ModelSpec s = preset_spec("13B");
  Config c = bf16_config();
  const MemoryPlan p = plan_offload_memory(s, c, 2048, 0);
  const MemoryCapacity cap{24 * kGiB, 0};
  const std::string msg = error_of([&] { check_plan_fits(p, cap, c.offload, c.train); });
  ASSERT_FALSE(msg.empty()) << "a 13B plan fitted 24 GiB";
  char need[32];
  std::snprintf(need, sizeof need, "%.2f GiB", double(p.gpu_bytes()) / double(kGiB));
  EXPECT_NE(msg.find(need), std::string::npos) << msg;
  EXPECT_NE(msg.find("24.00 GiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("22.08 GiB"), std::string::npos) << msg;  // 0.92 x 24
  // 13B: 4 x 5120^2 + 3 x 5120 x 13824 + 2 x 5120 = 317204480 per layer; untied 32000-row matrices.
  // Its bf16 weights and gradients alone, 4 x 13015864320 bytes + the 2 GiB reserve, are 50.49 GiB.
  EXPECT_NE(msg.find("50.49 GiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.micro_batch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.checkpointing=true"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("offload.update_split"), std::string::npos) << msg;  // nothing GPU-updated
  EXPECT_EQ(msg.find("pinned"), std::string::npos) << msg;                // unknown host: not checked
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

TEST(MemoryPlan, AHostRingReplacesPerBlockBuffersAndAutoTakesItOnlyWhenNeeded) {
  // 13B, layer = 317204480 parameters (the largest Block), bf16 states, 3 GPU-updated layers.
  constexpr int64_t k13bLayer = 317204480;
  const ModelSpec s = preset_spec("13B");
  Config c = bf16_config();
  c.model.checkpointing = true;
  c.optim.state_dtype = StateDtype::kBf16;
  c.offload.host_ring = 0;
  c.offload.speculate = Speculation::kNever;  // no undo log: the two plans differ in the buffers alone
  const MemoryPlan per_block = plan_offload_memory(s, c, 2048, 3);
  int64_t n_cpu = 0;
  for (const auto& b : per_block.blocks) n_cpu += b.update == UpdateSide::kCpu ? b.params : 0;
  EXPECT_EQ(row_bytes(per_block, kTierPinned, "gradient landing buffers"), 2 * n_cpu);
  EXPECT_EQ(row_bytes(per_block, kTierPinned, "weight staging buffers"), 2 * n_cpu);
  c.offload.host_ring = 4;
  const MemoryPlan ring = plan_offload_memory(s, c, 2048, 3);
  EXPECT_EQ(row_bytes(ring, kTierPinned, "gradient landing ring"), 4 * k13bLayer * 2);
  EXPECT_EQ(row_bytes(ring, kTierPinned, "weight staging ring"), 4 * k13bLayer * 2);
  EXPECT_EQ(row_bytes(ring, kTierPinned, "gradient landing buffers"), -1);
  EXPECT_EQ(row_bytes(ring, kTierPinned, "undo log"), -1);  // a ring keeps none (Note [Retraction])
  c.offload.speculate = Speculation::kAuto;                 // not even when it speculates
  EXPECT_EQ(row_bytes(plan_offload_memory(s, c, 2048, 3), kTierPinned, "undo log"), -1);
  c.offload.speculate = Speculation::kNever;
  EXPECT_EQ(per_block.pinned_bytes() - ring.pinned_bytes(), 4 * n_cpu - 16 * k13bLayer);

  // Auto: per-Block buffers where they fit, the ring (speculating without an undo log) where they do not.
  c.offload.host_ring = -1;
  c.offload.speculate = Speculation::kAuto;
  const MemoryCapacity big{80 * kGiB, 400 * kGiB}, host125{80 * kGiB, 124 * kGiB}, unknown{80 * kGiB, 0};
  EXPECT_EQ(resolve_host_ring(s, c, 2048, 3, big).host_ring, 0);
  EXPECT_EQ(resolve_host_ring(s, c, 2048, 3, big).speculate, Speculation::kAuto);
  const OffloadConfig small = resolve_host_ring(s, c, 2048, 3, host125);
  EXPECT_EQ(small.host_ring, 4);
  EXPECT_EQ(small.speculate, Speculation::kAuto);
  EXPECT_EQ(resolve_host_ring(s, c, 2048, 3, unknown).host_ring, 0);
  // The host decides, not the GPU: a GPU tier over budget, or no GPU at all (the CPU as the
  // device), keeps per-Block buffers and speculation.
  const MemoryCapacity tiny_gpu{8 * kGiB, 400 * kGiB}, no_gpu{0, 124 * kGiB};
  EXPECT_EQ(resolve_host_ring(s, c, 2048, 3, tiny_gpu).host_ring, 0);
  EXPECT_EQ(resolve_host_ring(s, c, 2048, 3, no_gpu).host_ring, 0);
  EXPECT_EQ(resolve_host_ring(s, c, 2048, 3, no_gpu).speculate, Speculation::kAuto);
  Config delayed = c;
  delayed.offload.delayed_update = true;  // a ring delays too (Note [Delayed host ring])
  EXPECT_EQ(resolve_host_ring(s, delayed, 2048, 3, host125).host_ring, 4);
  c.offload = small;
  const int64_t g = largest_fitting_gpu_blocks(s, c, 2048, host125);
  EXPECT_GE(g, 2);
  EXPECT_TRUE(plan_fits(plan_offload_memory(s, c, 2048, g), host125, c.offload));

  // The refusal names bf16 states and the ring when they are not in use yet.
  Config f = bf16_config();
  f.model.checkpointing = true;
  f.offload.host_ring = 0;
  const std::string msg =
      error_of([&] { check_plan_fits(plan_offload_memory(s, f, 2048, 3), host125, f.offload, f.train); });
  EXPECT_NE(msg.find("optim.state_dtype=bf16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offload.host_ring=4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optim.master_dtype=bf16"), std::string::npos) << msg;
  f.offload.speculate = Speculation::kAlways;  // a ring speculates too (Note [Retraction]): still suggested
  const std::string msg2 =
      error_of([&] { check_plan_fits(plan_offload_memory(s, f, 2048, 3), host125, f.offload, f.train); });
  EXPECT_NE(msg2.find("offload.host_ring=4"), std::string::npos) << msg2;
  f.offload.host_ring = 4;  // once it is in use, not again
  const std::string msg3 =
      error_of([&] { check_plan_fits(plan_offload_memory(s, f, 2048, 3), host125, f.offload, f.train); });
  EXPECT_EQ(msg3.find("offload.host_ring"), std::string::npos) << msg3;
}

// Note [NVMe tier]: the last CPU-updated Blocks' moments move from the host to the NVMe tier, with
// three bounce slots of the largest of them on the host and no undo log; auto takes the fewest that
// make the pinned tier fit, after the ring, and none where the host fits, is unknown or no GPU.
TEST(MemoryPlan, TheNvmeTierHoldsTheLastBlocksStatesAndAutoTakesTheFewestThatFit) {
  constexpr int64_t k7bLayer = 202383360;  // a 7B decoder layer's parameters
  const ModelSpec s = preset_spec("7B");
  Config c = bf16_config();
  c.model.checkpointing = true;
  c.offload.host_ring = 4;
  c.offload.speculate = Speculation::kNever;
  const MemoryPlan host = plan_offload_memory(s, c, 2048, 0);
  c.offload.nvme_path = "/mnt/nvme";
  c.offload.nvme_blocks = 3;  // layers 30 and 31 and the head
  const MemoryPlan tier = plan_offload_memory(s, c, 2048, 0);
  EXPECT_EQ(tier.nvme_blocks, 3);
  int64_t on_disk = 0;
  for (const auto& b : tier.blocks) on_disk += b.nvme ? b.params : 0;
  EXPECT_EQ(on_disk, 2 * k7bLayer + s.vocab_size * s.d_model + s.d_model);
  EXPECT_TRUE(tier.blocks.back().nvme);
  EXPECT_FALSE(tier.blocks[tier.blocks.size() - 4].nvme);
  EXPECT_EQ(tier.tier_bytes(kTierNvme), 8 * on_disk);  // fp32 m and v
  const int64_t slots = row_bytes(tier, kTierPinned, "NVMe bounce slots");
  EXPECT_EQ(slots, 3 * 8 * k7bLayer);  // a layer is the largest of the three
  EXPECT_EQ(tier.pinned_bytes(), host.pinned_bytes() - 8 * on_disk + slots);
  EXPECT_NE(format_plan(tier).find("states on NVMe: layers 30..31, head"), std::string::npos) << format_plan(tier);

  c.offload.nvme_blocks = -1;
  c.offload.host_ring = -1;
  c.offload.speculate = Speculation::kAuto;
  const MemoryCapacity roomy{80 * kGiB, 400 * kGiB}, h48{80 * kGiB, 48 * kGiB}, unknown{80 * kGiB, 0},
      no_gpu{0, 48 * kGiB};
  EXPECT_EQ(resolve_nvme_blocks(s, c, 2048, 0, roomy), 0);
  EXPECT_EQ(resolve_nvme_blocks(s, c, 2048, 0, unknown), 0);
  EXPECT_EQ(resolve_nvme_blocks(s, c, 2048, 0, no_gpu), 0);
  Config r = c;
  r.offload = resolve_host_ring(s, c, 2048, 0, h48);
  ASSERT_EQ(r.offload.host_ring, 4);
  const int64_t n = resolve_nvme_blocks(s, r, 2048, 0, h48);
  ASSERT_GT(n, 0);
  r.offload.nvme_blocks = n;
  EXPECT_TRUE(plan_fits(plan_offload_memory(s, r, 2048, 0), h48, r.offload));
  r.offload.nvme_blocks = n - 1;
  EXPECT_FALSE(plan_fits(plan_offload_memory(s, r, 2048, 0), h48, r.offload));
  // Without the tier the same host is refused, naming it; with it, a count too small names a larger one.
  Config plain = r;
  plain.offload.nvme_path.clear();
  const std::string msg =
      error_of([&] { check_plan_fits(plan_offload_memory(s, plain, 2048, 0), h48, plain.offload, plain.train); });
  EXPECT_NE(msg.find("offload.nvme_path=DIR"), std::string::npos) << msg;
  const std::string more =
      error_of([&] { check_plan_fits(plan_offload_memory(s, r, 2048, 0), h48, r.offload, r.train); });
  EXPECT_NE(more.find("a larger offload.nvme_blocks"), std::string::npos) << more;
}

TEST(MemoryPlan, FitsAndNamesWhatToChangePerTier) {
  const ModelSpec s = preset_spec("7B");
  Config c = bf16_config();
  c.model.checkpointing = true;
  c.offload.update_split = "0.25";
  const MemoryPlan p = plan_offload_memory(s, c, 2048, 8);
  EXPECT_NO_THROW(check_plan_fits(p, {80 * kGiB, 1024 * kGiB}, c.offload, c.train));
  const std::string gpu = error_of([&] { check_plan_fits(p, {40 * kGiB, 1024 * kGiB}, c.offload, c.train); });
  EXPECT_NE(gpu.find("offload.update_split (now 0.25: 8 of 32"), std::string::npos) << gpu;
  EXPECT_EQ(gpu.find("model.checkpointing"), std::string::npos) << gpu;  // already on
  EXPECT_EQ(gpu.find("offload.pin_memory"), std::string::npos) << gpu;
  // Pinned: 24 of 32 layers + head CPU-updated, 28 bytes each (master 4, states 8, landing 2,
  // staging 2, undo 12) = 28 x 4988276736 bytes = 130.08 GiB; 0.8 x 128 GiB = 102.40 GiB.
  const std::string host = error_of([&] { check_plan_fits(p, {80 * kGiB, 128 * kGiB}, c.offload, c.train); });
  EXPECT_NE(host.find("130.08 GiB"), std::string::npos) << host;
  EXPECT_NE(host.find("102.40 GiB"), std::string::npos) << host;
  EXPECT_NE(host.find("offload.pin_memory=false"), std::string::npos) << host;
  EXPECT_EQ(host.find("train.micro_batch"), std::string::npos) << host;
  c.offload.pin_memory = false;
  const MemoryPlan pageable = plan_offload_memory(s, c, 2048, 8);
  EXPECT_NO_THROW(check_plan_fits(pageable, {80 * kGiB, 128 * kGiB}, c.offload, c.train));
}

TEST(MemoryPlan, LargestFittingGpuBlocksIsMonotoneInGpuSizeAndMaximal) {
  const ModelSpec s = preset_spec("7B");
  Config c = bf16_config();
  c.model.checkpointing = true;
  int64_t last = -1;
  bool grew = false;
  for (int64_t gib : {8, 24, 32, 40, 48, 64, 80, 96, 141, 192, 400}) {
    const MemoryCapacity cap{gib * kGiB, 0};
    const int64_t g = largest_fitting_gpu_blocks(s, c, 2048, cap);
    EXPECT_GE(g, last) << gib << " GiB";
    EXPECT_LE(g, 32);
    grew |= g > last;
    last = g;
    // Maximal: g fits, g + 1 does not.
    const int64_t budget = static_cast<int64_t>(double(cap.gpu_total) * c.offload.gpu_memory_fraction);
    if (g >= 0) {
      EXPECT_LE(plan_offload_memory(s, c, 2048, g).gpu_bytes(), budget) << gib << " GiB";
    }
    if (g < 32) {
      EXPECT_GT(plan_offload_memory(s, c, 2048, g + 1).gpu_bytes(), budget) << gib << " GiB";
    }
  }
  EXPECT_TRUE(grew);
  EXPECT_EQ(largest_fitting_gpu_blocks(s, c, 2048, {8 * kGiB, 0}), -1);  // bf16 weights alone are 12.55 GiB
  EXPECT_EQ(largest_fitting_gpu_blocks(s, c, 2048, {400 * kGiB, 0}), 32);
}

TEST(MemoryPlan, FormatNamesEveryRowAndTierTotals) {
  Config c = bf16_config();
  c.train.grad_accum = 2;
  const MemoryPlan p = plan_offload_memory(preset_spec("7B"), c, 2048, 3);
  const std::string t = format_plan(p);
  for (const auto& r : p.rows) EXPECT_NE(t.find(r.purpose), std::string::npos) << r.purpose << "\n" << t;
  EXPECT_NE(t.find("GPU-updated: embedding, layers 0..2"), std::string::npos) << t;
  EXPECT_NE(t.find("CPU-updated: layers 3..31, head"), std::string::npos) << t;
  char total[64];
  std::snprintf(total, sizeof total, "%.2f", double(p.pinned_bytes()) / double(kGiB));
  EXPECT_NE(t.find(std::string("pinned host") + " "), std::string::npos) << t;
  EXPECT_NE(t.find(total), std::string::npos) << t;
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(MemoryPlan, HostGuardFallsBackToPageableWhenPinningWouldCrowdTheHost) {
  const ModelSpec s = preset_spec("7B");
  Config c = bf16_config();
  c.offload.speculate = Speculation::kNever;
  c.offload.host_memory_fraction = 0.7;
  const MemoryPlan pinned = plan_offload_memory(s, c, 2048, 0);
  Config off = c;
  off.offload.pin_memory = false;
  const MemoryPlan pageable = plan_offload_memory(s, off, 2048, 0);
  const int64_t total = pageable.pageable_bytes() + pageable.pinned_bytes();
  // Enough for every buffer as pageable memory, not enough for them pinned within the fraction.
  MemoryCapacity cap{80 * kGiB, static_cast<int64_t>(double(total) / 0.95) + kGiB};
  ASSERT_GT(double(pinned.pinned_bytes()), c.offload.host_memory_fraction * double(cap.host_available));
  std::string why;
  Config g = c;
  const MemoryPlan got = guard_pinned_memory(pinned, s, g, 2048, 0, cap, &why);
  EXPECT_FALSE(g.offload.pin_memory);
  EXPECT_EQ(got.pinned_bytes(), 0);
  EXPECT_NE(why.find("half the bandwidth"), std::string::npos) << why;
  EXPECT_NE(why.find("offload.host_memory_fraction"), std::string::npos) << why;
  // Not even pageable fits: the plan stays pinned and the check refuses it with its own message.
  cap.host_available = total / 2;
  Config h = c;
  why.clear();
  const MemoryPlan kept = guard_pinned_memory(pinned, s, h, 2048, 0, cap, &why);
  EXPECT_TRUE(h.offload.pin_memory);
  EXPECT_EQ(kept.pinned_bytes(), pinned.pinned_bytes());
  EXPECT_EQ(why, "");
  // Within the fraction: nothing changes.
  cap.host_available = 10 * total;
  Config k = c;
  EXPECT_EQ(guard_pinned_memory(pinned, s, k, 2048, 0, cap, &why).pinned_bytes(), pinned.pinned_bytes());
  EXPECT_TRUE(k.offload.pin_memory);
}

// Note [Plan layout]: ZeRO-2 over 2 ranks holds whole weights and gradients, half of every master,
// state and host buffer, and NCCL's buffers for the reduce-scatter and the all-gather groups.
TEST(MemoryPlan, ShardsHalveMastersStatesAndHostBuffersAndCountNcclBuffers) {
  const ModelSpec s = preset_spec("7B");
  Config c = bf16_config();
  c.dist.zero_stage = 2;
  const PlanLayout two = plan_layout(c, 1, 2, {}, /*nccl=*/true);
  EXPECT_EQ(two.shards, 2);
  EXPECT_EQ(two.replicas, 2);
  EXPECT_EQ(two.nccl_communicators(), 2);
  const MemoryPlan one = plan_offload_memory(s, c, 2048, 8);
  const MemoryPlan p = plan_offload_memory(s, c, 2048, 8, two);
  EXPECT_EQ(row_bytes(p, kTierGpu, "working weights"), 2 * k7bParams);
  EXPECT_EQ(row_bytes(p, kTierGpu, "gradients"), 2 * k7bParams);
  const int64_t n_gpu = k7bEmbedding + 8 * k7bLayer, n_cpu = k7bParams - n_gpu;
  EXPECT_EQ(row_bytes(p, kTierGpu, "fp32 master"), 4 * (n_gpu / 2));
  EXPECT_EQ(row_bytes(p, kTierGpu, "optimizer states"), 8 * (n_gpu / 2));
  EXPECT_EQ(row_bytes(p, kTierGpu, "NCCL buffers"), 2 * kNcclCommunicatorBytes);
  // The update scratch (the largest GPU-updated block's fp32 gradient: a layer) halves too.
  EXPECT_EQ(row_bytes(p, kTierGpu, "update scratch"), 4 * (k7bLayer / 2));
  EXPECT_EQ(p.gpu_bytes(), one.gpu_bytes() - 12 * (n_gpu / 2) - 4 * (k7bLayer / 2) + 2 * kNcclCommunicatorBytes);
  // master 4, states 8, landing 2, staging 2, undo 12 bytes per CPU-updated parameter, halved.
  EXPECT_EQ(p.pinned_bytes(), (4 + 8 + 2 + 2 + 12) * ((n_cpu + 1) / 2));
  EXPECT_NE(format_plan(p).find("masters and states sharded 2 ways"), std::string::npos) << format_plan(p);
  // Without NCCL (the CPU as the device) there are no NCCL buffers; one process has no layout.
  EXPECT_EQ(plan_layout(c, 1, 2, {}, false).nccl_communicators(), 0);
  EXPECT_EQ(plan_layout(c, 0, 1, {}, true).nccl_communicators(), 0);
}

// A pipeline stage plans its own Blocks, the activations of the micro-batches its schedule keeps in
// flight, logits on the last stage only, and its link buffers.
TEST(MemoryPlan, AStagePlansItsBlocksAndTheMicroBatchesItsScheduleHolds) {
  const ModelSpec s = preset_spec("7B");
  Config c = bf16_config();
  c.train.grad_accum = 8;
  const std::vector<int64_t> ends = {17, 34};  // embedding + layers 0..15 | layers 16..31 + head
  const PlanLayout first = plan_layout(c, 0, 2, ends, true), last = plan_layout(c, 1, 2, ends, true);
  EXPECT_EQ(first.in_flight(), 2);  // 1F1B: p - s
  EXPECT_EQ(last.in_flight(), 1);
  EXPECT_EQ(layout_layers(s, first), 16);
  EXPECT_EQ(layout_params(s, first), k7bEmbedding + 16 * k7bLayer);
  EXPECT_EQ(layout_params(s, last), 16 * k7bLayer + k7bHead);
  EXPECT_EQ(first.nccl_communicators(), 3);  // the norm's group, a pair per direction
  const MemoryPlan p0 = plan_offload_memory(s, c, 2048, 4, first), p1 = plan_offload_memory(s, c, 2048, 0, last);
  EXPECT_EQ(row_bytes(p0, kTierGpu, "working weights"), 2 * (k7bEmbedding + 16 * k7bLayer));
  EXPECT_EQ(row_bytes(p0, kTierGpu, "fp32 master"), 4 * (k7bEmbedding + 4 * k7bLayer));
  EXPECT_EQ(row_bytes(p0, kTierGpu, "logits"), -1);
  const auto a = activation_cost(s, 4, 2048, Precision::kBf16, false);
  EXPECT_EQ(row_bytes(p0, kTierGpu, "activations"), a.activations(16, 2));
  EXPECT_EQ(row_bytes(p1, kTierGpu, "activations"), a.activations(16, 1));
  EXPECT_EQ(row_bytes(p1, kTierGpu, "logits"), a.logits);
  EXPECT_EQ(row_bytes(p1, kTierGpu, "stage link buffers"), 2 * 4 * 2048 * 4096 * 2);
  EXPECT_EQ(p1.blocks.front().name, "layer.16");
  EXPECT_EQ(p1.blocks.back().name, "head");
  // GPipe keeps every micro-batch's activations, and the last stage every logits.
  c.dist.pipeline_schedule = PipelineSchedule::kGPipe;
  const MemoryPlan g1 = plan_offload_memory(s, c, 2048, 0, plan_layout(c, 1, 2, ends, true));
  EXPECT_EQ(row_bytes(g1, kTierGpu, "activations"), a.activations(16, 8));
  EXPECT_EQ(row_bytes(g1, kTierGpu, "logits"), 8 * a.logits);
  // pp = 2 x dp = 2 over 4 ranks: rank 3 is stage 1's second replica.
  c.dist.zero_stage = 2;
  const PlanLayout grid = plan_layout(c, 3, 4, ends, true);
  EXPECT_EQ(grid.stage, 1);
  EXPECT_EQ(grid.replicas, 2);
  EXPECT_EQ(grid.shards, 2);
  EXPECT_EQ(grid.first, 17);
}

// The runs of the two H100s (80 GB, 256 GiB host): 13B ZeRO-2 offload fits each GPU once the plan
// counts the layout; a 30B model's weights and gradients alone exceed one GPU under ZeRO-2, which
// the refusal says with the fix (pipeline stages), and fit as two stages.
TEST(MemoryPlan, ThirteenBShardedFitsTwoH100sAndThirtyBNeedsStages) {
  Config c = bf16_config();
  c.model.checkpointing = true;
  c.optim.state_dtype = StateDtype::kBf16;
  c.dist.zero_stage = 2;
  MemoryCapacity cap;
  cap.gpu_total = int64_t{81559} << 20;
  cap.host_available = int64_t{125} << 30;  // a rank's half of the host
  const ModelSpec s13 = preset_spec("13B");
  const PlanLayout zero = plan_layout(c, 0, 2, {}, true);
  // Note [Device Adam]: bf16 device states (auto with bf16 host states) let the GPU update more
  // Blocks than the fp32 ones those runs had; the rest of the test plans as they did.
  const int64_t g_bf16 = largest_fitting_gpu_blocks(s13, c, 2048, cap, zero);
  c.optim.device_state_dtype = DeviceStateDtype::kFp32;
  const int64_t g = largest_fitting_gpu_blocks(s13, c, 2048, cap, zero);
  ASSERT_GE(g, 0);
  EXPECT_GT(g_bf16, g);
  c.offload = resolve_host_ring(s13, c, 2048, g, cap, zero);  // per-block buffers do not fit half the host
  EXPECT_EQ(c.offload.host_ring, 4);
  EXPECT_TRUE(plan_fits(plan_offload_memory(s13, c, 2048, g, zero), cap, c.offload))
      << format_plan(plan_offload_memory(s13, c, 2048, g, zero));
  EXPECT_FALSE(
      plan_fits(plan_offload_memory(s13, c, 2048, std::min<int64_t>(g + 1, s13.n_layer), zero), cap, c.offload) &&
      g < s13.n_layer);

  ModelSpec s30 = preset_spec("13B");  // LLaMA-30B's shape: 60 layers of d 6656
  s30.n_layer = 60;
  s30.d_model = 6656;
  s30.n_head = s30.n_kv_head = 52;
  s30.d_ff = 17920;
  const MemoryPlan z30 = plan_offload_memory(s30, c, 2048, 0, zero);
  const std::string e = error_of([&] { check_plan_fits(z30, cap, c.offload, c.train); });
  EXPECT_NE(e.find("cut the model into more pipeline stages"), std::string::npos) << e;
  c.dist.zero_stage = 0;
  c.train.micro_batch = 1;
  c.train.grad_accum = 8;
  const PlanLayout stage = plan_layout(c, 0, 2, {31, 62}, true);
  EXPECT_GE(largest_fitting_gpu_blocks(s30, c, 2048, cap, stage), 0)
      << format_plan(plan_offload_memory(s30, c, 2048, 0, stage));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Note [Activation offload]: the offloaded layers' activations leave the GPU's row for a host row
// of their whole saved tensors; two offloaded layers' stay on the GPU (Note [Activation prefetch]); a stage counts the
// offloaded layers among its own.
TEST(MemoryPlan, OffloadedActivationsMoveToTheHost) {
  const ModelSpec s = preset_spec("7B");
  Config c = bf16_config();
  c.model.checkpointing = true;
  const auto ckpt = activation_cost(s, 4, 2048, Precision::kBf16, true);
  const int64_t whole = activation_cost(s, 4, 2048, Precision::kBf16, false).kept_per_layer;
  ASSERT_GT(whole, 4 * ckpt.kept_per_layer);
  const MemoryPlan none = plan_offload_memory(s, c, 2048, 0);
  EXPECT_EQ(row_bytes(none, kTierGpu, "activations"), ckpt.activations(32, 1));
  EXPECT_EQ(row_bytes(none, kTierPinned, "activations"), -1);
  c.model.activation_offload = 6;
  const MemoryPlan six = plan_offload_memory(s, c, 2048, 0);
  EXPECT_EQ(row_bytes(six, kTierGpu, "activations (checkpointing on, 6 of 32 layers offloaded)"),
            26 * ckpt.kept_per_layer + std::max(ckpt.layer_working, 2 * whole));
  EXPECT_EQ(row_bytes(six, kTierPinned, "activations of 6 offloaded layers"), 6 * whole);
  c.model.activation_offload = -1;
  EXPECT_EQ(row_bytes(plan_offload_memory(s, c, 2048, 0), kTierPinned, "activations of 32 offloaded layers"),
            32 * whole);
  // Two stages: embedding + layers 0..15 | layers 16..31 + head; the first 20 layers offloaded.
  EXPECT_EQ(offloaded_activation_bytes(s, c, 2048), 32 * whole) << "what the run reserves is the host row";
  EXPECT_EQ(offloaded_layers(s, 20, 0, 17), 16);
  EXPECT_EQ(offloaded_layers(s, 20, 17, 34), 4);
  EXPECT_EQ(offloaded_layers(s, 0, 0, 34), 0);
  EXPECT_EQ(offloaded_layers(s, -1, 17, 34), 16);
}

}  // namespace
}  // namespace tandem
