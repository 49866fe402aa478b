#pragma once
// Rows of the global micro-batch per rank for unequal GPUs (seed 002; Note [Data parallel]).

#include <cstdint>
#include <vector>

namespace tandem {

/// Splits `total` rows over the ranks in proportion to their speed (1 / seconds_per_row), each at
/// least one row and at most max_rows[r] (device memory), the rows a cap removes going to the
/// others; the result sums to `total`. UserError when the caps cannot hold `total`.
std::vector<int64_t> balance_rows(const std::vector<double>& seconds_per_row, const std::vector<int64_t>& max_rows,
                                  int64_t total);

}  // namespace tandem
