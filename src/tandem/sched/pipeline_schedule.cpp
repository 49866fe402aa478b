#include "tandem/sched/pipeline_schedule.h"

#include <algorithm>

namespace tandem {

std::vector<PipelinePass> pipeline_passes(PipelineSchedule schedule, int64_t stage, int64_t stages,
                                          int64_t micro_batches) {
  using K = PipelinePass::Kind;
  std::vector<PipelinePass> out;
  const int64_t m = micro_batches;
  const int64_t warm_up = schedule == PipelineSchedule::kGPipe ? m : std::min(stages - stage - 1, m);
  for (int64_t i = 0; i < warm_up; ++i) out.push_back({K::kForward, i});
  for (int64_t j = 0; warm_up + j < m; ++j) {
    out.push_back({K::kForward, warm_up + j});
    out.push_back({K::kBackward, j});
  }
  for (int64_t j = std::max<int64_t>(0, m - warm_up); j < m; ++j) out.push_back({K::kBackward, j});
  return out;
}

double pipeline_bubble(int64_t stages, int64_t micro_batches) {
  return double(stages - 1) / double(micro_batches + stages - 1);
}

double pipeline_bubble(const std::vector<double>& stage_busy_s, int64_t micro_batches) {
  if (stage_busy_s.empty() || micro_batches < 1) return 0.0;
  const double m = double(micro_batches);
  double sum = 0, slowest = 0;
  for (const double b : stage_busy_s) {
    sum += b / m;
    slowest = std::max(slowest, b / m);
  }
  const double span = sum + (m - 1) * slowest;
  const double mean_busy = sum * m / double(stage_busy_s.size());
  return span > 0 ? 1.0 - mean_busy / span : 0.0;
}

std::string describe_passes(const std::vector<PipelinePass>& passes) {
  std::string s;
  for (const auto& p : passes) {
    if (!s.empty()) s += ' ';
    s += (p.kind == PipelinePass::Kind::kForward ? "F" : "B") + std::to_string(p.micro);
  }
  return s;
}

}  // namespace tandem
