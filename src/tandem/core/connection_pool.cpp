#include "tandem/core/connection_pool.h"

#ifdef TANDEM_WITH_HTTP
#include <httplib.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

// Note [Connection pool]
// cpp-httplib serves a connection on one worker from accept to close, keep-alive waits included
// (up to 5 s a request, 5 requests a connection), and its ThreadPool queues a connection that finds
// every worker busy, without bound. Under load a fixed pool therefore hides requests from the
// server: a connection behind idle keep-alive ones waits seconds for a worker before its request is
// read at all, so it gets neither a prompt answer nor the scheduler's 429 (`tandem serve` answers
// capacity itself, Note [Graceful drain]); and when the server stops, the connections still queued
// are closed unanswered. This pool grows instead: a connection that finds no worker idle starts one,
// up to a cap, so every connection is read as it comes and the handlers answer it (200, 429 or 503).
// Workers are kept once started (at most the cap; a thread waiting costs its stack alone).
class ConnectionPool : public httplib::TaskQueue {
 public:
  ConnectionPool(size_t threads, size_t max_threads) : max_threads_(std::max(threads, max_threads)) {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < std::max<size_t>(threads, 1); ++i) start_worker();
  }

  void enqueue(std::function<void()> fn) override {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      jobs_.push_back(std::move(fn));
      if (idle_ < jobs_.size() && workers_.size() < max_threads_ && !stopping_) start_worker();
    }
    ready_.notify_one();
  }

  void shutdown() override {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (auto& t : workers_) t.join();  // no worker starts once stopping_ is set
    workers_.clear();
  }

 private:
  void start_worker() {  // under mutex_
    workers_.emplace_back([this] { work(); });
  }

  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ++idle_;
      ready_.wait(lock, [&] { return !jobs_.empty() || stopping_; });
      --idle_;
      if (jobs_.empty()) return;  // stopping, nothing left to serve
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  const size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> workers_;
  size_t idle_ = 0;
  bool stopping_ = false;
};

httplib::TaskQueue* new_connection_pool(size_t threads, size_t max_threads) {
  return new ConnectionPool(threads, max_threads);
}

}  // namespace tandem
#endif
