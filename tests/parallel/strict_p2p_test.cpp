// The strict link (Note [Strict point to point]): NCCL's point-to-point semantics over Gloo, two
// ranks as two threads of this process on loopback.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <array>
#include <chrono>
#include <functional>
#include <future>
#include <string>
#include <thread>

#include "dist_runs.h"
#include "tandem/parallel/comm.h"
#include "tandem/parallel/strict_p2p.h"

namespace tandem::test {
namespace {

using Clock = std::chrono::steady_clock;

// Runs `body(rank, link)` on two ranks at once, each with its own strict link over a Gloo pair;
// returns each rank's error message ("" when it returned).
std::array<std::string, 2> on_two_ranks(int p, std::chrono::milliseconds timeout,
                                        const std::function<void(int, c10d::Backend&)>& body) {
  std::array<std::string, 2> errors;
  auto rank_main = [&](int rank) {
    try {
      c10d::TCPStoreOptions so;
      so.port = static_cast<uint16_t>(p);
      so.isServer = rank == 0;
      so.numWorkers = 2;
      so.waitWorkers = true;
      so.timeout = std::chrono::seconds(60);
      auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
      RankInfo info;
      info.rank = rank;
      info.world_size = info.local_world_size = 2;
      auto carrier = make_gloo_group(c10::make_intrusive<c10d::PrefixStore>("carrier", store), info, timeout);
      auto link = make_strict_p2p(carrier, c10::make_intrusive<c10d::PrefixStore>("p2p", store), timeout);
      try {
        body(rank, *link);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
      // Both done, failed or not, before the store's server (rank 0) goes.
      store->add("done", 1);
      while (store->add("done", 0) < 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } catch (const std::exception& e) {
      errors[static_cast<size_t>(rank)] += std::string(" | setup: ") + e.what();
    }
  };
  std::thread r1(rank_main, 1);
  rank_main(0);
  r1.join();
  return errors;
}

void send(c10d::Backend& link, torch::Tensor t, int to, int tag) {
  std::vector<at::Tensor> v{std::move(t)};
  link.send(v, to, tag)->wait();
}

torch::Tensor recv(c10d::Backend& link, int64_t n, int from, int tag) {
  std::vector<at::Tensor> v{torch::zeros({n})};
  link.recv(v, from, tag)->wait();
  return v[0];
}

TEST(StrictP2P, MessagesInAgreeingOrderArriveWhicheverWayTheyGo) {
  const auto errors = on_two_ranks(port(0), std::chrono::seconds(30), [](int rank, c10d::Backend& link) {
    const int peer = 1 - rank;
    if (rank == 0) {
      std::vector<at::Tensor> a{torch::arange(5.0)}, b{torch::arange(7.0) * 2};
      auto wa = link.send(a, peer, 0);  // two sends in flight before either is received
      auto wb = link.send(b, peer, 1);
      wa->wait();
      wb->wait();
      EXPECT_TRUE(torch::equal(recv(link, 3, peer, 2), torch::full({3}, 9.0)));
    } else {
      EXPECT_TRUE(torch::equal(recv(link, 5, peer, 0), torch::arange(5.0)));
      EXPECT_TRUE(torch::equal(recv(link, 7, peer, 1), torch::arange(7.0) * 2));
      send(link, torch::full({3}, 9.0), peer, 2);
    }
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// Gloo would buffer both sends and deliver both; NCCL hangs. Found at once, not at the timeout.
TEST(StrictP2P, TwoRanksSendingToEachOtherFirstFailAtOnceNamingBothSends) {
  const auto t0 = Clock::now();
  const auto errors = on_two_ranks(port(1), std::chrono::seconds(60), [](int rank, c10d::Backend& link) {
    const int peer = 1 - rank;
    std::vector<at::Tensor> out{torch::ones({4})};
    auto w = link.send(out, peer, 10 + rank);
    recv(link, 4, peer, 10 + peer);
    w->wait();
  });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 20.0);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank 0's send #0 (tag 10) to rank 1"), std::string::npos)
        << errors[static_cast<size_t>(r)];
    EXPECT_NE(errors[static_cast<size_t>(r)].find("rank 1's send #0 (tag 11) to rank 0"), std::string::npos)
        << errors[static_cast<size_t>(r)];
    EXPECT_NE(errors[static_cast<size_t>(r)].find("wait for each other"), std::string::npos)
        << errors[static_cast<size_t>(r)];
  }
}

// NCCL ignores tags and would hand the receive whatever came first.
TEST(StrictP2P, MessagesWhoseTagsDisagreeFailOnBothRanks) {
  const auto errors = on_two_ranks(port(2), std::chrono::seconds(30), [](int rank, c10d::Backend& link) {
    if (rank == 0)
      send(link, torch::ones({4}), 1, 3);
    else
      recv(link, 4, 0, 4);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("message #0 from rank 0 to rank 1 was sent under tag 3 but received under tag 4"),
              std::string::npos)
        << e;
  }
}

// Both waiting to receive: as hopeless under NCCL as both sending.
TEST(StrictP2P, TwoRanksReceivingFromEachOtherFirstFail) {
  const auto errors = on_two_ranks(port(3), std::chrono::seconds(60), [](int rank, c10d::Backend& link) {
    const int peer = 1 - rank;
    recv(link, 4, peer, 0);
    send(link, torch::ones({4}), peer, 0);
  });
  for (const auto& e : errors) EXPECT_NE(e.find("wait for each other"), std::string::npos) << e;
}

}  // namespace
}  // namespace tandem::test
