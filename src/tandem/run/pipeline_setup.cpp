#include "tandem/run/pipeline_setup.h"

#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/models/model.h"
#include "tandem/models/stage_blocks.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/pipeline_profile.h"
#include "tandem/parallel/pipeline_step.h"
#include "tandem/parallel/stage_link.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"
#include "tandem/sched/pipeline_partition.h"
#include "tandem/sched/pipeline_schedule.h"

namespace tandem {
namespace {

// What a pipeline does not compose with yet: the reason and its fix, or "" when it runs.
std::string pipeline_refusal(const Config& cfg) {
  if (cfg.dist.balance.kind != RowBalance::Kind::kEqual)
    return "dist.balance=" + cfg.dist.balance.str() +
           " does not run with pipeline stages yet; set dist.balance=equal or dist.pipeline_stages=1";
  if (cfg.placement.policy != PlacementPolicyKind::kOff)
    return "placement.policy runs in one process; set placement.policy=off or dist.pipeline_stages=1";
  return {};
}

// The stage count and each stage's end Block, the same on every rank.
struct StageCut {
  int64_t stages = 1;
  std::vector<int64_t> ends;
  double predicted_step_s = 0;  // the partitioner's, 0 for a cut given
};

// Every rank's device as a stage device (Note [Pipeline profile]), in rank order on every rank.
std::vector<PipelineDevice> gather_devices(Comm& comm, const PipelineDevice& mine, const c10::Device& device) {
  constexpr size_t kFields = 5;  // kind, index, speed, memory, busy power (-1: none)
  const auto all = comm.all_gather(std::vector<double>{device.is_cuda() ? 1.0 : 0.0,
                                                       device.has_index() ? double(device.index()) : 0.0, mine.speed,
                                                       double(mine.memory_bytes), mine.busy_w.value_or(-1.0)});
  std::vector<PipelineDevice> out(all.size() / kFields);
  for (size_t r = 0; r < out.size(); ++r) {
    const double* f = all.data() + r * kFields;
    out[r].name = f[0] > 0 ? strprintf("cuda:%d", static_cast<int>(f[1])) : std::string("cpu");
    out[r].speed = f[2];
    out[r].memory_bytes = static_cast<int64_t>(f[3]);
    if (f[4] >= 0) out[r].busy_w = f[4];
  }
  return out;
}

// The partitioner's cut (Note [Pipeline partition]): rank 0 profiles the Blocks on its device and
// plans over every rank's measured device; the others take its cut, or its refusal.
StageCut partitioner_cut(Model& model, const RunPlan& plan, RunContext& ctx) {
  const Config& cfg = plan.cfg;
  const auto devices =
      gather_devices(*ctx.comm, measure_pipeline_device(model, cfg, plan.seq_len, ctx.device), ctx.device);
  std::vector<double> msg(2 + model.block_count(), 0.0);
  std::string error;
  if (ctx.main_rank()) {
    try {
      std::string table;
      const PipelinePlan p = plan_pipeline(model, cfg, plan.seq_len, devices, &table);
      log::info("pipeline partition (dist.pipeline_stages=" + cfg.dist.pipeline_stages + "):\n" + table);
      const auto ends = stage_ends(p);
      msg[0] = double(ends.size());
      msg[1] = p.step_s;
      std::copy(ends.begin(), ends.end(), msg.begin() + 2);
    } catch (const UserError& e) {
      error = e.what();
    }
  }
  error = ctx.comm->broadcast_string("pipeline_plan_error", error);
  if (!error.empty()) throw UserError(error);
  msg = ctx.comm->from_rank0(msg);
  StageCut cut{static_cast<int64_t>(msg[0]), {}, msg[1]};
  for (int64_t s = 0; s < cut.stages; ++s) cut.ends.push_back(static_cast<int64_t>(msg[static_cast<size_t>(2 + s)]));
  return cut;
}

// dist.pipeline_cut (a list, or "even") or, when it is empty, the partitioner's.
StageCut choose_stage_cut(Model& model, const RunPlan& plan, RunContext& ctx) {
  if (auto given = configured_pipeline_cut(plan.cfg.dist, static_cast<int64_t>(model.block_count())))
    return {static_cast<int64_t>(given->size()), *given};
  return partitioner_cut(model, plan, ctx);
}

// Refusals that need no measurement, on every rank alike.
void check_stage_count(const Config& cfg, const Model& model, const RunContext& ctx, int64_t stages) {
  TANDEM_CHECK(ctx.comm != nullptr, "dist.pipeline_stages=", stages, " needs ", stages,
               " processes or more; start them with `tandem launch --nproc-per-node ", stages,
               " -- tandem train ...` (or torchrun), or set dist.pipeline_stages=1");
  const std::string refusal = pipeline_refusal(cfg);
  if (!refusal.empty()) throw UserError(refusal);
  PipelineGrid(ctx.ranks.rank, ctx.world(), static_cast<int>(stages));  // a world the count divides
  pipeline_stage_counts(stages, ctx.world(), static_cast<int64_t>(model.block_count()), model.spec().tie_embeddings);
}

// dist.pipeline_stages=auto where a pipeline cannot run: one stage, and why.
bool auto_stays_one_stage(const Config& cfg, const RunContext& ctx) {
  const std::string refusal = ctx.comm == nullptr ? std::string("one process") : pipeline_refusal(cfg);
  if (refusal.empty()) return false;
  if (ctx.main_rank()) log::info("dist.pipeline_stages=auto: one stage (" + refusal + ")");
  return true;
}

void warn_of_bubble(const Config& cfg, int64_t stages) {
  if (cfg.train.grad_accum >= 2 * stages) return;
  log::warn(
      strprintf("train.grad_accum=%lld micro-batches through %lld stages leaves them idle %.0f%% of a step "
                "(1F1B's (p-1)/(m+p-1)); raise train.grad_accum to %lld or more",
                static_cast<long long>(cfg.train.grad_accum), static_cast<long long>(stages),
                100 * pipeline_bubble(stages, cfg.train.grad_accum), static_cast<long long>(4 * stages)));
}

}  // namespace

PipelineParts open_pipeline(Model& model, RunPlan& plan, RunContext& ctx) {
  const Config& cfg = plan.cfg;
  const int64_t stages = pipeline_stage_count(cfg.dist);
  PipelineParts parts;
  if (stages == 1 || (stages == 0 && auto_stays_one_stage(cfg, ctx))) return parts;
  if (stages > 1) check_stage_count(cfg, model, ctx, stages);
  const StageCut cut = choose_stage_cut(model, plan, ctx);
  if (cut.stages == 1) return parts;
  parts.grid = PipelineGrid(ctx.ranks.rank, ctx.world(), static_cast<int>(cut.stages));
  parts.ends = cut.ends;
  parts.predicted_step_s = cut.predicted_step_s;
  TANDEM_CHECK(!model.spec().tie_embeddings, "the model ties its embedding and head, which stages 0 and ",
               cut.stages - 1, " would hold apart; set model.tie_embeddings=false or dist.pipeline_stages=1");
  settle_stage_plan(plan, parts.ends, ctx);  // Note [Plan layout]
  ctx.comm->split_pipeline(static_cast<int>(cut.stages));
  const int s = parts.grid.stage();
  const auto first = static_cast<size_t>(s == 0 ? 0 : parts.ends[static_cast<size_t>(s - 1)]);
  const auto end = static_cast<size_t>(parts.ends[static_cast<size_t>(s)]);
  parts.blocks = std::make_unique<StageBlocks>(model, first, end);
  parts.link = std::make_unique<StageLink>(*ctx.comm, parts.grid, ctx.device);
  parts.step = std::make_unique<PipelineStep>(model, parts.grid, *parts.link, first, end, cfg.dist.pipeline_schedule,
                                              cfg.train.precision, ctx.device);
  if (ctx.main_rank()) warn_of_bubble(cfg, cut.stages);
  log::info(strprintf("rank %d: %s | %s, %lld micro-batches", ctx.ranks.rank, describe_stage(parts, model).c_str(),
                      to_string(cfg.dist.pipeline_schedule), static_cast<long long>(cfg.train.grad_accum)));
  return parts;
}

}  // namespace tandem
