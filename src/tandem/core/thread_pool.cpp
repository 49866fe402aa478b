#include "tandem/core/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "tandem/core/error.h"

namespace tandem {

// Note [CPU thread budget]
// tandem's CPU kernels run on this pool, LibTorch's CPU operators on its own intra-op pool. The two
// never compete for the same cores: in GPU training LibTorch's pool is idle while the update runs
// (forward and backward run on the GPU), and where both must run at once (the CPU-as-device engine)
// the engine gives each its share of resolve_cpu_threads(), which respects TANDEM_CPU_THREADS and
// OMP_NUM_THREADS, so a launcher that divides cores among ranks is obeyed. Workers block on a
// condition variable between calls and never spin, so an idle pool costs no CPU time.

namespace {

int env_threads(const char* name) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return 0;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  TANDEM_CHECK(end != s && *end == '\0' && v > 0 && v <= 4096, name, "='", s,
               "' is not a thread count; set it to a positive integer or unset it");
  return static_cast<int>(v);
}

}  // namespace

std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty()) {
    const unsigned n = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned c = 0; c < n; ++c) cpus.push_back(static_cast<int>(c));
  }
  return cpus;
}

int resolve_cpu_threads(int configured) {
  if (configured > 0) return configured;
  if (int v = env_threads("TANDEM_CPU_THREADS")) return v;
  if (int v = env_threads("OMP_NUM_THREADS")) return v;
  return static_cast<int>(allowed_cpus().size());
}

CpuThreadPool::CpuThreadPool(int threads, bool pin) : pin_(pin) {
  TANDEM_CHECK(threads >= 1, "a CPU thread pool needs at least 1 thread, got ", threads);
  const std::vector<int> cpus = pin ? allowed_cpus() : std::vector<int>{};
  workers_.reserve(threads - 1);
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this, i] { worker_loop(i); });
    if (pin) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpus[i % cpus.size()], &set);
      pthread_setaffinity_np(workers_.back().native_handle(), sizeof(set), &set);
    }
  }
}

CpuThreadPool::~CpuThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void CpuThreadPool::work(const std::function<void(int64_t)>& fn, int64_t n_tasks) {
  for (int64_t t = next_.fetch_add(1, std::memory_order_relaxed); t < n_tasks;
       t = next_.fetch_add(1, std::memory_order_relaxed)) {
    try {
      fn(t);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      next_.store(n_tasks, std::memory_order_relaxed);  // hand out no more tasks
    }
  }
}

void CpuThreadPool::worker_loop(int) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t)>* fn;
    int64_t n;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = n_tasks_;
    }
    work(*fn, n);
    std::lock_guard<std::mutex> lock(mutex_);
    if (--busy_ == 0) done_.notify_one();
  }
}

void CpuThreadPool::run(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  std::lock_guard<std::mutex> serial(run_mutex_);
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = &fn;
    n_tasks_ = n_tasks;
    next_.store(0, std::memory_order_relaxed);
    busy_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  work(fn, n_tasks);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return busy_ == 0; });
    fn_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

namespace {
std::mutex g_pool_mutex;
std::unique_ptr<CpuThreadPool> g_pool;
}  // namespace

CpuThreadPool& CpuThreadPool::global() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool) g_pool = std::make_unique<CpuThreadPool>(resolve_cpu_threads(0), false);
  return *g_pool;
}

void CpuThreadPool::configure_global(int threads, bool pin) {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (g_pool && g_pool->size() == threads && g_pool->pinned() == pin) return;
  g_pool.reset();
  g_pool = std::make_unique<CpuThreadPool>(threads, pin);
}

}  // namespace tandem
