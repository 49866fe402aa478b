// How fast can the host tier be page-locked? Compares the ways a process can get pinned memory
// from the CUDA driver, over the same total size cut into chunks the size of a large Block:
//   host_alloc   cudaHostAlloc per chunk (what tandem did), on T threads
//   register     anonymous mmap per chunk, pages faulted in on every core, cudaHostRegister on T threads
//   register_thp the same with madvise(MADV_HUGEPAGE) (2 MiB pages: 512x fewer pages to lock)
//   arena_thp    one mmap for the whole size, THP, faulted in on every core, one cudaHostRegister
// and checks that each kind of buffer copies to the GPU at the same speed.
//
// Build and run (a machine with a GPU):
//   nvcc -O2 -std=c++17 -o build/pin_bench bench/pin_bench.cpp -lpthread && build/pin_bench 24 1
// arguments: total GiB (default 24), chunk GiB (default 1).
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs f(i) for i in [0, n) on `threads` threads, each bound to device 0.
void parallel_for(int n, int threads, const std::function<void(int)>& f) {
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      check(cudaSetDevice(0), "cudaSetDevice");
      for (int i = t; i < n; i += threads) f(i);
    });
  for (auto& th : pool) th.join();
}

// Writes one byte per 4 KiB page of [p, p+bytes) on every core, so the pages exist before pinning.
void fault_in(char* p, size_t bytes) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const size_t per = (bytes / cores + 4095) / 4096 * 4096;
  std::vector<std::thread> pool;
  for (int c = 0; c < cores; ++c)
    pool.emplace_back([=] {
      const size_t lo = c * per, hi = std::min(bytes, lo + per);
      for (size_t o = lo; o < hi; o += 4096) p[o] = 0;
    });
  for (auto& th : pool) th.join();
}

char* map_anonymous(size_t bytes, bool huge) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  if (huge && madvise(p, bytes, MADV_HUGEPAGE) != 0) std::perror("madvise(MADV_HUGEPAGE)");
  return static_cast<char*>(p);
}

// GB/s of one 1 GiB host-to-device copy from p (after a warm-up copy).
double h2d_gbps(const char* p, void* dev, size_t bytes) {
  check(cudaMemcpy(dev, p, bytes, cudaMemcpyHostToDevice), "warm-up copy");
  const auto t = Clock::now();
  check(cudaMemcpy(dev, p, bytes, cudaMemcpyHostToDevice), "copy");
  return bytes / seconds_since(t) / 1e9;
}

struct Row {
  std::string way;
  int threads;
  double pin_s, fault_s, free_s, gbps;
};

Row host_alloc(int chunks, size_t chunk, int threads, void* dev) {
  std::vector<void*> bufs(chunks);
  const auto t = Clock::now();
  parallel_for(chunks, threads, [&](int i) { check(cudaHostAlloc(&bufs[i], chunk, cudaHostAllocPortable), "alloc"); });
  const double pin = seconds_since(t);
  const double gbps = h2d_gbps(static_cast<char*>(bufs[0]), dev, 1ull << 30);
  const auto tf = Clock::now();
  for (void* b : bufs) check(cudaFreeHost(b), "cudaFreeHost");
  return {"host_alloc", threads, pin, 0.0, seconds_since(tf), gbps};
}

Row chunk_register(int chunks, size_t chunk, int threads, bool huge, void* dev) {
  std::vector<char*> bufs(chunks);
  const auto t0 = Clock::now();
  for (auto& b : bufs) {
    b = map_anonymous(chunk, huge);
    fault_in(b, chunk);
  }
  const double fault = seconds_since(t0);
  const auto t = Clock::now();
  parallel_for(chunks, threads,
               [&](int i) { check(cudaHostRegister(bufs[i], chunk, cudaHostRegisterPortable), "register"); });
  const double pin = seconds_since(t);
  const double gbps = h2d_gbps(bufs[0], dev, 1ull << 30);
  const auto tf = Clock::now();
  for (char* b : bufs) {
    check(cudaHostUnregister(b), "unregister");
    munmap(b, chunk);
  }
  return {huge ? "register_thp" : "register", threads, pin, fault, seconds_since(tf), gbps};
}

Row arena_register(size_t total, bool touch, void* dev) {
  const auto t0 = Clock::now();
  char* p = map_anonymous(total, true);
  if (touch) fault_in(p, total);
  const double fault = seconds_since(t0);
  const auto t = Clock::now();
  check(cudaHostRegister(p, total, cudaHostRegisterPortable), "register");
  const double pin = seconds_since(t);
  const double gbps = h2d_gbps(p, dev, 1ull << 30);
  const auto tf = Clock::now();
  check(cudaHostUnregister(p), "unregister");
  munmap(p, total);
  return {touch ? "arena_thp" : "arena_thp_untouched", 1, pin, fault, seconds_since(tf), gbps};
}

std::string first_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const double total_gib = argc > 1 ? std::atof(argv[1]) : 24.0;
  const double chunk_gib = argc > 2 ? std::atof(argv[2]) : 1.0;
  const size_t chunk = static_cast<size_t>(chunk_gib * (1ull << 30)) / 4096 * 4096;
  const int chunks = static_cast<int>(total_gib / chunk_gib);
  const size_t total = chunk * chunks;
  check(cudaSetDevice(0), "cudaSetDevice");
  void* dev = nullptr;
  check(cudaMalloc(&dev, 1ull << 30), "cudaMalloc");
  std::printf("THP enabled: %s\nTHP defrag: %s\n", first_line("/sys/kernel/mm/transparent_hugepage/enabled").c_str(),
              first_line("/sys/kernel/mm/transparent_hugepage/defrag").c_str());
  std::printf("%d chunks of %.2f GiB (%.1f GiB)\n", chunks, chunk_gib, total / double(1ull << 30));
  std::vector<Row> rows;
  for (int th : {1, 3, 8}) rows.push_back(host_alloc(chunks, chunk, th, dev));
  for (int th : {1, 8}) rows.push_back(chunk_register(chunks, chunk, th, false, dev));
  for (int th : {1, 8}) rows.push_back(chunk_register(chunks, chunk, th, true, dev));
  rows.push_back(arena_register(total, true, dev));
  rows.push_back(arena_register(total, false, dev));
  std::printf("%-20s %7s %9s %9s %9s %9s %9s\n", "way", "threads", "fault_s", "pin_s", "GB/s_pin", "free_s", "H2D_GB/s");
  for (const auto& r : rows)
    std::printf("%-20s %7d %9.2f %9.2f %9.2f %9.2f %9.1f\n", r.way.c_str(), r.threads, r.fault_s, r.pin_s,
                total / (r.pin_s + r.fault_s) / 1e9, r.free_s, r.gbps);
  cudaFree(dev);
  return 0;
}
