#include "tandem/parallel/data_parallel.h"

#include <cstdlib>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/parallel/comm.h"
#include "tandem/sched/batch_balance.h"

namespace tandem {

DataParallelRows::DataParallelRows(const Config& cfg, const RankInfo& ranks)
    : rank_(ranks.rank),
      global_rows_(cfg.train.micro_batch * ranks.world_size),
      rows_(static_cast<size_t>(ranks.world_size), cfg.train.micro_batch),
      automatic_(cfg.dist.balance.kind == RowBalance::Kind::kAuto),
      balance_after_(cfg.dist.balance_after) {
  const RowBalance& balance = cfg.dist.balance;
  if (balance.kind != RowBalance::Kind::kGiven) return;
  TANDEM_CHECK(static_cast<int>(balance.rows.size()) == ranks.world_size, "dist.balance='", balance.str(), "' gives ",
               balance.rows.size(), " row counts for ", ranks.world_size, " ranks; give one per rank, or equal / auto");
  int64_t sum = 0;
  for (size_t r = 0; r < balance.rows.size(); ++r) {
    TANDEM_CHECK(balance.rows[r] <= global_rows_, "dist.balance: ", balance.rows[r], " is not a row count within 1 .. ",
                 global_rows_);
    rows_[r] = balance.rows[r];
    sum += balance.rows[r];
  }
  TANDEM_CHECK(sum == global_rows_, "dist.balance='", balance.str(), "' sums to ", sum,
               " rows; the global micro-batch is train.micro_batch x world = ", global_rows_);
}

int64_t DataParallelRows::first_row_of(int rank) const {
  int64_t f = 0;
  for (int q = 0; q < rank; ++q) f += rows_[static_cast<size_t>(q)];
  return f;
}

bool DataParallelRows::balances_at(int64_t step, int64_t first_step) const {
  return automatic_ && rows_.size() > 1 && step == first_step + balance_after_;
}

bool DataParallelRows::rebalance(Comm& comm, double compute_s, double max_rows, std::string* said) {
  const double mine = compute_s / double(rows());
  const auto speeds = comm.all_gather(mine);
  const auto caps_d = comm.all_gather(max_rows);
  std::vector<int64_t> caps;
  for (const double c : caps_d) caps.push_back(static_cast<int64_t>(c));
  const auto next = balance_rows(speeds, caps, global_rows_);
  if (next == rows_) return false;
  said->clear();
  for (size_t r = 0; r < next.size(); ++r)
    *said += strprintf("%srank %zu: %.3g ms/row -> %lld rows", r ? ", " : "", r, speeds[r] * 1e3,
                       static_cast<long long>(next[r]));
  rows_ = next;
  return true;
}

}  // namespace tandem
