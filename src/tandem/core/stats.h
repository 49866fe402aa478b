#pragma once
// Small statistics shared by the trainer and the benchmarks.

#include <algorithm>
#include <vector>

namespace tandem {

/// The upper median (v[n/2] after sorting); 0 for an empty vector.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace tandem
