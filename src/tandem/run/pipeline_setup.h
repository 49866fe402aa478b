#pragma once
// A pipeline-parallel run's pieces on this rank built from the run's plan (Note [Pipeline
// parallel]): the stage count and the cut (given, or the partitioner's), then the grid, the stage's
// Blocks, its link and its step (parallel/pipeline_parts); refused with the fix when the run cannot
// be cut that way.

#include "tandem/parallel/pipeline_parts.h"

namespace tandem {

class Model;
struct RunContext;
struct RunPlan;

/// Empty parts when dist.pipeline_stages resolves to 1. Every rank at once (the process groups).
/// With the partitioner's cut, the memory plan of this rank's stage is settled here
/// (settle_stage_plan): refused with the numbers before the stage's buffers are allocated.
PipelineParts open_pipeline(Model& model, RunPlan& plan, RunContext& ctx);

}  // namespace tandem
