#include "tandem/sched/batch_balance.h"

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem {

std::vector<int64_t> balance_rows(const std::vector<double>& seconds_per_row, const std::vector<int64_t>& max_rows,
                                  int64_t total) {
  const size_t w = seconds_per_row.size();
  TANDEM_ASSERT(w > 0 && max_rows.size() == w, "balance over ", w, " ranks");
  int64_t cap_sum = 0;
  for (const auto c : max_rows) cap_sum += std::max<int64_t>(c, 1);
  TANDEM_CHECK(cap_sum >= total, "the ranks fit ", cap_sum, " rows of the global micro-batch (", total,
               ") in device memory; lower train.micro_batch or set dist.balance=equal");
  // Rows in proportion to speed (1 / seconds per row), at least one each, capped; the rows a cap
  // removes go to the others in proportion again.
  std::vector<int64_t> rows(w, 0);
  std::vector<bool> capped(w, false);
  int64_t left = total;
  for (int round = 0; round < static_cast<int>(w) + 1 && left > 0; ++round) {
    double speed = 0;
    for (size_t r = 0; r < w; ++r)
      if (!capped[r]) speed += 1.0 / std::max(seconds_per_row[r], 1e-12);
    int64_t given = 0;
    std::vector<double> frac(w, 0);
    for (size_t r = 0; r < w; ++r) {
      if (capped[r]) continue;
      const double want = double(left) * (1.0 / std::max(seconds_per_row[r], 1e-12)) / speed;
      const int64_t n = static_cast<int64_t>(want);
      rows[r] += n;
      frac[r] = want - double(n);
      given += n;
    }
    // Largest remainders get the rows rounding left over.
    int64_t rest = left - given;
    while (rest > 0) {
      size_t best = w;
      for (size_t r = 0; r < w; ++r)
        if (!capped[r] && (best == w || frac[r] > frac[best])) best = r;
      if (best == w) break;
      ++rows[best];
      frac[best] = -1;
      --rest;
    }
    left = 0;
    for (size_t r = 0; r < w; ++r)
      if (rows[r] > std::max<int64_t>(max_rows[r], 1)) {
        left += rows[r] - std::max<int64_t>(max_rows[r], 1);
        rows[r] = std::max<int64_t>(max_rows[r], 1);
        capped[r] = true;
      }
  }
  for (auto& r : rows)
    if (r < 1) r = 1;
  // The minimum of one row each may have taken rows from the fastest: give back from the largest.
  int64_t sum = 0;
  for (const auto r : rows) sum += r;
  while (sum > total) {
    auto it = std::max_element(rows.begin(), rows.end());
    --*it;
    --sum;
  }
  return rows;
}

}  // namespace tandem
