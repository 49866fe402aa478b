// Note [Pipeline profile]: each Block measured on the CPU for the tiny preset, the model left as it
// was, and the partitioner's plan and cut from the profile (Note [Pipeline partition]).
#include "tandem/parallel/pipeline_profile.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "../test_util.h"
#include "tandem/models/model.h"
#include "tandem/models/spec.h"

namespace tandem {
namespace {

Config tiny_pipeline_config() {
  Config c;
  c.model.preset = "tiny";
  c.model.tie_embeddings = false;
  c.train.device.kind = DeviceSpec::Kind::kCpu;
  c.train.micro_batch = 2;
  c.train.seq_len = 32;
  c.train.grad_accum = 4;
  return c;
}

std::shared_ptr<Model> tiny_model(const Config& c) {
  torch::manual_seed(1);
  return build_model(resolve_model_spec(c.model), c.model.checkpointing);
}

int64_t block_params(Model& m, size_t i) {
  int64_t n = 0;
  for (const auto& [name, p] : m.block_parameters(i)) n += p.numel();
  return n;
}

TEST(PipelineProfile, TheCpuProfileHasPositiveTimesAndTheRunsBytes) {
  const Config c = tiny_pipeline_config();
  auto model = tiny_model(c);
  const auto& s = model->spec();
  const auto blocks = profile_pipeline_blocks(*model, c, 32, torch::kCPU);
  ASSERT_EQ(blocks.size(), static_cast<size_t>(s.n_layer + 2));
  EXPECT_EQ(blocks.front().name, "embed");
  EXPECT_EQ(blocks.back().name, "head");
  const int64_t tokens = 2 * 32;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    EXPECT_GT(b.time_s, 0) << b.name;
    EXPECT_LT(b.time_s, 10) << b.name;
    // fp32 weights and gradients and AdamW's two fp32 states.
    EXPECT_EQ(b.static_bytes, block_params(*model, i) * 16) << b.name;
    EXPECT_GT(b.activation_bytes, 0) << b.name;
    const int64_t width = i + 1 == blocks.size() ? s.padded_vocab() : s.d_model;
    EXPECT_EQ(b.output_bytes, tokens * width * 4) << b.name << ": the fp32 residual stream, or the logits";
  }
  // Without checkpointing a decoder layer keeps more than its input.
  EXPECT_GT(blocks[1].activation_bytes, tokens * s.d_model * 4);
}

TEST(PipelineProfile, OffloadKeepsOnlyComputeDtypeWeightsAndGradientsOnTheDevice) {
  Config c = tiny_pipeline_config();
  c.offload.optimizer = OffloadTarget::kCpu;
  c.train.precision = Precision::kBf16;
  c.model.checkpointing = true;
  auto model = tiny_model(c);
  const auto blocks = profile_pipeline_blocks(*model, c, 32, torch::kCPU);
  for (size_t i = 0; i < blocks.size(); ++i) EXPECT_EQ(blocks[i].static_bytes, block_params(*model, i) * 4);
  // Checkpointed: a decoder layer keeps its input alone.
  EXPECT_EQ(blocks[1].activation_bytes, 2 * 32 * model->spec().d_model * 4);
}

TEST(PipelineProfile, TheModelIsLeftAsItWas) {
  Config c = tiny_pipeline_config();
  c.offload.optimizer = OffloadTarget::kCpu;
  c.train.precision = Precision::kBf16;
  auto model = tiny_model(c);
  std::vector<torch::Tensor> before;
  for (const auto& p : model->parameters()) before.push_back(p.detach().clone());
  profile_pipeline_blocks(*model, c, 32, torch::kCPU);
  measure_pipeline_device(*model, c, 32, torch::kCPU);
  const auto after = model->parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].scalar_type(), torch::kFloat32);
    EXPECT_TRUE(after[i].device().is_cpu());
    EXPECT_FALSE(after[i].grad().defined()) << "no gradient left behind";
    EXPECT_TRUE(torch::equal(after[i], before[i])) << "parameter " << i;
  }
}

