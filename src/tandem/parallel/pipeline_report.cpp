#include "tandem/parallel/pipeline_report.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/pipeline_parts.h"
#include "tandem/parallel/pipeline_step.h"
#include "tandem/parallel/pipeline_trace.h"
#include "tandem/sched/pipeline_schedule.h"

namespace tandem {
namespace {

// Value `field` of each stage's first replica, from every rank's `width` values gathered rank after
// rank (the world is stage-major).
std::vector<double> per_stage(const std::vector<double>& per_rank, size_t width, size_t field,
                              const PipelineGrid& grid) {
  std::vector<double> out;
  for (int s = 0; s < grid.stages(); ++s)
    out.push_back(per_rank[static_cast<size_t>(grid.rank_of(s, 0)) * width + field]);
  return out;
}

constexpr int64_t kCompareAfter = 4;  // steps measured before the prediction is checked (warm-up)

}  // namespace

PipelineReport::PipelineReport(const PipelineParts& parts, const Model& model, const Config& cfg,
                               const std::string& run_dir)
    : parts_(parts),
      model_(model),
      micro_batches_(cfg.train.grad_accum),
      trace_steps_(parse_step_list(cfg.dist.pipeline_trace_steps, "dist.pipeline_trace_steps")),
      trace_path_((std::filesystem::path(run_dir) / "pipeline_trace.json").string()) {}

void PipelineReport::add_step(Comm& comm, int64_t step, int64_t steps_run, double step_s, nlohmann::json& row) {
  if (std::find(trace_steps_.begin(), trace_steps_.end(), step) != trace_steps_.end())
    write_pipeline_trace(comm, parts_, model_, step, micro_batches_, trace_path_);
  const StageTimes& t = parts_.step->last_times();
  const auto all =
      comm.all_gather(std::vector<double>{t.section_s - t.wait_s, t.wait_s, t.section_s});  // one collective
  const auto busy = per_stage(all, 3, 0, parts_.grid);
  const auto wait = per_stage(all, 3, 1, parts_.grid);
  const auto section = per_stage(all, 3, 2, parts_.grid);
  // The stages' idle share of the pipeline's span (the slowest stage's section): a stage that
  // finishes early idles until the step's end too.
  const double span = *std::max_element(section.begin(), section.end());
  const double mean_busy = std::accumulate(busy.begin(), busy.end(), 0.0) / double(busy.size());
  const double bubble = span > 0 ? 1.0 - mean_busy / span : 0.0;
  row["pipeline_stage_busy_s"] = busy;
  row["pipeline_stage_wait_s"] = wait;
  row["pipeline_bubble"] = bubble;
  row["pipeline_bubble_ideal"] = pipeline_bubble(parts_.grid.stages(), micro_batches_);
  row["pipeline_bubble_schedule"] = pipeline_bubble(busy, micro_batches_);
  if (said_ || steps_run < kCompareAfter || comm.rank() != 0) return;
  said_ = true;
  std::string busy_list;
  for (const double b : busy) busy_list += strprintf("%s%.3f", busy_list.empty() ? "" : " ", b);
  const std::string predicted =
      parts_.predicted_step_s > 0 ? strprintf("predicted %.3f s, ", parts_.predicted_step_s) : std::string();
  log::info(
      strprintf("pipeline: step %smeasured %.3f s | stages busy %s s | bubble %.1f%% (1F1B's (p-1)/(m+p-1): "
                "%.1f%%)",
                predicted.c_str(), step_s, busy_list.c_str(), 100 * bubble,
                100 * pipeline_bubble(parts_.grid.stages(), micro_batches_)));
}

}  // namespace tandem
