#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "tandem/core/cpu_topology.h"
#include "tandem/core/thread_pool.h"

namespace tandem {
namespace {

// Note [Core division]: every split of the allowed CPUs gives each rank a disjoint, non-empty share.
TEST(CpuTopology, RanksGetDisjointSharesOfTheAllowedCpus) {
  const std::vector<int> allowed = allowed_cpus();
  ASSERT_FALSE(allowed.empty());
  const std::set<int> allowed_set(allowed.begin(), allowed.end());
  for (int world = 1; world <= static_cast<int>(allowed.size()); ++world) {
    std::set<int> seen;
    size_t first_size = 0;
    for (int r = 0; r < world; ++r) {
      std::string how;
      const auto cpus = rank_cpus(r, world, &how);
      if (cpus.empty()) {  // fewer physical cores than ranks (hardware threads do not count)
        EXPECT_GT(world, 1);
        continue;
      }
      EXPECT_FALSE(how.empty());
      if (r == 0) first_size = cpus.size();
      EXPECT_EQ(cpus.size(), first_size) << "rank " << r << " of " << world;  // even shares
      for (const int c : cpus) {
        EXPECT_TRUE(allowed_set.count(c)) << c << " is not an allowed CPU";
        EXPECT_TRUE(seen.insert(c).second) << "CPU " << c << " given twice (" << world << " ranks)";
      }
    }
  }
  EXPECT_TRUE(rank_cpus(0, static_cast<int>(allowed.size()) + 1).empty());
  EXPECT_EQ(rank_cpus(0, 1).size(), allowed.size());
}

}  // namespace
}  // namespace tandem
