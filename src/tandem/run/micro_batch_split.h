#pragma once
// Note [Adaptive micro-batch]: how many parts a micro-batch is cut into after out-of-memory
// errors, and when it grows back. The one policy of the CLI's trainer (StepRunner) and the Python
// engine's train_step (both through StepDriver).

#include <algorithm>
#include <cstdint>
#include <string>

#include "tandem/core/config.h"

namespace tandem {

class MicroBatchSplit {
 public:
  /// train.oom_retry and train.oom_grow_after decide; a run starts uncut.
  explicit MicroBatchSplit(const TrainConfig& train);

  /// The parts a micro-batch of `rows` rows is cut into now (never more than its rows).
  int64_t parts(int64_t rows) const { return std::min(parts_, rows); }
  /// After an out-of-memory error at step `step` + 1 (`what`: the error's line) in micro-batches of
  /// `rows` rows: twice the parts from now on. UserError naming the fix when train.oom_retry is off
  /// or every part is one row already.
  void split_further(int64_t step, const std::string& what, int64_t rows);
  /// After a step that ran: the rows of each part while micro-batches are cut (0 when they are
  /// not), then the grow-back after train.oom_grow_after clean steps; `grew` says whether it grew.
  int64_t after_step(bool* grew = nullptr);
  /// The rows of each part of a micro-batch now (the rows last given while cut).
  int64_t part_rows() const { return (rows_ + parts_ - 1) / parts_; }
  /// The micro-batches of a step of `grad_accum` now, each part counted.
  int64_t accumulation(int64_t grad_accum) const { return grad_accum * parts_; }
  bool cut() const { return parts_ > 1; }
  /// Steps run again after an out-of-memory error.
  int64_t retries() const { return retries_; }

 private:
  bool retry_;
  int64_t grow_after_;
  int64_t parts_ = 1, rows_ = 1, clean_steps_ = 0, retries_ = 0;
};

}  // namespace tandem
