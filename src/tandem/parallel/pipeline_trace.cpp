#include "tandem/parallel/pipeline_trace.h"

#include <algorithm>
#include <exception>
#include <limits>
#include <vector>

#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/models/model.h"
#include "tandem/monitor/chrome_trace.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/pipeline_parts.h"
#include "tandem/parallel/pipeline_step.h"
#include "tandem/sched/pipeline_schedule.h"

namespace tandem {
namespace {

// Stage s's track name: "stage 1: Blocks 3 .. 5 (layer.2 .. head)".
std::string stage_track(const PipelineParts& parts, const Model& model, int s) {
  const auto first = static_cast<size_t>(s == 0 ? 0 : parts.ends[static_cast<size_t>(s - 1)]);
  const auto last = static_cast<size_t>(parts.ends[static_cast<size_t>(s)]) - 1;
  return strprintf("stage %d: Blocks %zu .. %zu (%s .. %s)", s, first, last, model.block_name(first).c_str(),
                   model.block_name(last).c_str());
}

}  // namespace

void write_pipeline_trace(Comm& comm, const PipelineParts& parts, const Model& model, int64_t step,
                          int64_t micro_batches, const std::string& path) {
  const PipelineGrid& grid = parts.grid;
  const auto per_rank = static_cast<size_t>(4 * micro_batches);  // 2m passes, a start and an end each
  std::vector<double> mine(per_rank, 0.0);                       // zeros where a step ran no passes (none expected)
  const auto& timed = parts.step->last_times().passes;
  for (size_t i = 0; i < timed.size() && 2 * i + 1 < per_rank; ++i) {
    mine[2 * i] = timed[i].first;
    mine[2 * i + 1] = timed[i].second;
  }
  const auto all = comm.all_gather(mine);
  if (comm.rank() != 0) return;
  double origin = std::numeric_limits<double>::infinity();
  for (int s = 0; s < grid.stages(); ++s)
    origin = std::min(origin, all[per_rank * static_cast<size_t>(grid.rank_of(s, 0))]);
  ChromeTrace trace("tandem pipeline, step " + std::to_string(step));
  for (int s = 0; s < grid.stages(); ++s) {
    trace.name_thread(s, stage_track(parts, model, s));
    const double* t = all.data() + per_rank * static_cast<size_t>(grid.rank_of(s, 0));
    const auto passes = pipeline_passes(parts.step->schedule(), s, grid.stages(), micro_batches);
    for (size_t i = 0; i < passes.size(); ++i) {
      const char kind = passes[i].kind == PipelinePass::Kind::kForward ? 'F' : 'B';
      trace.span(s, kind + std::to_string(passes[i].micro), step, (t[2 * i] - origin) * 1e6,
                 (t[2 * i + 1] - origin) * 1e6);
    }
  }
  try {
    trace.write(path);
    log::info("pipeline trace of step " + std::to_string(step) + ": " + path);
  } catch (const std::exception& e) {
    log::warn(std::string("pipeline trace not written: ") + e.what());
  }
}

}  // namespace tandem
