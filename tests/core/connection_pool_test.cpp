// core/connection_pool (Note [Connection pool]): connections beyond the first workers each get a
// worker of their own up to the cap, past it they wait, and shutdown serves what waits.
#include "tandem/core/connection_pool.h"

#include <gtest/gtest.h>

#ifdef TANDEM_WITH_HTTP
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace tandem {
namespace {

// Jobs that hold their worker until released, counting how many run at once.
struct Gate {
  std::mutex m;
  std::condition_variable cv;
  bool open = false;
  int running = 0, most = 0, done = 0;

  std::function<void()> job() {
    return [this] {
      std::unique_lock<std::mutex> lock(m);
      most = std::max(most, ++running);
      cv.notify_all();
      cv.wait(lock, [&] { return open; });
      --running;
      ++done;
    };
  }
  // Waits until `n` jobs run at once (or 5 s); the number running then.
  int wait_running(int n) {
    std::unique_lock<std::mutex> lock(m);
    cv.wait_for(lock, std::chrono::seconds(5), [&] { return running >= n; });
    return running;
  }
  void release() {
    const std::lock_guard<std::mutex> lock(m);
    open = true;
    cv.notify_all();
  }
};

TEST(ConnectionPool, AConnectionFindingNoIdleWorkerStartsOne) {
  std::unique_ptr<httplib::TaskQueue> pool(new_connection_pool(2, 8));
  Gate gate;
  for (int i = 0; i < 6; ++i) pool->enqueue(gate.job());
  EXPECT_EQ(gate.wait_running(6), 6) << "6 connections on 2 workers did not all run at once";
  gate.release();
  pool->shutdown();
  EXPECT_EQ(gate.done, 6);
}

TEST(ConnectionPool, PastTheCapConnectionsWaitAndShutdownServesThem) {
  std::unique_ptr<httplib::TaskQueue> pool(new_connection_pool(1, 3));
  Gate gate;
  for (int i = 0; i < 7; ++i) pool->enqueue(gate.job());
  EXPECT_EQ(gate.wait_running(3), 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    const std::lock_guard<std::mutex> lock(gate.m);
    EXPECT_EQ(gate.most, 3) << "more workers than the cap";
  }
  gate.release();
  pool->shutdown();  // the 4 waiting are served before the workers end
  EXPECT_EQ(gate.done, 7);
}

}  // namespace
}  // namespace tandem
#endif
