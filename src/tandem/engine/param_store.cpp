#include "tandem/engine/param_store.h"

#include "tandem/core/error.h"

namespace tandem {

namespace {

torch::Tensor view_of(const torch::Tensor& flat, const FlatParam& p) {
  return flat.narrow(0, p.offset, p.numel).view(p.shape);
}

}  // namespace

torch::Tensor ParamStore::host_buffer(int64_t n, torch::ScalarType t) const {
  const bool pin = options_.pin_memory && options_.device.is_cuda();
  return torch::empty({n}, torch::TensorOptions().dtype(t).pinned_memory(pin));
}

ParamStore::ParamStore(Model& model, ParamStoreOptions options, int64_t gpu_blocks) : options_(options) {
  torch::NoGradGuard no_grad;
  const auto& blocks = model.blocks();
  TANDEM_CHECK(gpu_blocks >= 0 && gpu_blocks <= static_cast<int64_t>(blocks.size()), "gpu_blocks=", gpu_blocks,
               " is outside 0 .. ", blocks.size());
  int64_t base = 0;
  for (const auto& block : blocks) {
    BlockStore b;
    b.name = block->name();
    b.index_base = base;
    for (auto& [name, p] : block->hf_parameters()) {
      TANDEM_ASSERT(p.scalar_type() == torch::kFloat32, "parameter ", name, " is ", p.scalar_type(),
                    ", the store takes fp32 masters");
      FlatParam f{name, p, b.numel, p.numel(), p.sizes().vec(), p.dim() >= 2 ? 1.0f : 0.0f};
      b.numel += p.numel();
      b.params.push_back(std::move(f));
    }
    base += b.numel;
    // The master starts on the host: every Block is CPU-updated until set_gpu_blocks() below.
    b.master = host_buffer(b.numel, torch::kFloat32);
    for (const auto& f : b.params) view_of(b.master, f).copy_(f.param.detach().to(torch::kCPU));
    b.m = host_buffer(b.numel, torch::kFloat32).zero_();
    b.v = host_buffer(b.numel, torch::kFloat32).zero_();
    // The CPU kernels read bf16 or fp32 gradients: fp16 ones are widened by the D2H copy.
    b.landing = host_buffer(b.numel, options_.compute_dtype == torch::kBFloat16 ? torch::kBFloat16 : torch::kFloat32);
    b.staging = host_buffer(b.numel, options_.compute_dtype);
    if (options_.undo) {
      b.undo_master = torch::empty({b.numel}, torch::kFloat32);
      b.undo_m = torch::empty({b.numel}, torch::kFloat32);
      b.undo_v = torch::empty({b.numel}, torch::kFloat32);
    }
    const auto dopts = torch::TensorOptions().dtype(options_.compute_dtype).device(options_.device);
    b.working = torch::empty({b.numel}, dopts);
    b.grad = torch::zeros({b.numel}, dopts);
    blocks_.push_back(std::move(b));
  }
  bind_working();
  sync_working_from_master();
  set_gpu_blocks(gpu_blocks);
}

void ParamStore::bind_working() {
  for (auto& b : blocks_)
    for (auto& f : b.params) {
      f.param.set_data(view_of(b.working, f));
      f.param.mutable_grad() = view_of(b.grad, f);
    }
}

int64_t ParamStore::gpu_blocks() const {
  int64_t g = 0;
  while (g < static_cast<int64_t>(blocks_.size()) && blocks_[g].side == UpdateSide::kGpu) ++g;
  return g;
}

void ParamStore::move_block(size_t i, UpdateSide side) {
  TANDEM_ASSERT(i < blocks_.size(), "block ", i, " of ", blocks_.size());
  auto& b = blocks_[i];
  if (b.side == side) return;
  torch::NoGradGuard no_grad;
  // Copies only: fp32 to fp32, so the move is exact in both directions.
  const auto move = [&](const torch::Tensor& t) {
    if (side == UpdateSide::kGpu) return t.to(options_.device, /*non_blocking=*/false, /*copy=*/true);
    auto h = host_buffer(t.numel(), torch::kFloat32);
    h.copy_(t);
    return h;
  };
  b.master = move(b.master);
  b.m = move(b.m);
  b.v = move(b.v);
  b.side = side;
}

void ParamStore::set_gpu_blocks(int64_t gpu_blocks) {
  for (size_t i = 0; i < blocks_.size(); ++i)
    move_block(i, static_cast<int64_t>(i) < gpu_blocks ? UpdateSide::kGpu : UpdateSide::kCpu);
}

void ParamStore::sync_working_from_master() {
  torch::NoGradGuard no_grad;
  for (auto& b : blocks_) b.working.copy_(b.master);
}

void ParamStore::zero_grad() {
  for (auto& b : blocks_) b.grad.zero_();
}

void ParamStore::with_masters_bound(const std::function<void()>& fn) {
  for (auto& b : blocks_)
    for (auto& f : b.params) f.param.set_data(view_of(b.master, f));
  try {
    fn();
  } catch (...) {
    bind_working();
    throw;
  }
  bind_working();
  sync_working_from_master();
}

std::vector<NamedTensor> ParamStore::state(const torch::Tensor& step) {
  std::vector<NamedTensor> out;
  for (auto& b : blocks_)
    for (auto& f : b.params) {
      out.emplace_back(f.name + ".exp_avg", view_of(b.m, f));
      out.emplace_back(f.name + ".exp_avg_sq", view_of(b.v, f));
      out.emplace_back(f.name + ".step", step);
    }
  return out;
}

}  // namespace tandem
