#include "tandem/engine/host_masters.h"

#include <algorithm>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/engine/param_store.h"

namespace tandem {

bool bf16_master(const BlockStore& b) { return b.master.defined() && b.master.scalar_type() == torch::kBFloat16; }

void allocate_host_master(BlockStore& b, HostMaster kind,
                          const std::function<torch::Tensor(int64_t, torch::ScalarType)>& alloc) {
  b.master = alloc(b.shard_numel, kind == HostMaster::kFp32 ? torch::kFloat32 : torch::kBFloat16);
  b.master_comp = kind == HostMaster::kBf16Kahan ? alloc(b.shard_numel, torch::kBFloat16) : torch::Tensor();
}

torch::Tensor master_f32(const BlockStore& b, int64_t offset, int64_t n) {
  const torch::Tensor hi = b.master.narrow(0, offset, n);
  if (!bf16_master(b)) return hi;
  torch::Tensor out = hi.to(torch::kFloat32);
  if (b.master_comp.defined()) out.add_(b.master_comp.narrow(0, offset, n).to(torch::kFloat32));
  return out;
}

torch::Tensor master_f32(const BlockStore& b) { return master_f32(b, 0, b.shard_numel); }

void set_master(BlockStore& b, int64_t offset, const torch::Tensor& x) {
  torch::NoGradGuard no_grad;
  const int64_t n = x.numel();
  TANDEM_ASSERT(offset >= 0 && offset + n <= b.master.numel(), "block ", b.name, ": master elements ", offset, " + ",
                n, " beyond its ", b.master.numel());
  const torch::Tensor src = x.reshape(-1);
  if (!bf16_master(b)) {
    b.master.narrow(0, offset, n).copy_(src);
    return;
  }
  // In chunks on tandem's pool: a 20 B-parameter model's masters pass through here at start-up.
  const torch::Tensor host = src.to(torch::kCPU, torch::kFloat32).contiguous();
  constexpr int64_t kChunk = int64_t(1) << 22;
  CpuThreadPool::global().run((n + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t lo = c * kChunk, len = std::min(kChunk, n - lo);
    const torch::Tensor part = host.narrow(0, lo, len);
    torch::Tensor hi = b.master.narrow(0, offset + lo, len);
    hi.copy_(part);  // rounded to nearest even
    if (b.master_comp.defined()) b.master_comp.narrow(0, offset + lo, len).copy_(part - hi.to(torch::kFloat32));
  });
}

}  // namespace tandem
