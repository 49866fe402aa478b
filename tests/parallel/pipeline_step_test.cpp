// One step through a pipeline's stages (parallel/pipeline_step.h), ranks as threads on loopback Gloo:
// loss and gradients equal one process's under 1F1B and GPipe, the scaled backward and its hooks, MoE
// balance losses per stage, evaluation without gradients, pass timing, and the global norm.
#include "tandem/parallel/pipeline_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm_threads.h"
#include "tandem/data/loader.h"
#include "tandem/models/model.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/stage_link.h"

namespace tandem::test {
namespace {

const c10::Device kCpu(c10::kCPU);

ModelSpec dense_spec() {  // embedding, 2 layers, head: 4 Blocks
  ModelSpec s = preset_spec("tiny");
  s.n_layer = 2, s.d_model = 16, s.n_head = 2, s.n_kv_head = 2, s.d_ff = 32;
  s.vocab_size = 64, s.max_seq_len = 16, s.tie_embeddings = false;
  return s;
}

ModelSpec moe_spec() {  // embedding, 2 dense layers, 2 MoE layers, head: 6 Blocks
  ModelSpec s = preset_spec("amx-moe-tiny");
  s.d_model = 32, s.d_ff = 32, s.vocab_size = 64, s.max_seq_len = 16, s.tie_embeddings = false;
  return s;
}

// The loss as it is (no loss scale).
torch::Tensor unscaled(const torch::Tensor& loss, int64_t) { return loss; }

/// `copies` models with the same weights: one per rank and the reference.
std::vector<std::shared_ptr<Model>> same_models(const ModelSpec& spec, int copies) {
  std::vector<std::shared_ptr<Model>> out;
  for (int i = 0; i < copies; ++i) {
    torch::manual_seed(11);
    out.push_back(build_model(spec, false));
  }
  return out;
}

std::vector<Batch> batches(int64_t m, int64_t vocab) {
  torch::manual_seed(5);
  std::vector<Batch> out;
  for (int64_t i = 0; i < m; ++i) {
    Batch b;
    const auto t = torch::randint(0, vocab, {2, 9}, torch::kInt64);
    b.inputs = t.narrow(1, 0, 8).contiguous();
    b.targets = t.narrow(1, 1, 8).contiguous();
    b.index = i;
    out.push_back(b);
  }
  return out;
}

/// One process's step: the summed loss of the micro-batches, its gradients in the parameters.
double reference_step(Model& model, const std::vector<Batch>& bs, double scale) {
  torch::Tensor sum = torch::zeros({});
  for (const auto& b : bs) {
    const auto loss = model.loss(model.forward(b.inputs), b.targets);
    (loss * scale).backward();
    sum += loss.detach();
  }
  return sum.item<double>();
}

void clear_grads(Model& model) {
  for (auto& [name, p] : model.hf_parameters()) p.mutable_grad() = torch::Tensor();
}

/// Stage s of `ends` (each stage's end Block).
std::pair<size_t, size_t> stage_range(const std::vector<size_t>& ends, int s) {
  return {s == 0 ? 0 : ends[static_cast<size_t>(s - 1)], ends[static_cast<size_t>(s)]};
}

// Each rank's Blocks' gradients against the reference's; no gradient on the other Blocks.
void expect_stage_grads(Model& mine, Model& ref, size_t first, size_t end, double factor) {
  for (size_t i = 0; i < mine.block_count(); ++i) {
    const auto got = mine.block_parameters(i), want = ref.block_parameters(i);
    for (size_t k = 0; k < got.size(); ++k) {
      const std::string what = got[k].first + " (Block " + std::to_string(i) + ")";
      if (i < first || i >= end) {
        EXPECT_FALSE(got[k].second.grad().defined()) << what << ": another stage's Block";
        continue;
      }
      ASSERT_TRUE(got[k].second.grad().defined()) << what;
      EXPECT_TRUE(AllClose(got[k].second.grad(), want[k].second.grad() * factor, 1e-5, 1e-6)) << what;
    }
  }
}

TEST(PipelineStep, EachScheduleGivesOneProcesssLossAndGradientsAcrossThreeStages) {
  const auto spec = dense_spec();
  const auto bs = batches(4, spec.vocab_size);
  auto models = same_models(spec, 4);
  Model& ref = *models[3];
  const double want = reference_step(ref, bs, 1.0);
  const std::vector<size_t> ends = {2, 3, 4};  // the embedding and layer 0 | layer 1 | the head
  int k = 0;
  for (const auto schedule : {PipelineSchedule::k1F1B, PipelineSchedule::kGPipe}) {
    const auto errors = on_ranks(3, 3, port(12 + k++), [&](Comm& comm) {
      const int r = comm.rank();
      SCOPED_TRACE(std::string(to_string(schedule)) + ", rank " + std::to_string(r));
      Model& mine = *models[static_cast<size_t>(r)];
      clear_grads(mine);
      const PipelineGrid grid(r, 3, 3);
      StageLink link(comm, grid, kCpu);
      const auto [first, end] = stage_range(ends, grid.stage());
      PipelineStep step(mine, grid, link, first, end, schedule, Precision::kFp32, kCpu);
      EXPECT_EQ(step.first(), first);
      EXPECT_EQ(step.end(), end);
      EXPECT_EQ(step.schedule(), schedule);
      EXPECT_EQ(step.grid().stage(), r);
      std::vector<int64_t> scaled_micros;
      std::vector<bool> lasts;
      const auto loss = step.run(
          bs,
          [&](const torch::Tensor& l, int64_t micro) {
            scaled_micros.push_back(micro);
            return l * 2.0;  // the loss scale
          },
          [&](bool last) { lasts.push_back(last); });
      EXPECT_EQ(loss.dim(), 0);
      if (grid.last_stage()) {
        EXPECT_NEAR(loss.item<double>(), want, 1e-5 * want) << "the unscaled losses summed";
        EXPECT_EQ(scaled_micros, (std::vector<int64_t>{0, 1, 2, 3})) << "each micro-batch's loss scaled once";
      } else {
        EXPECT_EQ(loss.item<double>(), 0.0) << "no loss before the last stage (no experts)";
        EXPECT_TRUE(scaled_micros.empty());
      }
      EXPECT_EQ(lasts, (std::vector<bool>{false, false, false, true})) << "one hook per backward; the last one last";
      expect_stage_grads(mine, ref, first, end, 2.0);
      // Note [Pipeline pass timing] on the CPU: every pass on the host's clock, in order.
      const StageTimes& t = step.last_times();
      ASSERT_EQ(t.passes.size(), 8u);
      for (size_t i = 0; i < t.passes.size(); ++i) {
        EXPECT_LE(t.passes[i].first, t.passes[i].second) << "pass " << i;
        if (i > 0) {
          EXPECT_LE(t.passes[i - 1].second, t.passes[i].first) << "pass " << i;
        }
      }
      EXPECT_GE(t.wait_s, 0.0);
      EXPECT_LE(t.wait_s, t.section_s);
    });
    expect_no_errors(errors);
  }
}

TEST(PipelineStep, MoeBalanceLossStaysWithTheStagesThatRouteAndSumsToTheModelsLoss) {
  const auto spec = moe_spec();
  const auto bs = batches(2, spec.vocab_size);
  auto models = same_models(spec, 4);
  Model& ref = *models[3];
  const double want = reference_step(ref, bs, 1.0);
  // The embedding and a dense layer | a dense layer and an MoE layer | an MoE layer and the head.
  const std::vector<size_t> ends = {2, 4, 6};
  std::vector<double> losses(3, -1.0);
  const auto errors = on_ranks(3, 3, port(14), [&](Comm& comm) {
    const int r = comm.rank();
    Model& mine = *models[static_cast<size_t>(r)];
    const PipelineGrid grid(r, 3, 3);
    StageLink link(comm, grid, kCpu);
    const auto [first, end] = stage_range(ends, r);
    PipelineStep step(mine, grid, link, first, end, PipelineSchedule::k1F1B, Precision::kFp32, kCpu);
    losses[static_cast<size_t>(r)] = step.run(bs, unscaled, [](bool) {}).item<double>();
    expect_stage_grads(mine, ref, first, end, 1.0);
  });
  expect_no_errors(errors);
  EXPECT_EQ(losses[0], 0.0) << "no experts in the first stage";
  EXPECT_GT(losses[1], 0.0) << "the middle stage's MoE layer's share of the balance loss";
  EXPECT_NEAR(losses[0] + losses[1] + losses[2], want, 1e-5 * want) << "summed over the stages: the model's loss";
}

TEST(PipelineStep, EvaluationSumsTheLossesWithoutGradients) {
  const auto spec = dense_spec();
  const auto bs = batches(3, spec.vocab_size);
  auto models = same_models(spec, 3);
  double want = 0;
  {
    torch::NoGradGuard no_grad;
    for (const auto& b : bs) want += models[2]->loss(models[2]->forward(b.inputs), b.targets).item<double>();
  }
  const auto errors = on_ranks(2, 2, port(15), [&](Comm& comm) {
    const int r = comm.rank();
    Model& mine = *models[static_cast<size_t>(r)];
    const PipelineGrid grid(r, 2, 2);
    StageLink link(comm, grid, kCpu);
    PipelineStep step(mine, grid, link, r == 0 ? 0 : 2, r == 0 ? 2 : 4, PipelineSchedule::k1F1B, Precision::kFp32,
                      kCpu);
    const double got = step.evaluate(bs).item<double>();
    if (r == 1) {
      EXPECT_NEAR(got, want, 1e-5 * want);
    } else {
      EXPECT_EQ(got, 0.0);
    }
    for (auto& [name, p] : mine.hf_parameters()) EXPECT_FALSE(p.grad().defined()) << name;
    // The link is left clean: a training step runs after it.
    const double trained = step.run(bs, unscaled, [](bool) {}).item<double>();
    if (r == 1) {
      EXPECT_NEAR(trained, want, 1e-5 * want);
    }
  });
  expect_no_errors(errors);
}

TEST(PipelineStep, TheGlobalNormSumsTheStagesSquaresOnce) {
  // Two stages of one replica: 3 and 4 make 5.
  expect_no_errors(on_ranks(2, 2, port(16), [](Comm& comm) {
    const auto norm = pipeline_global_norm(comm, torch::full({}, comm.rank() == 0 ? 3.0f : 4.0f));
    EXPECT_EQ(norm.dim(), 0);
    EXPECT_NEAR(norm.item<double>(), 5.0, 1e-6);
  }));
  // Two stages of two replicas: each stage's norm counted once, not once per replica.
  expect_no_errors(on_ranks(4, 2, port(17), [](Comm& comm) {
    const bool first_stage = comm.rank() / comm.replicas() == 0;
    const auto norm = pipeline_global_norm(comm, torch::full({}, first_stage ? 3.0 : 4.0, torch::kFloat64));
    EXPECT_EQ(norm.scalar_type(), torch::kFloat32);
    EXPECT_NEAR(norm.item<double>(), 5.0, 1e-6);
  }));
}

}  // namespace
}  // namespace tandem::test
