// The communication context (parallel/comm.h), ranks as threads on loopback Gloo: rendezvous, host
// collectives, store agreements, device groups with and without a pipeline split, refusals, and Note
// [Heartbeat] / Note [Stalled ranks]: silent ranks, a lost store and overlong waits reported.
#include "tandem/parallel/comm.h"

#include <gtest/gtest.h>

#include <atomic>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist_runs.h"
#include "tandem/core/error.h"

namespace tandem::test {
namespace {

/// `world` ranks as threads, each with its own Comm (rank 0 serves the store on port `p`); the
/// Comms are destroyed in reverse rank order, so rank 0's store outlives every other rank.
struct Ranks {
  std::vector<std::unique_ptr<Comm>> comms;
  std::vector<std::string> errors;  ///< of the rendezvous, per rank

  Ranks(int world, int p, const CommOptions& options)
      : comms(static_cast<size_t>(world)), errors(static_cast<size_t>(world)) {
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        try {
          RankInfo info;
          info.rank = info.local_rank = r;
          info.world_size = info.local_world_size = world;
          info.master_port = p;
          comms[static_cast<size_t>(r)] = std::make_unique<Comm>(info, options);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
  }
  ~Ranks() {
    for (auto it = comms.rbegin(); it != comms.rend(); ++it) it->reset();
  }
  ::testing::AssertionResult met() const {
    for (size_t r = 0; r < errors.size(); ++r)
      if (!errors[r].empty()) return ::testing::AssertionFailure() << "rank " << r << ": " << errors[r];
    return ::testing::AssertionSuccess();
  }
  Comm& operator[](int r) { return *comms.at(static_cast<size_t>(r)); }
  /// Runs `f` on every rank at once; each rank's error message ("" when it returned).
  std::vector<std::string> each(const std::function<void(Comm&)>& f) {
    std::vector<std::string> out(comms.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < comms.size(); ++r)
      threads.emplace_back([&, r] {
        try {
          f(*comms[r]);
        } catch (const std::exception& e) {
          out[r] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    return out;
  }
};

CommOptions quiet(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  CommOptions o;
  o.heartbeat_s = 0;  // no heartbeat thread
  o.timeout = timeout;
  return o;
}

void expect_all_returned(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

/// What on_peer_lost reported, and a wait for it.
struct LostLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> why;
  std::function<void(const std::string&)> callback() {
    return [this](const std::string& w) {
      {
        std::lock_guard<std::mutex> lock(mu);
        why.push_back(w);
      }
      cv.notify_all();
    };
  }
  /// The first report, or "" when none came within `limit`.
  std::string first(std::chrono::seconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, limit, [&] { return !why.empty(); });
    return why.empty() ? "" : why.front();
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu);
    return why.size();
  }
};

TEST(Comm, TheRendezvousGivesEachRankItsPlace) {
  Ranks ranks(3, port(0), quiet());
  ASSERT_TRUE(ranks.met());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(ranks[r].rank(), r);
    EXPECT_EQ(ranks[r].world(), 3);
    EXPECT_EQ(ranks[r].stages(), 1);
    EXPECT_EQ(ranks[r].replicas(), 3) << "without a pipeline every rank is a replica";
    EXPECT_EQ(ranks[r].replica(), r);
    EXPECT_FALSE(ranks[r].nccl());
    EXPECT_EQ(ranks[r].info().master_port, port(0));
  }
}

TEST(Comm, HostCollectivesCombineEveryRanksValuesInRankOrder) {
  Ranks ranks(3, port(1), quiet());
  ASSERT_TRUE(ranks.met());
  expect_all_returned(ranks.each([](Comm& c) {
    const double r = c.rank();
    EXPECT_EQ(c.sum(r + 1), 6.0);
    EXPECT_EQ(c.sum(std::vector<double>{r, 10 * r}), (std::vector<double>{3, 30}));
    EXPECT_EQ(c.all_gather(1.5 * r), (std::vector<double>{0, 1.5, 3}));
    EXPECT_EQ(c.all_gather(std::vector<double>{r, -r}), (std::vector<double>{0, 0, 1, -1, 2, -2}));
    EXPECT_EQ(c.from_rank0({r + 7, r}), (std::vector<double>{7, 0})) << "rank 0's values everywhere";
    EXPECT_EQ(c.from_stage_first(r + 0.5), 0.5) << "no pipeline: rank 0's";
    c.barrier();
  }));
}

TEST(Comm, TheStoreCarriesRankZerosStringAndComparesTheRanksValues) {
  Ranks ranks(3, port(2), quiet());
  ASSERT_TRUE(ranks.met());
  expect_all_returned(ranks.each([](Comm& c) {
    EXPECT_EQ(c.broadcast_string("plan", "plan of rank " + std::to_string(c.rank())), "plan of rank 0");
    EXPECT_EQ(c.broadcast_string("other", std::to_string(10 * c.rank())), "0") << "each key its own value";
    c.check_same("model", "tiny", "start every rank with one config");
  }));
  const auto errors = ranks.each(
      [](Comm& c) { c.check_same("config hash", c.rank() == 2 ? "b2" : "a1", "start every rank with one config"); });
  for (size_t r = 0; r < 3; ++r) {
    SCOPED_TRACE(r);
    EXPECT_NE(errors[r].find("the ranks run different config hash (rank 0: a1, rank 1: a1, rank 2: b2); start every "
                             "rank with one config"),
              std::string::npos)
        << errors[r];
  }
}

// A second call with the same key reads its own values, never the first call's: rank 0's second
// broadcast is seen by every rank, and a check that now disagrees says so on every rank.
TEST(Comm, ASecondCallWithTheSameKeyReadsItsOwnValues) {
  Ranks ranks(2, port(12), quiet());
  ASSERT_TRUE(ranks.met());
  std::atomic<int> round{0};
  const auto errors = ranks.each([&](Comm& c) {
    EXPECT_EQ(c.broadcast_string("plan", "first"), "first");
    c.check_same("seed", "1", "give every rank one seed");
    c.barrier();
    EXPECT_EQ(c.broadcast_string("plan", c.rank() == 0 ? "second" : "ignored"), "second");
    ++round;
    c.check_same("seed", c.rank() == 0 ? "1" : "2", "give every rank one seed");
  });
  EXPECT_EQ(round.load(), 2);
  for (size_t r = 0; r < 2; ++r)
    EXPECT_NE(errors[r].find("the ranks run different seed (rank 0: 1, rank 1: 2)"), std::string::npos) << errors[r];
}

TEST(Comm, HostTensorsGoPointToPoint) {
  Ranks ranks(2, port(3), quiet());
  ASSERT_TRUE(ranks.met());
  expect_all_returned(ranks.each([](Comm& c) {
    if (c.rank() == 0) {
      c.send_host(torch::arange(5, torch::kFloat64) * 2, 1, 7);
      torch::Tensor back = torch::zeros({2, 3}, torch::kInt64);
      c.recv_host(back, 1, 8);
      EXPECT_TRUE(torch::equal(back, torch::arange(6, torch::kInt64).reshape({2, 3}) - 3));
    } else {
      torch::Tensor got = torch::zeros({5}, torch::kFloat64);
      c.recv_host(got, 0, 7);
      EXPECT_TRUE(torch::equal(got, torch::arange(5, torch::kFloat64) * 2));
      c.send_host(torch::arange(6, torch::kInt64).reshape({2, 3}) - 3, 0, 8);
    }
  }));
}

TEST(Comm, DeviceGroupsSpanTheWorldWithoutAPipeline) {
  Ranks ranks(2, port(4), quiet());
  ASSERT_TRUE(ranks.met());
  expect_all_returned(ranks.each([](Comm& c) {
    for (const int lane : {0, 1}) {
      std::vector<at::Tensor> t{torch::full({2}, c.rank() + 1.0)};
      c.device_group(lane).allreduce(t)->wait();
      EXPECT_TRUE(torch::equal(t[0], torch::full({2}, 3.0))) << "lane " << lane;
    }
    EXPECT_EQ(&c.world_device_group(), &c.device_group(0)) << "one group: the world";
    EXPECT_NE(&c.device_group(0), &c.device_group(1)) << "each thread its own group";
    EXPECT_THROW(c.device_group(2), InternalError);
    EXPECT_THROW(c.stage_link(Comm::Link::kDown), InternalError) << "no pipeline: no stage links";
  }));
}

// Note [Flight recorder]: every group's first collective at once, on two threads of each of eight
// ranks (the lanes' threads, as in a training step), over fresh groups each round.
TEST(Comm, FirstCollectivesOfManyGroupsAtOnceLeaveTheProcessStanding) {
  constexpr int kWorld = 8;
  for (int round = 0; round < 6; ++round) {
    Ranks ranks(kWorld, port(13 + round), quiet());
    ASSERT_TRUE(ranks.met());
    std::atomic<int> ready{0};
    expect_all_returned(ranks.each([&](Comm& c) {
      std::vector<std::thread> lanes;
      std::vector<double> sums(2);
      for (const int lane : {0, 1})
        lanes.emplace_back([&, lane] {
          ++ready;
          while (ready.load() < 2 * kWorld) std::this_thread::yield();
          std::vector<at::Tensor> t{torch::full({1}, double(c.rank()))};
          c.device_group(lane).allreduce(t)->wait();
          sums[static_cast<size_t>(lane)] = t[0].item<double>();
        });
      for (auto& t : lanes) t.join();
      const double all = kWorld * (kWorld - 1) / 2.0;
      EXPECT_EQ(sums, std::vector<double>({all, all}));
    }));
  }
  const char* size = std::getenv("TORCH_FR_BUFFER_SIZE");
  ASSERT_NE(size, nullptr) << "the recorder was left on";
  EXPECT_STREQ(size, "0");
}

TEST(Comm, APipelineSplitMakesStageGroupsAndLinks) {
  Ranks ranks(4, port(5), quiet());
  ASSERT_TRUE(ranks.met());
  expect_all_returned(ranks.each([](Comm& c) {
    EXPECT_THROW(c.split_pipeline(3), InternalError) << "3 stages do not divide 4 ranks";
    EXPECT_THROW(c.split_pipeline(0), InternalError);
    c.split_pipeline(1);
    EXPECT_EQ(c.stages(), 1) << "one stage: nothing to split";
    c.split_pipeline(2);  // stage-major: ranks 0, 1 are stage 0; 2, 3 stage 1
    const int stage = c.rank() / 2;
    EXPECT_EQ(c.stages(), 2);
    EXPECT_EQ(c.replicas(), 2);
    EXPECT_EQ(c.replica(), c.rank() % 2);
    for (const int lane : {0, 1}) {
      std::vector<at::Tensor> t{torch::full({1}, double(c.rank()))};
      c.device_group(lane).allreduce(t)->wait();
      EXPECT_EQ(t[0].item<double>(), stage == 0 ? 1.0 : 5.0) << "lane " << lane << ": the stage's replicas only";
    }
    std::vector<at::Tensor> w{torch::full({1}, double(c.rank()))};
    c.world_device_group().allreduce(w)->wait();
    EXPECT_EQ(w[0].item<double>(), 6.0) << "the world group stays whole";
    EXPECT_EQ(c.from_stage_first(10.0 * c.rank() + 1), stage == 0 ? 1.0 : 21.0) << "the stage's first replica's";
    // Activations go down the kDown link to the same replica of the next stage.
    std::vector<at::Tensor> x{torch::full({3}, stage == 0 ? double(c.rank() + 100) : 0.0)};
    if (stage == 0) {
      c.stage_link(Comm::Link::kDown).send(x, c.rank() + 2, 0)->wait();
    } else {
      c.stage_link(Comm::Link::kDown).recv(x, c.rank() - 2, 0)->wait();
      EXPECT_TRUE(torch::equal(x[0], torch::full({3}, double(c.rank() - 2 + 100))));
    }
    EXPECT_NE(&c.stage_link(Comm::Link::kDown), &c.stage_link(Comm::Link::kUp)) << "a group per direction";
    EXPECT_THROW(c.split_pipeline(2), InternalError) << "split once";
  }));
}

TEST(Comm, ARankThatMeetsNoOneSaysWhereItLooked) {
  for (const int rank : {1, 0}) {  // a worker without its server, then a server without its worker
    RankInfo info;
    info.rank = rank;
    info.world_size = info.local_world_size = 2;
    info.master_port = port(6);
    const std::string err = error_of([&] { Comm c(info, quiet(std::chrono::seconds(1))); });
    SCOPED_TRACE(rank);
    EXPECT_NE(err.find("rank " + std::to_string(rank) +
                       " of 2 could not meet the others at 127.0.0.1:" + std::to_string(port(6))),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("check MASTER_ADDR/MASTER_PORT"), std::string::npos) << err;
  }
}

TEST(Comm, FindLostRankNamesTheRankWhoseHeartbeatStopped) {
  {
    Ranks silent(2, port(7), quiet());
    ASSERT_TRUE(silent.met());
    EXPECT_EQ(silent[0].find_lost_rank(), -1) << "no heartbeat: no one to blame";
  }
  LostLog lost;
  CommOptions o = quiet();
  o.heartbeat_s = 0.05;
  o.heartbeat_timeout_s = 60;  // the threads never decide on their own here
  o.on_peer_lost = lost.callback();
  Ranks ranks(2, port(8), o);
  ASSERT_TRUE(ranks.met());
  EXPECT_EQ(ranks[0].find_lost_rank(), -1) << "both beat";
  ranks[1].stop_heartbeat();
  EXPECT_EQ(ranks[0].find_lost_rank(), 1);
  EXPECT_EQ(lost.count(), 0u);
}

TEST(Comm, AStoreThatStopsAnsweringIsRankZeroLost) {
  LostLog lost;
  CommOptions o = quiet(std::chrono::seconds(2));  // bounds each store call to the vanished server
  o.heartbeat_s = 0.05;
  o.heartbeat_timeout_s = 60;  // never the grace exit: the test ends long before
  o.on_peer_lost = lost.callback();
  Ranks ranks(2, port(9), o);
  ASSERT_TRUE(ranks.met());
  ranks.comms[0].reset();  // rank 0 leaves, and its store with it
  const std::string why = lost.first(std::chrono::seconds(20));
  EXPECT_NE(why.find("rank 0 stopped (the rendezvous store it serves at 127.0.0.1:" + std::to_string(port(9))),
            std::string::npos)
      << why;
  EXPECT_EQ(ranks[1].find_lost_rank(), 0) << "the store is rank 0's";
}

TEST(Comm, AWaitLongerThanTheTimeoutWhileEveryRankBeatsIsAStall) {
  LostLog lost;
  CommOptions o = quiet(std::chrono::seconds(1));
  o.heartbeat_s = 0.05;
  o.heartbeat_timeout_s = 60;
  o.on_peer_lost = lost.callback();
  Ranks ranks(2, port(10), o);
  ASSERT_TRUE(ranks.met());
  const Comm::Waiting none(nullptr, "nothing");  // no comm: no mark
  {
    const Comm::Waiting outer(&ranks[0], "step 7: receiving micro-batch 3's activation from rank 1");
    { const Comm::Waiting inner(&ranks[0], "a host all-reduce"); }  // over at once: the outer wait again
    const std::string why = lost.first(std::chrono::seconds(20));
    EXPECT_NE(why.find("for step 7: receiving micro-batch 3's activation from rank 1 while every rank still sends "
                       "heartbeats"),
              std::string::npos)
        << why;
    EXPECT_EQ(why.find("all-reduce"), std::string::npos) << "the inner wait ended: " << why;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(lost.count(), 1u) << "reported once";
}

TEST(Comm, ASilentRankIsLostAfterTheHeartbeatTimeoutNamingThisRanksWait) {
  LostLog lost;
  CommOptions o = quiet();
  o.heartbeat_s = 0.05;
  o.heartbeat_timeout_s = 2;  // also the grace before a reported process ends itself: stopped well before
  o.on_peer_lost = lost.callback();
  Ranks ranks(2, port(11), o);
  ASSERT_TRUE(ranks.met());
  const Comm::Waiting waiting(&ranks[0], "step 3: the end of the step");
  ranks[1].stop_heartbeat();
  const std::string why = lost.first(std::chrono::seconds(20));
  ranks[0].stop_heartbeat();  // at once: the default reaction's exit must not come
  EXPECT_NE(why.find("rank 1 has not sent a heartbeat for "), std::string::npos) << why;
  EXPECT_NE(why.find(" s: it died or hangs"), std::string::npos) << why;
  EXPECT_NE(why.find("(this rank waited"), std::string::npos) << why;
  EXPECT_NE(why.find("s for step 3: the end of the step)"), std::string::npos) << why;
}

}  // namespace
}  // namespace tandem::test