TEST(PipelineProfile, TheHostAsADeviceHasASpeedAndItsAvailableMemory) {
  const Config c = tiny_pipeline_config();
  auto model = tiny_model(c);
  const auto d = measure_pipeline_device(*model, c, 32, torch::kCPU);
  EXPECT_EQ(d.name, "cpu");
  EXPECT_GT(d.speed, 0);
  EXPECT_GT(d.memory_bytes, 0);
  EXPECT_FALSE(d.busy_w.has_value());
  EXPECT_EQ(speed_probe_block(*model), 3u) << "the middle of 4 decoder layers (Blocks 1 .. 4)";
}

// Equal Blocks on two equal devices: half each.
TEST(PipelineProfile, TwoStagesOfEqualBlocksCutInTheMiddle) {
  Config c = tiny_pipeline_config();
  c.dist.pipeline_stages = "2";
  std::vector<PipelineBlockCost> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back({"b" + std::to_string(i), 0.01, 1000, 1000, 4096});
  std::string table;
  const auto plan =
      plan_from_profile(blocks, c, 32, {{"cpu", 1.0, int64_t(1) << 40}, {"cpu", 1.0, int64_t(1) << 40}}, false, &table);
  EXPECT_EQ(stage_ends(plan), (std::vector<int64_t>{4, 8}));
  EXPECT_NE(table.find("predicted step"), std::string::npos) << table;
  EXPECT_NE(table.find("b0 .. b3"), std::string::npos) << table;
}

// The measured tiny model on two equal devices: the fastest of the five cuts, its stages within a
// Block of each other; auto keeps one stage with two replicas (Note [Pipeline stage count]).
TEST(PipelineProfile, ThePlanOfTheMeasuredModelIsTheFastestCut) {
  Config c = tiny_pipeline_config();
  c.dist.pipeline_stages = "2";
  auto model = tiny_model(c);
  const std::vector<PipelineDevice> devices(2, PipelineDevice{"cpu", 1.0, int64_t(1) << 40});
  const auto blocks = profile_pipeline_blocks(*model, c, 32, torch::kCPU);
  const auto plan = plan_from_profile(blocks, c, 32, devices, false, nullptr);
  ASSERT_EQ(plan.stages.size(), 2u);
  double best = 1e300, largest = 0;
  for (int64_t cut = 1; cut < 6; ++cut)
    best = std::min(best, evaluate_pipeline(blocks, devices, {cut, 6}, partition_options(c)).step_s);
  for (const auto& b : blocks) largest = std::max(largest, b.time_s);
  EXPECT_NEAR(plan.step_s, best, 1e-12);
  EXPECT_LE(std::abs(plan.stages[0].time_s - plan.stages[1].time_s), largest + 1e-6);
  std::string table;
  const auto measured = plan_pipeline(*model, c, 32, devices, &table);
  EXPECT_EQ(measured.stages.size(), 2u) << table;
  EXPECT_NE(table.find("profile on cpu"), std::string::npos) << table;
  EXPECT_NE(table.find("layer.0"), std::string::npos) << table;
  c.dist.pipeline_stages = "auto";
  const auto chosen = plan_pipeline(*model, c, 32, devices, nullptr);
  EXPECT_EQ(chosen.stages.size(), 1u);
  EXPECT_EQ(chosen.replicas, 2);
}

