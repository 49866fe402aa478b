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

std::string describe_passes(const std::vector<PipelinePass>& passes) {
  std::string s;
  for (const auto& p : passes) {
    if (!s.empty()) s += ' ';
    s += (p.kind == PipelinePass::Kind::kForward ? "F" : "B") + std::to_string(p.micro);
  }
  return s;
}

}  // namespace tandem
