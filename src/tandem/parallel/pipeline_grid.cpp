#include "tandem/parallel/pipeline_grid.h"

#include "tandem/core/config_values.h"
#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {

PipelineGrid::PipelineGrid(int rank, int world, int stages) : rank_(rank), stages_(stages) {
  TANDEM_CHECK(stages >= 1, "dist.pipeline_stages must be >= 1, got ", stages);
  TANDEM_CHECK(world % stages == 0, "dist.pipeline_stages=", stages, " does not divide the world of ", world,
               " ranks; start a multiple of ", stages, " ranks or choose a stage count that divides ", world);
  replicas_ = world / stages;
}

std::vector<int> PipelineGrid::replica_ranks() const {
  std::vector<int> out;
  for (int d = 0; d < replicas_; ++d) out.push_back(rank_of(stage(), d));
  return out;
}

std::string PipelineGrid::describe() const {
  return strprintf("stage %d of %d, replica %d of %d", stage(), stages_, replica(), replicas_);
}

std::vector<int64_t> even_pipeline_cut(int64_t stages, int64_t blocks) {
  TANDEM_CHECK(stages <= blocks, "dist.pipeline_stages=", stages, " is more stages than the model's ", blocks,
               " Blocks; use at most ", blocks, " stages");
  std::vector<int64_t> ends;
  int64_t end = 0;
  for (int64_t s = 0; s < stages; ++s) {
    end += blocks / stages + (s < blocks % stages ? 1 : 0);
    ends.push_back(end);
  }
  return ends;
}

std::vector<int64_t> given_pipeline_cut(const std::vector<int64_t>& cut, int64_t stages, int64_t blocks) {
  TANDEM_CHECK(stages <= blocks, "dist.pipeline_stages=", stages, " is more stages than the model's ", blocks,
               " Blocks; use at most ", blocks, " stages");
  const std::string written = PipelineCut{PipelineCut::Kind::kGiven, cut}.str();
  TANDEM_CHECK(static_cast<int64_t>(cut.size()) == stages - 1, "dist.pipeline_cut='", written, "' gives ", cut.size(),
               " ends for ", stages, " stages; give ", stages - 1, " (the last stage ends at the model's end)");
  std::vector<int64_t> ends = cut;
  ends.push_back(blocks);
  int64_t previous = 0;
  for (const int64_t e : ends) {
    TANDEM_CHECK(e > previous && e <= blocks, "dist.pipeline_cut='", written, "' must rise strictly within 1 .. ",
                 blocks - 1, " so that every stage has a Block");
    previous = e;
  }
  return ends;
}

}  // namespace tandem