TEST(PipelineProfile, RefusesWhatCannotRun) {
  Config c = tiny_pipeline_config();
  auto model = tiny_model(c);
  const std::vector<PipelineDevice> lots(8, PipelineDevice{"cpu", 1.0, int64_t(1) << 40});
  c.dist.pipeline_stages = "7";
  EXPECT_NE(test::error_of([&] { plan_pipeline(*model, c, 32, lots, nullptr); }).find("use at most 6 stages"),
            std::string::npos);
  c.dist.pipeline_stages = "2";
  const std::vector<PipelineDevice> small(2, PipelineDevice{"cpu", 1.0, 4096});
  const auto msg = test::error_of([&] { plan_pipeline(*model, c, 32, small, nullptr); });
  EXPECT_NE(msg.find("no cut of the 6 Blocks into 2 pipeline stages fits"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line";
  Config tied = tiny_pipeline_config();
  tied.model.tie_embeddings = true;
  tied.dist.pipeline_stages = "2";
  auto tied_model = tiny_model(tied);
  EXPECT_NE(test::error_of([&] {
              plan_pipeline(*tied_model, tied, 32, lots, nullptr);
            }).find("set model.tie_embeddings=false"),
            std::string::npos);
}

TEST(PipelineProfile, TheConfiguredCutIsValidated) {
  DistConfig d;
  EXPECT_FALSE(configured_pipeline_cut(d, 6).has_value());
  d.pipeline_stages = "2";
  d.pipeline_cut = PipelineCut::parse("3");
  EXPECT_EQ(*configured_pipeline_cut(d, 6), (std::vector<int64_t>{3, 6}));
  d.pipeline_stages = "auto";
  d.pipeline_cut = PipelineCut::parse("2,4");
  EXPECT_EQ(*configured_pipeline_cut(d, 6), (std::vector<int64_t>{2, 4, 6}));
  const auto error = [](const std::string& stages, const std::string& cut, int64_t blocks) {
    DistConfig c;
    c.pipeline_stages = stages;
    return test::error_of([&] {
      c.pipeline_cut = PipelineCut::parse(cut);
      configured_pipeline_cut(c, blocks);
    });
  };
  EXPECT_NE(error("3", "4,2", 6).find("must rise strictly"), std::string::npos);
  EXPECT_NE(error("2", "0", 6).find("must rise strictly"), std::string::npos);
  EXPECT_NE(error("2", "6", 6).find("must rise strictly"), std::string::npos);
  EXPECT_NE(error("2", "x", 6).find("not a comma list"), std::string::npos);
  EXPECT_NE(error("3", "1,,2", 6).find("not a comma list"), std::string::npos);
  EXPECT_NE(error("3", "2", 6).find("give 2"), std::string::npos);
  EXPECT_NE(error("8", "1,2,3,4,5,6,7", 6).find("use at most 6 stages"), std::string::npos);
}

TEST(PipelineProfile, StageEndsComeFromTheGivenCutOrThePlan) {
  Config c = tiny_pipeline_config();
  auto model = tiny_model(c);
  const std::vector<PipelineDevice> devices(2, PipelineDevice{"cpu", 1.0, int64_t(1) << 40});
  c.dist.pipeline_stages = "2";
  c.dist.pipeline_cut = PipelineCut::parse("1");
  EXPECT_EQ(pipeline_stage_ends(*model, c, 32, devices, nullptr), (std::vector<int64_t>{1, 6}));
  c.dist.pipeline_cut = PipelineCut{};
  const auto ends = pipeline_stage_ends(*model, c, 32, devices, nullptr);
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_GT(ends[0], 0);
  EXPECT_EQ(ends[1], 6);
  const auto error = [&](const std::string& stages, const std::string& cut) {
    Config bad = c;
    bad.dist.pipeline_stages = stages;
    return test::error_of([&] {
      bad.dist.pipeline_cut = PipelineCut::parse(cut);
      pipeline_stage_ends(*model, bad, 32, devices, nullptr);
    });
  };
  EXPECT_NE(error("3", "4,2").find("must rise strictly within 1 .. 5"), std::string::npos);
  EXPECT_NE(error("2", "6").find("must rise strictly"), std::string::npos);
  EXPECT_NE(error("2", "-1").find("not a comma list"), std::string::npos);
  EXPECT_NE(error("2", "two").find("not a comma list"), std::string::npos);
  EXPECT_NE(error("3", "3").find("give 2"), std::string::npos);
  EXPECT_NE(error("2", "1,3").find("give 1"), std::string::npos);
}

}  // namespace
}  // namespace tandem
