#pragma once
// What a pipeline-parallel run reports per step (Note [Pipeline parallel]): each stage's work and
// wait, the measured bubble against the schedule's (p - 1) / (m + p - 1), and, once, the
// partitioner's predicted step against the measured one; the trace of chosen steps (Note
// [Pipeline trace]).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

class Comm;
class Model;
struct Config;
struct PipelineParts;

class PipelineReport {
 public:
  /// m = train.grad_accum; the steps of dist.pipeline_trace_steps are drawn into
  /// <run_dir>/pipeline_trace.json.
  PipelineReport(const PipelineParts& parts, const Model& model, const Config& cfg, const std::string& run_dir);
  /// Every rank, after step `step`, the run's `steps_run`-th (1 = the first), took `step_s`: the
  /// stages' times gathered into `row` (pipeline_stage_busy_s, pipeline_stage_wait_s,
  /// pipeline_bubble, and pipeline_bubble_ideal), the predicted step against the measured one in
  /// the log once, and the trace when `step` is a traced one.
  void add_step(Comm& comm, int64_t step, int64_t steps_run, double step_s, nlohmann::json& row);

 private:
  const PipelineParts& parts_;
  const Model& model_;
  int64_t micro_batches_;
  std::vector<int64_t> trace_steps_;
  std::string trace_path_;
  bool said_ = false;
};

}  // namespace tandem
