#include "tandem/run/trainable.h"

#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/models/model.h"
#include "tandem/models/stage_blocks.h"
#include "tandem/optim/optimizer.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/grad_reducer.h"
#include "tandem/parallel/pipeline_checkpoint.h"
#include "tandem/run/checkpointer.h"
#include "tandem/run/pipeline_setup.h"
#include "tandem/run/run_metrics.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"

namespace tandem {

Trainable::Trainable() = default;
Trainable::Trainable(Trainable&&) noexcept = default;
Trainable::~Trainable() = default;

Optimizer& Trainable::optimizer() { return gathered ? static_cast<Optimizer&>(*gathered) : *stage_optimizer; }

StepTargets Trainable::targets() {
  StepTargets t;
  t.optimizer = &optimizer();
  t.engine = engine();
  t.store = offload.store.get();
  t.reducer = reducer.get();
  t.placement = offload.placement.get();
  t.params = params;
  return t;
}

namespace {

// A stage's Blocks under the offload engine, as the stage's memory plan splits them (Note [Plan layout]).
OffloadParts build_stage_offload(Model& model, StageBlocks& stage, const RunPlan& plan, const RunContext& ctx,
                                 RunMetrics& metrics, double build_s) {
  for (auto& b : model.buffers()) b.set_data(b.to(ctx.device));
  TANDEM_ASSERT(plan.gpu_blocks >= 0 && plan.gpu_blocks <= static_cast<int64_t>(stage.block_count()),
                "the stage's plan updates ", plan.gpu_blocks, " of its ", stage.block_count(), " Blocks on the device");
  OffloadSetup setup{plan.cfg, plan.gpu_blocks, plan.split_range, plan.run_dir};
  return build_offload(stage, setup, ctx, metrics.trace_counters(), build_s);
}

// The stage's Blocks (or the whole model) on the device, with their parameters.
std::vector<NamedTensor> place_on_device(Model& model, PipelineParts& pipeline, const RunContext& ctx) {
  if (!pipeline.on()) {
    model.to(ctx.device);
    return model.hf_parameters();
  }
  for (auto& b : model.buffers()) b.set_data(b.to(ctx.device));
  for (size_t i = pipeline.blocks->first(); i < pipeline.blocks->end(); ++i) model.blocks()[i]->to(ctx.device);
  return pipeline.blocks->hf_parameters();
}

}  // namespace

Trainable build_trainable(Model& model, PipelineParts& pipeline, const RunPlan& plan, const RunContext& ctx,
                          RunMetrics& metrics, double build_s) {
  const Config& cfg = plan.cfg;
  Trainable t;
  if (plan.offload) {
    t.offload = pipeline.on() ? build_stage_offload(model, *pipeline.blocks, plan, ctx, metrics, build_s)
                              : build_offload(model, plan, ctx, metrics.trace_counters(), build_s);
    t.stage_optimizer = std::make_unique<EngineOptimizer>(*t.offload.engine, cfg.dist.zero_stage == 2);
  } else {
    const std::vector<NamedTensor> params = place_on_device(model, pipeline, ctx);
    for (const auto& [name, p] : params) t.params.push_back(p);
    t.stage_optimizer = make_optimizer(cfg.optim, params, ctx.device);
  }
  if (pipeline.on()) t.gathered = std::make_unique<GatheredOptimizer>(*t.stage_optimizer);
  // Note [Gradient reducer]: the replicas (of the stage) sum their gradients; the engine does its own.
  if (ctx.comm && !t.engine() && ctx.comm->replicas() > 1) {
    BlockSequence& blocks = pipeline.on() ? static_cast<BlockSequence&>(*pipeline.blocks) : model;
    t.reducer = std::make_unique<GradReducer>(blocks, *ctx.comm);
  }
  return t;
}

}  // namespace tandem
