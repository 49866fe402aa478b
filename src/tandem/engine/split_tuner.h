#pragma once
// The update split's tuner in the engine (Note [Update split], Note [Split tuner]): when a solve is
// due, the step times measured since the last one, the per-Block forward and backward times and the
// per-parameter update and copy costs read from the step's stamps and the CPU updater's clock (or
// calibrated with scratch buffers where no Block of a side measures them yet), the solve through
// sched/update_split within the memory plan's range, and the Blocks moved when the split changes.
// Owns those measurements and the split's status; the engine calls it between steps.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tandem/engine/param_store.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/sched/update_split.h"

namespace tandem {

struct StepStamps;
struct TransferStreams;

/// The update split in force and what the solver said about it.
struct SplitStatus {
  int64_t gpu_blocks = 0;
  double k = 0;                     ///< gpu_blocks / Blocks
  double alpha = 0;                 ///< GPU / CPU update cost per parameter, measured
  double predicted_step_s = 0;      ///< the model's step time for the split in force
  double measured_step_s = 0;       ///< median step time measured before the last solve (its split)
  double predicted_measured_s = 0;  ///< the model's time for that measured split
  bool solved = false;
};

struct SplitTunerOptions {
  bool solve = false;                           ///< false: the split stays as built
  std::optional<double> fixed_k;                ///< the user's k; nullopt = the fastest predicted split
  int64_t min_gpu_blocks = 0;                   ///< the memory plan's range for the GPU-updated prefix (store Blocks)
  int64_t max_gpu_blocks = -1;                  ///< -1 = every Block
  int64_t first_solve_step = 3;                 ///< steps measured before the first solve
  int64_t resolve_every = 0;                    ///< re-solve every N steps after that (0 = once)
  UpdateHyper hyper;                            ///< the CPU kernel's coefficients, for calibrating it
  CpuThreadPool* pool = nullptr;                ///< the CPU updates' threads, for calibrating them
  Comm* comm = nullptr;                         ///< several ranks: a stage's replicas apply its first replica's split
  std::function<void(const std::string&)> log;  ///< one line per solve
};

/// What a solve reads besides the stamps.
struct SplitInputs {
  int64_t step = 0;                ///< steps begun, for the log
  double cpu_update_s = 0;         ///< the CPU updater's cumulative kernel time ...
  int64_t cpu_updated_params = 0;  ///< ... and parameters updated
  SplitCosts::CpuStart cpu_start = SplitCosts::CpuStart::kAsGradientsArrive;  ///< the engine's mode now
};

/// Per-parameter costs measured with scratch buffers (0 = not measured).
struct CalibratedCosts {
  double cpu = 0, gpu = 0, d2h = 0, h2d = 0;
};

class SplitTuner {
 public:
  /// `streams` is null with the CPU as the device.
  SplitTuner(ParamStore& store, const StepStamps& stamps, const TransferStreams* streams, SplitTunerOptions options);

  /// At the start of a step, `begun` steps begun before it: records the time since the previous
  /// start and says whether a solve is due before this step.
  bool begin_step(int64_t begun);
  /// One more solve before step `begun` (as begin_step counts), whatever resolve_every says.
  void solve_again(int64_t begun) { extra_solve_ = begun; }
  /// Solves from the last step's stamps (its work complete, the streams idle) and `in`, and moves
  /// Blocks between the sides when the split changes.
  /// `before_move` runs first when Blocks move (the engine's delayed weights go up then).
  void solve(const SplitInputs& in, const std::function<void()>& before_move = nullptr);
  const SplitStatus& status() const { return status_; }
  const CalibratedCosts& calibrated() const { return cal_; }
  /// The top of the range the split may move in, measured at run time (Note [Python engine]);
  /// the next solve uses it.
  void set_max_gpu_blocks(int64_t max_gpu_blocks) { options_.max_gpu_blocks = max_gpu_blocks; }
  int64_t max_gpu_blocks() const { return options_.max_gpu_blocks; }

 private:
  std::vector<BlockTiming> block_timing() const;
  void calibrate(int64_t cpu_params, int64_t gpu_params);
  SplitCosts costs(const SplitInputs& in, int64_t cpu_params, int64_t gpu_params);
  int64_t choose(const std::vector<BlockTiming>& timing, const SplitCosts& c, int64_t current);
  void log_solve(const SplitInputs& in, const SplitCosts& c, int64_t current) const;

  ParamStore& store_;
  const StepStamps& stamps_;
  const TransferStreams* const streams_;
  SplitTunerOptions options_;
  int64_t extra_solve_ = -1;
  SplitStatus status_;
  std::chrono::steady_clock::time_point last_begin_{};
  std::vector<double> step_times_;  // since the last solve
  CalibratedCosts cal_;
  double live_cpu_s_ = 0;  // the updater's counters at the last solve
  int64_t live_cpu_params_ = 0;
};

}  // namespace tandem
