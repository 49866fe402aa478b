#include "tandem/run/pipeline_setup.h"

#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/dist/comm.h"
#include "tandem/dist/stage_link.h"
#include "tandem/models/model.h"
#include "tandem/models/stage_blocks.h"
#include "tandem/run/pipeline_step.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"
#include "tandem/sched/pipeline_schedule.h"

namespace tandem {

PipelineParts::PipelineParts() = default;
PipelineParts::PipelineParts(PipelineParts&&) noexcept = default;
PipelineParts& PipelineParts::operator=(PipelineParts&&) noexcept = default;
PipelineParts::~PipelineParts() = default;

namespace {

// What a pipeline does not compose with yet, refused before anything is built.
void check_pipeline_config(const Config& cfg, const RunContext& ctx, int64_t stages) {
  TANDEM_CHECK(ctx.comm != nullptr, "dist.pipeline_stages=", stages, " needs ", stages,
               " processes or more; start them with `tandem launch --nproc-per-node ", stages,
               " -- tandem train ...` (or torchrun), or set dist.pipeline_stages=1");
  TANDEM_CHECK(cfg.dist.zero_stage == 0,
               "dist.zero_stage=2 does not run with pipeline stages yet; set dist.zero_stage=0 (each stage's "
               "optimizer state is already 1/stages of the model's) or dist.pipeline_stages=1");
  TANDEM_CHECK(cfg.dist.balance == "equal", "dist.balance=", cfg.dist.balance,
               " does not run with pipeline stages yet; set dist.balance=equal or dist.pipeline_stages=1");
  TANDEM_CHECK(cfg.placement.policy == PlacementPolicyKind::kOff,
               "placement.policy runs in one process; set placement.policy=off or dist.pipeline_stages=1");
}

// Each stage's end Block: dist.pipeline_cut, else equal Block counts per stage.
std::vector<int64_t> stage_ends(const Config& cfg, const Model& model, int64_t stages) {
  const auto blocks = static_cast<int64_t>(model.block_count());
  if (!cfg.dist.pipeline_cut.empty()) return parse_pipeline_cut(cfg.dist.pipeline_cut, stages, blocks);
  return even_pipeline_cut(stages, blocks);
}

}  // namespace

PipelineParts open_pipeline(Model& model, const RunPlan& plan, RunContext& ctx) {
  const Config& cfg = plan.cfg;
  const int64_t stages = pipeline_stage_count(cfg.dist);
  PipelineParts parts;
  if (stages == 1) return parts;
  check_pipeline_config(cfg, ctx, stages);
  parts.grid = PipelineGrid(ctx.ranks.rank, ctx.world(), static_cast<int>(stages));
  parts.ends = stage_ends(cfg, model, stages);
  TANDEM_CHECK(!model.spec().tie_embeddings || parts.ends.front() == static_cast<int64_t>(model.block_count()),
               "the model ties its embedding and head, which stages ", 0, " and ", stages - 1,
               " would hold apart; set model.tie_embeddings=false or dist.pipeline_stages=1");
  ctx.comm->split_pipeline(static_cast<int>(stages));
  const int s = parts.grid.stage();
  const auto first = static_cast<size_t>(s == 0 ? 0 : parts.ends[static_cast<size_t>(s - 1)]);
  const auto end = static_cast<size_t>(parts.ends[static_cast<size_t>(s)]);
  parts.blocks = std::make_unique<StageBlocks>(model, first, end);
  parts.link = std::make_unique<StageLink>(ctx.comm->stage_link(), ctx.device);
  parts.step = std::make_unique<PipelineStep>(model, parts.grid, *parts.link, first, end, cfg.dist.pipeline_schedule,
                                              cfg.train.precision, ctx.device);
  if (ctx.main_rank() && cfg.train.grad_accum < 2 * stages)
    log::warn(strprintf("train.grad_accum=%lld micro-batches through %lld stages leaves them idle %.0f%% of a step "
                        "(1F1B's (p-1)/(m+p-1)); raise train.grad_accum to %lld or more",
                        static_cast<long long>(cfg.train.grad_accum), static_cast<long long>(stages),
                        100 * pipeline_bubble(stages, cfg.train.grad_accum), static_cast<long long>(4 * stages)));
  log::info(strprintf("rank %d: %s | %s, %lld micro-batches", ctx.ranks.rank, describe_stage(parts, model).c_str(),
                      to_string(cfg.dist.pipeline_schedule), static_cast<long long>(cfg.train.grad_accum)));
  return parts;
}

std::string describe_stage(const PipelineParts& parts, const Model& model) {
  const auto first = parts.blocks->first(), end = parts.blocks->end();
  return strprintf("stage %d of %d (Blocks %zu .. %zu of %zu: %s .. %s), replica %d of %d", parts.grid.stage(),
                   parts.grid.stages(), first, end - 1, model.block_count(), model.block_name(first).c_str(),
                   model.block_name(end - 1).c_str(), parts.grid.replica(), parts.grid.replicas());
}

}  // namespace tandem
