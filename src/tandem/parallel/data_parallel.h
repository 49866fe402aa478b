#pragma once
// Note [Data parallel]
// Under a launcher (parallel/rank_info.h) every rank trains the same model on its own rows of each
// global micro-batch: rank r takes rows [first_r, first_r + rows_r) of the batch one process with
// train.micro_batch x world rows would draw (the sampler is counter-based per row), weights its
// loss by rows_r / global rows, and the gradients are summed (the engine's per-Block reduction,
// or GradReducer). Steps therefore equal one process's with the same global batch, up to the
// summation order. The ranks check that they run one config (its hash) before the first step and
// take rank 0's run directory, memory plan and update split, so their collectives match. Rank 0
// alone writes the run directory's files; checkpoints are whole (replicated state, rank 0 writes)
// or sharded (Note [Sharded checkpoints]). With dist.balance the rows per rank may differ (unequal
// GPUs): given as a list, or measured (auto: after dist.balance_after steps each rank's compute
// time per row and its memory room set the rows once, sched/batch_balance.h). Local ranks divide
// the host's cores (Note [Core division]); the CPU update kernels use their rank's range, so the
// local ranks' CPU updates never oversubscribe the host.

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/core/config.h"
#include "tandem/parallel/rank_info.h"

namespace tandem {

class Comm;

/// This rank's rows of each global micro-batch, and their rebalancing.
class DataParallelRows {
 public:
  /// Rows per rank from dist.balance: equal (and auto, before it measures) or a list summing to
  /// train.micro_batch x world. UserError for a list that does not fit the world.
  DataParallelRows(const Config& cfg, const RankInfo& ranks);

  int64_t global_rows() const { return global_rows_; }
  int64_t rows() const { return rows_[static_cast<size_t>(rank_)]; }  ///< this rank's
  int64_t first_row() const { return first_row_of(rank_); }
  double share() const { return double(rows()) / double(global_rows_); }  ///< this rank's share of the loss
  const std::vector<int64_t>& all() const { return rows_; }
  int64_t first_row_of(int rank) const;

  /// dist.balance=auto, once at step first_step + dist.balance_after: every rank's compute time
  /// per row (`compute_s`: this rank's median forward+backward seconds) and its row cap (device
  /// memory room: `max_rows`) set the rows; true when they changed, with the log line in *said.
  bool rebalance(Comm& comm, double compute_s, double max_rows, std::string* said);
  /// Whether dist.balance=auto measures at this step.
  bool balances_at(int64_t step, int64_t first_step) const;

 private:
  int rank_ = 0;
  int64_t global_rows_ = 0;
  std::vector<int64_t> rows_;
  bool automatic_ = false;
  int64_t balance_after_ = 0;
};

}  // namespace tandem
