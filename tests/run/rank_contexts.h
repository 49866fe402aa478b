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

#include "../parallel/comm_threads.h"
#include "tandem/parallel/comm.h"
#include "tandem/run/run_setup.h"

namespace tandem::test {

/// Runs `body(ctx)` on `world` ranks at once, each a thread whose RunContext holds a Comm with its
/// store on port `p`; returns each rank's error message ("" when its body returned). Every Comm
/// lives until every body has returned; rank 0's, which serves the store, goes last.
inline std::vector<std::string> on_rank_contexts(int world, int p, const std::function<void(RunContext&)>& body) {
  std::vector<RunContext> ctxs(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  const auto on_each = [&](const std::function<void(int)>& f) { on_threads(world, errors, f); };
  on_each([&](int r) {
    RunContext& ctx = ctxs[static_cast<size_t>(r)];
    ctx.ranks.rank = ctx.ranks.local_rank = r;
    ctx.ranks.world_size = ctx.ranks.local_world_size = world;
    ctx.ranks.master_port = p;
    ctx.device = c10::Device(c10::kCPU);
    ctx.comm = std::make_unique<Comm>(ctx.ranks, test_comm_options());
  });
  for (const auto& e : errors)
    if (!e.empty()) return errors;  // the rendezvous failed: no bodies
  on_each([&](int r) { body(ctxs[static_cast<size_t>(r)]); });
  for (int r = world - 1; r >= 0; --r) ctxs[static_cast<size_t>(r)].comm.reset();
  return errors;
}

}  // namespace tandem::test
