#pragma once
// The training run: a short step loop over the collaborators of run/ (run_setup: where the run
// executes; run_plan: what it decided; engine_setup: the offload engine; data_parallel: this
// rank's rows; step_runner: one optimizer step; checkpointer: checkpoints; run_metrics: what it
// reports), on one device (CPU or one GPU) per process, one or many processes.

#include <string>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/run/run_plan.h"
#include "tandem/run/run_setup.h"

namespace tandem {

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

}  // namespace tandem
