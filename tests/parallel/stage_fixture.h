#pragma once
// One rank's pipeline stage over a small Llama on the CPU, laid out as run/pipeline_setup lays it
// (grid, even cut, the stage's Blocks, its link and its step), for the tests of what a pipeline
// reports about its steps (tests/parallel/pipeline_report_test.cpp, pipeline_trace_test.cpp).

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "tandem/data/loader.h"
#include "tandem/models/model.h"
#include "tandem/models/stage_blocks.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/pipeline_grid.h"
#include "tandem/parallel/pipeline_parts.h"
#include "tandem/parallel/pipeline_step.h"
#include "tandem/parallel/stage_link.h"

namespace tandem::test {

struct StageFixture {
  std::shared_ptr<Model> model;
  PipelineParts parts;

  /// Every rank at once (the Comm split into `stages`): embedding, 2 layers and an untied head, cut
  /// evenly.
  StageFixture(Comm& comm, int stages, PipelineSchedule schedule) {
    ModelSpec s = preset_spec("tiny");
    s.n_layer = 2, s.d_model = 16, s.n_head = 2, s.n_kv_head = 2, s.d_ff = 32;
    s.vocab_size = 64, s.max_seq_len = 16, s.tie_embeddings = false;
    model = build_model(s, false);
    const c10::Device cpu(c10::kCPU);
    parts.grid = PipelineGrid(comm.rank(), comm.world(), stages);
    parts.ends = even_pipeline_cut(stages, static_cast<int64_t>(model->block_count()));
    const int stage = parts.grid.stage();
    const auto first = static_cast<size_t>(stage == 0 ? 0 : parts.ends[static_cast<size_t>(stage - 1)]);
    const auto end = static_cast<size_t>(parts.ends[static_cast<size_t>(stage)]);
    parts.blocks = std::make_unique<StageBlocks>(*model, first, end);
    parts.link = std::make_unique<StageLink>(comm, parts.grid, cpu);
    parts.step =
        std::make_unique<PipelineStep>(*model, parts.grid, *parts.link, first, end, schedule, Precision::kFp32, cpu);
  }

  /// Every rank at once: one step of `m` micro-batches of 2 rows of 8 tokens; this rank's times.
  StageTimes run_step(int64_t m) {
    std::vector<Batch> batches;
    for (int64_t i = 0; i < m; ++i) {
      Batch b;
      b.inputs = torch::randint(0, 64, {2, 8}, torch::kInt64);
      b.targets = torch::randint(0, 64, {2, 8}, torch::kInt64);
      b.index = i;
      batches.push_back(b);
    }
    parts.step->run(
        batches, [](const torch::Tensor& loss, int64_t) { return loss; }, [](bool) {});
    return parts.step->last_times();
  }
};

}  // namespace tandem::test
