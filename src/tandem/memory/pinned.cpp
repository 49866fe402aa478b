#include "tandem/memory/pinned.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/core/thread_pool.h"

namespace tandem {

namespace {

constexpr size_t kHugePage = size_t(2) << 20;
constexpr size_t kPage = 4096;

// An anonymous mapping of `bytes` (a multiple of kPage) aligned to kHugePage when it is at least
// that large, so that the kernel can back it with transparent huge pages; nullptr when refused.
void* map_zeroed(size_t bytes) {
  const bool huge = bytes >= kHugePage;
  const size_t span = huge ? bytes + kHugePage : bytes;
  void* p = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (!huge) return p;
  auto* base = static_cast<char*>(p);
  auto* aligned = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) & ~(kHugePage - 1));
  if (aligned > base) munmap(base, static_cast<size_t>(aligned - base));
  const size_t tail = static_cast<size_t>(base + span - (aligned + bytes));
  if (tail > 0) munmap(aligned + bytes, tail);
  (void)madvise(aligned, bytes, MADV_HUGEPAGE);  // a kernel without THP keeps 4 KiB pages
  return aligned;
}

// Touches one byte per page on tandem's CPU pool, so that the pages exist (zeroed by the kernel,
// in parallel) before the driver locks them.
void fault_in(void* p, size_t bytes) {
  constexpr size_t kChunk = size_t(64) << 20;
  auto* base = static_cast<volatile char*>(p);
  const auto chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
  CpuThreadPool::global().run(chunks, [&](int64_t c) {
    const size_t lo = static_cast<size_t>(c) * kChunk, hi = std::min(bytes, lo + kChunk);
    for (size_t o = lo; o < hi; o += kPage) base[o] = 0;
  });
}

}  // namespace

torch::Tensor host_tensor(int64_t n, torch::ScalarType dtype, HostMemory memory) {
  auto* acc = memory == HostMemory::kPinned ? accelerator() : nullptr;
  if (acc != nullptr && acc->device_count() == 0) acc = nullptr;  // a CUDA build on a machine without a GPU
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * c10::elementSize(dtype);
  const size_t mapped = (bytes + kPage - 1) / kPage * kPage;
  void* p = map_zeroed(mapped);
  TANDEM_CHECK(p != nullptr, "could not map ", strprintf("%.2f GiB", double(bytes) / (1 << 30)),
               " of host memory for the offload engine (", std::strerror(errno),
               "): lower the host tier (optim.state_dtype=bf16 or int8, offload.host_memory_fraction) as `tandem inspect "
               "--plan` shows");
  fault_in(p, mapped);
  if (acc != nullptr && !acc->host_register(p, mapped)) {
    munmap(p, mapped);
    TANDEM_CHECK(false, "could not pin ", strprintf("%.2f GiB", double(bytes) / (1 << 30)),
                 " of host memory for the offload engine: the host is short of lockable memory; set "
                 "offload.pin_memory=false, or lower the host tier (optim.state_dtype=bf16 or int8, offload.host_ring) as "
                 "`tandem inspect --plan` shows");
  }
  return torch::from_blob(
      p, {n},
      [acc, mapped](void* q) {
        if (acc != nullptr) acc->host_unregister(q);
        munmap(q, mapped);
      },
      torch::TensorOptions().dtype(dtype));
}

std::function<torch::Tensor(int64_t)> pinned_slabs() {
  return [](int64_t bytes) { return host_tensor(bytes, torch::kUInt8, HostMemory::kPinned); };
}

}  // namespace tandem
