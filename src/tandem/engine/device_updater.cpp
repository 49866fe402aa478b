#include "tandem/engine/device_updater.h"

#include "tandem/engine/update_spans.h"

namespace tandem {

DeviceUpdater::DeviceUpdater(ParamStore& store, AdamWOptions adam, UpdateHyper hyper, CpuThreadPool* pool,
                             const TransferStreams* streams, StepStamps& stamps)
    : store_(store), adam_(adam), hyper_(hyper), pool_(pool), streams_(streams), stamps_(stamps) {}

void DeviceUpdater::mark_on_compute(Stamp& st) {
  if (streams_ == nullptr) return stamps_.mark(st, nullptr);
  const auto compute = streams_->compute();
  stamps_.mark(st, &compute);
}

void DeviceUpdater::update(double lr, int64_t step, double grad_scale) {
  torch::NoGradGuard no_grad;
  std::vector<size_t> gpu;
  for (size_t i = 0; i < store_.blocks().size(); ++i)
    if (store_.blocks()[i].side == UpdateSide::kGpu) gpu.push_back(i);
  if (gpu.empty()) return;
  if (streams_ == nullptr) {  // Note [One update kernel on the CPU device]
    mark_on_compute(stamps_.gpu0);
    update_on_host(gpu, lr, step, grad_scale);
    mark_on_compute(stamps_.gpu1);
    return;
  }
  mark_on_compute(stamps_.gpu0);
  // A Block at a time: its gradient's fp32 widening lives only through its own update, so the
  // scratch is the largest Block's, not every GPU-updated Block's at once (26 GB for 13B's half
  // in a pipeline stage; Note [Plan layout] counts the largest).
  for (const size_t i : gpu) {
    FusedLists lists = fused_lists({i}, grad_scale);
    run_fused(lists, lr, step);
    auto& b = store_.blocks()[i];
    b.working.narrow(0, b.shard_offset, b.shard_numel).copy_(b.master);
    if (store_.sharded()) store_.gather_working(i, 0);  // on the compute stream
  }
  mark_on_compute(stamps_.gpu1);
}

DeviceUpdater::FusedLists DeviceUpdater::fused_lists(const std::vector<size_t>& blocks, double grad_scale) {
  FusedLists l;
  for (const size_t i : blocks) {
    auto& b = store_.blocks()[i];
    const auto g = (store_.sharded() ? b.grad_shard : b.grad).to(torch::kFloat32) * grad_scale;
    for (const auto& f : b.shard_params) {
      const int k = f.weight_decay_scale != 0.0f ? 0 : 1;
      l.params[k].push_back(b.master.narrow(0, f.offset, f.numel));
      l.grads[k].push_back(g.narrow(0, f.offset, f.numel));
      l.m[k].push_back(b.m.narrow(0, f.offset, f.numel));
      l.v[k].push_back(b.v.narrow(0, f.offset, f.numel));
    }
  }
  return l;
}

void DeviceUpdater::run_fused(FusedLists& l, double lr, int64_t step) {
  const auto dev = store_.options().device;
  for (int k = 0; k < 2; ++k) {
    if (l.params[k].empty()) continue;
    // _fused_adamw_ reads its step tensors as this update's 1-based count (FusedAdamW increments
    // them before the call).
    std::vector<torch::Tensor> steps(l.params[k].size());
    for (auto& s : steps) s = torch::full({}, double(step), torch::TensorOptions().device(dev));
    const double wd = k == 0 ? adam_.weight_decay : 0.0;
    if (adam_.decoupled)
      at::_fused_adamw_(l.params[k], l.grads[k], l.m[k], l.v[k], {}, steps, lr, adam_.beta1, adam_.beta2, wd, adam_.eps,
                        false, false, std::nullopt, std::nullopt);
    else
      at::_fused_adam_(l.params[k], l.grads[k], l.m[k], l.v[k], {}, steps, lr, adam_.beta1, adam_.beta2, wd, adam_.eps,
                       false, false, std::nullopt, std::nullopt);
  }
}

// Note [One update kernel on the CPU device]
// The update split is solved from measured times (Note [Update split]), so two runs of one config,
// or a run and its resumption from a checkpoint (which holds no split: the resumed engine starts
// from the memory plan's and measures again), update different Blocks on the device side. With the
// CPU as the device, that side's Blocks are updated by the CPU kernel of the CPU side, with the same
// coefficients (the gradient's scale, the step, the Block's element indices), on the compute thread,
// the new weights written straight into the working copy: which side updates a Block changes when
// the update runs, never a bit of its result, and a resumed run repeats the uninterrupted one
// exactly whatever either solved. ATen's fused AdamW, which the device side runs on a GPU, rounds
// differently from the CPU kernel in the last bits (Note [CPU update kernels]), so on a GPU the
// result still depends on the split (and with offload.delayed_update, where only CPU-updated Blocks
// lag, on any device).
void DeviceUpdater::update_on_host(const std::vector<size_t>& blocks, double lr, int64_t step, double grad_scale) {
  std::vector<UpdateSpan> all;
  std::vector<torch::Tensor> keep;  // fp16 gradients widened, as the copy into the landing buffer widens them
  for (const size_t i : blocks) {
    auto& b = store_.blocks()[i];
    torch::Tensor g = store_.sharded() ? b.grad_shard : b.grad;
    if (g.scalar_type() != torch::kFloat32 && g.scalar_type() != torch::kBFloat16) g = g.to(torch::kFloat32);
    keep.push_back(g);
    const auto sp = block_update_spans(b, g, b.working.narrow(0, b.shard_offset, b.shard_numel));
    all.insert(all.end(), sp.begin(), sp.end());
  }
  cpu_update(all, update_hyper(hyper_, lr, step, grad_scale), nullptr, pool_);
  for (const size_t i : blocks) {
    auto& b = store_.blocks()[i];
    if (b.working.scalar_type() != torch::kBFloat16) b.working.narrow(0, b.shard_offset, b.shard_numel).copy_(b.master);
    if (store_.sharded()) store_.gather_working(i, 0);
  }
}

}  // namespace tandem
