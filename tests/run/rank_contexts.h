#pragma once
// Ranks as threads of this process, each with a RunContext on the CPU whose Comm meets the others
// over loopback Gloo (rank 0 serves the store), for the tests of what a run builds on several ranks
// (tests/run/pipeline_setup_test.cpp, tests/run/trainable_test.cpp).

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../parallel/dist_runs.h"
#include "tandem/parallel/comm.h"
#include "tandem/run/run_setup.h"

namespace tandem::test {

/// Runs `body(ctx)` on `world` ranks at once, each a thread whose RunContext holds a Comm with its
/// store on port `p`; returns each rank's error message ("" when its body returned). Every Comm
/// lives until every body has returned; rank 0's, which serves the store, goes last.
inline std::vector<std::string> on_rank_contexts(int world, int p, const std::function<void(RunContext&)>& body) {
  std::vector<RunContext> ctxs(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  const auto on_each = [&](const std::function<void(int)>& f) {
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        try {
          f(r);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] += e.what();
        }
      });
    for (auto& t : threads) t.join();
  };
  on_each([&](int r) {
    RunContext& ctx = ctxs[static_cast<size_t>(r)];
    ctx.ranks.rank = ctx.ranks.local_rank = r;
    ctx.ranks.world_size = ctx.ranks.local_world_size = world;
    ctx.ranks.master_port = p;
    ctx.device = c10::Device(c10::kCPU);
    CommOptions options;
    options.heartbeat_s = 0;                     // no heartbeat thread: a test's failure is its own message
    options.timeout = std::chrono::seconds(10);  // a hang fails in 70 s (the collectives add a 60 s grace)
    ctx.comm = std::make_unique<Comm>(ctx.ranks, options);
  });
  for (const auto& e : errors)
    if (!e.empty()) return errors;  // the rendezvous failed: no bodies
  on_each([&](int r) { body(ctxs[static_cast<size_t>(r)]); });
  for (int r = world - 1; r >= 0; --r) ctxs[static_cast<size_t>(r)].comm.reset();
  return errors;
}

/// Every rank's body returned (named apart from tests/parallel/comm_threads.h's expect_no_errors: two
/// inline functions of one signature in one namespace would be one function to the linker).
inline void expect_every_rank_returned(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace tandem::test
