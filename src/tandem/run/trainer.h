#pragma once
// The step loop on one device (CPU or one GPU): autocast, loss scaling, accumulation,
// clipping, schedule, evaluation, checkpoints, metrics and progress.

#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "tandem/core/config.h"

namespace tandem {

/// What the CLI adds to a config for one invocation.
struct TrainOptions {
  std::string resume;  ///< checkpoint or run directory to continue from
};

/// The outcome of a run.
struct TrainSummary {
  std::string run_dir;
  std::string last_checkpoint;
  int64_t first_step = 0, final_step = 0;
  std::vector<double> losses;  ///< training loss of each step run, in order
  double last_eval_loss = -1;  ///< < 0 when never evaluated
  double median_tokens_per_s = 0;
  double median_step_time_s = 0;
  int64_t peak_device_bytes = 0, peak_host_bytes = 0;
  int64_t skipped_steps = 0;
  int64_t oom_retries = 0;       ///< steps retried with a halved micro-batch (Note [Adaptive micro-batch])
  bool interrupted = false;      ///< stopped early on request (a signal): checkpointed, resumable
  std::string checkpoint_error;  ///< the last checkpoint that failed, and why ("" when none did)
  bool unsaved = false;          ///< the final checkpoint (or every checkpoint) failed: the run's end is not saved
};

/// Trains according to a configuration; throws UserError for bad input before any work is lost.
TrainSummary train(Config config, const TrainOptions& options);

/// train.device: auto (the first GPU, else the CPU), cpu, cuda or cuda:N; UserError otherwise.
torch::Device resolve_device(const std::string& s);

}  // namespace tandem
