#pragma once
// The order of one pipeline stage's forward and backward passes over a step's micro-batches
// (Note [Pipeline schedules]). Torch-free.
//
// Note [Pipeline schedules]
// A step runs m micro-batches through p stages. Stage s's passes, for micro-batch i:
//   GPipe: F0 F1 .. F(m-1), then B0 B1 .. B(m-1). Every activation of the step is alive on every
//          stage when the first backward starts.
//   1F1B:  min(p - s - 1, m) warm-up forwards, then one forward and one backward in turn
//          (F(w+j) B(j)), then the remaining backwards. Stage s holds at most p - s micro-batches'
//          activations, so memory stays bounded whatever m is.
// Both leave every stage idle for (p - 1) micro-batch times of a step of m + p - 1 (equal stages):
// the bubble fraction (p - 1) / (m + p - 1). Each stage ends with B(m - 1), the backward that
// completes its gradients (the engine streams and the data-parallel group reduces them there).
// Sends are asynchronous and receives blocking: the order above never has two neighbours both
// waiting to receive from each other. Activations and gradients travel over a group each (Note
// [Stage links]): 1F1B's sends and receives interleave differently on neighbouring stages, which
// NCCL cannot run over one group.

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/core/config.h"  // PipelineSchedule

namespace tandem {

struct PipelinePass {
  enum class Kind { kForward, kBackward } kind;
  int64_t micro = 0;
  bool operator==(const PipelinePass& o) const { return kind == o.kind && micro == o.micro; }
};

/// Stage `stage`'s passes, in order, for `micro_batches` micro-batches through `stages` stages.
std::vector<PipelinePass> pipeline_passes(PipelineSchedule schedule, int64_t stage, int64_t stages,
                                          int64_t micro_batches);

/// The idle share of a step of equal stages: (p - 1) / (m + p - 1).
double pipeline_bubble(int64_t stages, int64_t micro_batches);

/// The idle share of a step whose stages are busy `stage_busy_s` each, every micro-batch's passes
/// on stage s taking stage_busy_s[s] / m: the span is the sum of one micro-batch's times plus
/// (m - 1) of the slowest stage's. Equal stages give (p - 1) / (m + p - 1); unequal ones more,
/// with no time lost to sends and receives.
double pipeline_bubble(const std::vector<double>& stage_busy_s, int64_t micro_batches);

/// "F0 F1 B0 F2 B1 B2" (for logs and tests).
std::string describe_passes(const std::vector<PipelinePass>& passes);

}  // namespace tandem
