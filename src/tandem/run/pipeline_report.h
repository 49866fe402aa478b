#pragma once
// What a pipeline-parallel run reports per step (Note [Pipeline parallel]): each stage's work and
// wait, the measured bubble against the schedule's (p - 1) / (m + p - 1), and, once, the
// partitioner's predicted step against the measured one.

#include <nlohmann/json.hpp>

#include <cstdint>

namespace tandem {

class Comm;
struct PipelineParts;

class PipelineReport {
 public:
  PipelineReport(const PipelineParts& parts, int64_t micro_batches);
  /// Every rank, after step `steps_run` (1 = the run's first) took `step_s`: the stages' times
  /// gathered into `row` (pipeline_stage_busy_s, pipeline_stage_wait_s, pipeline_bubble, and
  /// pipeline_bubble_ideal), and the predicted step against the measured one in the log once.
  void add_step(Comm& comm, int64_t steps_run, double step_s, nlohmann::json& row);

 private:
  const PipelineParts& parts_;
  int64_t micro_batches_;
  bool said_ = false;
};

}  // namespace tandem
