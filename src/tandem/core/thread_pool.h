#pragma once
// A persistent pool of CPU workers for tandem's own kernels (the CPU optimizer update, bf16
// casts). Threads are created once; a call hands out task indices through one atomic counter and
// the calling thread works too. See Note [CPU thread budget].

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

/// Threads a CPU kernel may use: `configured` when > 0, else TANDEM_CPU_THREADS, else
/// OMP_NUM_THREADS, else the CPUs this process may run on. UserError for a malformed variable.
int resolve_cpu_threads(int configured = 0);

/// CPUs in this process's affinity mask, in ascending order.
std::vector<int> allowed_cpus();

/// A fixed set of worker threads that run index-parallel tasks.
class CpuThreadPool {
 public:
  /// `threads` counts the caller: a pool of 1 runs everything on the calling thread. With `pin`,
  /// worker i is bound to the i-th allowed CPU (the caller keeps its own affinity).
  explicit CpuThreadPool(int threads, bool pin = false);
  ~CpuThreadPool();
  CpuThreadPool(const CpuThreadPool&) = delete;
  CpuThreadPool& operator=(const CpuThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  bool pinned() const { return pin_; }

  /// Runs fn(task) for every task in [0, n_tasks) and returns when all have finished. Calls from
  /// several threads are serialised. The first exception thrown by a task is rethrown here after
  /// the others have finished.
  void run(int64_t n_tasks, const std::function<void(int64_t)>& fn);

  /// The process-wide pool, created on first use with resolve_cpu_threads(0) threads, or with the
  /// size given to configure_global() before that.
  static CpuThreadPool& global();
  /// Sets the global pool's size and pinning; replaces an existing pool of another shape.
  /// Must not be called while the global pool is running tasks.
  static void configure_global(int threads, bool pin);

 private:
  void worker_loop(int index);
  void work(const std::function<void(int64_t)>& fn, int64_t n_tasks);

  bool pin_;
  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one run() at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  int busy_ = 0;  // workers still inside the current generation
  std::exception_ptr error_;
};

}  // namespace tandem
