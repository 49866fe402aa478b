#include "tandem/engine/host_masters.h"

#include "tandem/core/error.h"
#include "tandem/engine/param_store.h"
#include "tandem/optim/cpu_update.h"

namespace tandem {

bool bf16_master(const BlockStore& b) { return b.master.defined() && b.master.scalar_type() == torch::kBFloat16; }

void allocate_host_master(BlockStore& b, MasterKind kind,
                          const std::function<torch::Tensor(int64_t, torch::ScalarType)>& alloc) {
  b.master = alloc(b.shard_numel, kind == MasterKind::kFp32 ? torch::kFloat32 : torch::kBFloat16);
  b.master_comp = kind == MasterKind::kBf16Kahan ? alloc(b.shard_numel, torch::kBFloat16) : torch::Tensor();
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
  // Rounded as the CPU kernels round (subnormals to zero), and split into the pair an update stores.
  const torch::Tensor host = src.to(torch::kCPU, torch::kFloat32).contiguous();
  const auto u16 = [&](const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()) + offset; };
  if (b.master_comp.defined())
    cpu_split_bf16(host.data_ptr<float>(), u16(b.master), u16(b.master_comp), n);
  else
    cpu_to_bf16(host.data_ptr<float>(), u16(b.master), n);
}

}  // namespace tandem
