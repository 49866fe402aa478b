#pragma once
// Ranks as threads of this process, each with its own Comm over loopback Gloo (rank 0 serves the
// store), for the tests of what ranks exchange: stage links, the gradient reducer, pipeline
// checkpoints, reports and traces (tests/parallel/*_test.cpp).

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dist_runs.h"
#include "tandem/parallel/comm.h"

namespace tandem::test {

/// Runs `f(rank)` for every rank at once, a thread each; an exception's message goes to
/// errors[rank].
inline void on_threads(int world, std::vector<std::string>& errors, const std::function<void(int)>& f) {
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
}

/// A test's Comm: no heartbeat thread (a test's failure is its own message), and a hang fails in
/// 70 s (the collectives add a 60 s grace).
inline CommOptions test_comm_options() {
  CommOptions options;
  options.heartbeat_s = 0;
  options.timeout = std::chrono::seconds(10);
  return options;
}

/// Runs `body(comm)` on `world` ranks at once, each a thread with a Comm whose store is on port `p`,
/// split into `stages` pipeline stages (1: none); returns each rank's error message ("" when its
/// body returned). Every Comm lives until every body has returned; rank 0's, which serves the store,
/// goes last.
inline std::vector<std::string> on_ranks(int world, int stages, int p, const std::function<void(Comm&)>& body) {
  std::vector<std::unique_ptr<Comm>> comms(static_cast<size_t>(world));
  std::vector<std::string> errors(static_cast<size_t>(world));
  const auto on_each = [&](const std::function<void(int)>& f) { on_threads(world, errors, f); };
  on_each([&](int r) {
    RankInfo info;
    info.rank = r;
    info.world_size = info.local_world_size = world;
    info.master_port = p;
    auto comm = std::make_unique<Comm>(info, test_comm_options());
    comm->split_pipeline(stages);
    comms[static_cast<size_t>(r)] = std::move(comm);
  });
  for (const auto& e : errors)
    if (!e.empty()) return errors;  // the rendezvous failed: no bodies
  on_each([&](int r) { body(*comms[static_cast<size_t>(r)]); });
  for (int r = world - 1; r >= 0; --r) comms[static_cast<size_t>(r)].reset();
  return errors;
}

/// Every rank's error message empty.
inline void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace tandem::test
