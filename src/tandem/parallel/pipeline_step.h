#pragma once
// One step's micro-batches through this rank's pipeline stage (Note [Pipeline parallel], Note
// [Pipeline schedules]): forwards and backwards in the schedule's order, activations received from
// the previous stage and sent to the next, their gradients the other way, the loss on the last
// stage; and the stage's time split into work and waiting (the bubble).

#include <c10/core/Event.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/data/loader.h"
#include "tandem/parallel/pipeline_grid.h"
#include "tandem/sched/pipeline_schedule.h"

namespace tandem {

class Comm;
class Model;
class StageLink;

/// What a stage did in one step (Note [Pipeline pass timing]).
struct StageTimes {
  double section_s = 0;  ///< from the first pass's start to the last one's end
  double wait_s = 0;     ///< idle within the section: waiting for a neighbour's activation or gradient
  /// Each pass's start and end on the wall clock (seconds since the epoch), in the schedule's order
  /// (pipeline_passes()).
  std::vector<std::pair<double, double>> passes;
};

class PipelineStep {
 public:
  /// Stage grid.stage() runs Blocks [first, end) of `model`.
  PipelineStep(Model& model, const PipelineGrid& grid, StageLink& link, size_t first, size_t end,
               PipelineSchedule schedule, Precision precision, c10::Device device);

  /// The step's micro-batches (every stage draws the same ones; the first stage reads the inputs,
  /// the last the targets). `scaled(loss, micro)`: the loss backward starts from (weights, loss
  /// scale); `before_backward(last)`: called before each backward, `last` for the step's final one.
  /// Returns the sum of the micro-batches' losses on the last stage, elsewhere of the stage's share
  /// of the MoE balance loss (Model::balance_loss; zero without experts): summed over the stages, the loss.
  torch::Tensor run(const std::vector<Batch>& batches,
                    const std::function<torch::Tensor(const torch::Tensor& loss, int64_t micro)>& scaled,
                    const std::function<void(bool last)>& before_backward);
  /// Forward only, without gradients: the sum of the batches' losses, split over the stages as run()'s.
  torch::Tensor evaluate(const std::vector<Batch>& batches);

  /// The last step's times; on a GPU read from its events, so only once the step's work is done
  /// (after the step's host synchronisation).
  const StageTimes& last_times();
  const PipelineGrid& grid() const { return grid_; }
  PipelineSchedule schedule() const { return schedule_; }
  size_t first() const { return first_; }
  size_t end() const { return end_; }

 private:
  struct InFlight {
    torch::Tensor input, output, loss;
    torch::Tensor balance;  ///< a stage before the last: its scaled balance loss, a second backward root
  };
  void forward(const Batch& b, int64_t micro, InFlight& f,
               const std::function<torch::Tensor(const torch::Tensor&, int64_t)>& scaled);
  void backward(int64_t micro, InFlight& f);

  void begin_compute();  // Note [Pipeline pass timing]: the pass's start, after its message
  void time_passes_on_device();

  Model& model_;
  PipelineGrid grid_;
  StageLink& link_;
  size_t first_, end_;
  PipelineSchedule schedule_;
  Precision precision_;
  c10::Device device_;
  StageTimes times_;
  std::vector<std::pair<c10::Event, c10::Event>> pass_events_;  // on a GPU: each pass's start and end, not yet read
};

/// The global gradient norm (0-d) from this stage's (equal on the stage's replicas, after their
/// reduction): the stages' squares summed over the world, on the device, without a host sync.
torch::Tensor pipeline_global_norm(Comm& comm, const torch::Tensor& stage_norm);

}  // namespace tandem
