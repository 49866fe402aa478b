#include "tandem/core/thread_pool.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <set>
#include <stdexcept>

#include "../test_util.h"

namespace tandem {
namespace {

TEST(CpuThreadPool, RunsEveryTaskExactlyOnceOnSeveralThreads) {
  CpuThreadPool pool(4);
  EXPECT_EQ(pool.size(), 4);
  for (int round = 0; round < 50; ++round) {  // the pool is reused, not recreated
    std::vector<std::atomic<int>> hits(1000);
    std::mutex mu;
    std::set<std::thread::id> threads;
    pool.run(1000, [&](int64_t t) {
      hits[t].fetch_add(1);
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(std::this_thread::get_id());
    });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
    ASSERT_GE(threads.size(), 1u);
  }
}

TEST(CpuThreadPool, RethrowsTheFirstErrorAfterAllTasksStop) {
  CpuThreadPool pool(3);
  EXPECT_THROW(pool.run(100,
                        [](int64_t t) {
                          if (t == 17) throw std::runtime_error("task 17");
                        }),
               std::runtime_error);
  std::atomic<int> n{0};
  pool.run(10, [&](int64_t) { n++; });  // still usable
  EXPECT_EQ(n.load(), 10);
}

TEST(CpuThreadPool, PinnedPoolRuns) {
  CpuThreadPool pool(2, /*pin=*/true);
  std::atomic<int> n{0};
  pool.run(64, [&](int64_t) { n++; });
  EXPECT_EQ(n.load(), 64);
}

TEST(CpuThreads, ConfigThenTandemVariableThenOmpThenAffinity) {
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const std::string saved = omp ? omp : "";
  unsetenv("TANDEM_CPU_THREADS");
  unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(resolve_cpu_threads(0), static_cast<int>(allowed_cpus().size()));
  setenv("OMP_NUM_THREADS", "3", 1);
  EXPECT_EQ(resolve_cpu_threads(0), 3);
  setenv("TANDEM_CPU_THREADS", "5", 1);
  EXPECT_EQ(resolve_cpu_threads(0), 5);
  EXPECT_EQ(resolve_cpu_threads(7), 7);
  setenv("TANDEM_CPU_THREADS", "many", 1);
  EXPECT_NE(test::error_of([] { resolve_cpu_threads(0); }).find("TANDEM_CPU_THREADS='many'"), std::string::npos);
  unsetenv("TANDEM_CPU_THREADS");
  if (omp)
    setenv("OMP_NUM_THREADS", saved.c_str(), 1);
  else
    unsetenv("OMP_NUM_THREADS");
}

}  // namespace
}  // namespace tandem
