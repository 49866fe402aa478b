#include "tandem/engine/device_updater.h"

#include "tandem/engine/update_spans.h"
#include "tandem/kernels/device_adam.h"
#include "tandem/optim/device_coeffs.h"

#include <map>
#include <utility>

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
  // A Block at a time: on ATen's fallback its gradient's fp32 widening lives only through its own
  // update, so the scratch is the largest Block's, not every GPU-updated Block's at once (26 GB for
  // 13B's half in a pipeline stage; Note [Plan layout] counts the largest).
  const auto groups = store_.group_hypers();  // Note [Parameter groups]
  for (const size_t i : gpu) {
    if (!update_with_kernel(i, lr, step, grad_scale, groups.get())) update_fused(i, lr, step, grad_scale, groups.get());
    if (store_.sharded()) store_.gather_working(i, 0);  // on the compute stream
  }
  mark_on_compute(stamps_.gpu1);
}

bool DeviceUpdater::update_with_kernel(size_t block, double lr, int64_t step, double grad_scale,
                                       const std::vector<GroupHyper>* groups) {
  auto& b = store_.blocks()[block];
  const torch::Tensor g = (store_.sharded() ? b.grad_shard : b.grad).narrow(0, 0, b.shard_numel);
  const torch::Tensor out = b.working.narrow(0, b.shard_offset, b.shard_numel);
  if (hyper_.rule != UpdateRule::kAdamW && hyper_.rule != UpdateRule::kAdam) return false;
  if (!device_adam_takes(b.master, g, b.m, b.v, out)) return false;
  const UpdateHyper h = update_hyper(hyper_, lr, step, grad_scale);
  for (const auto& f : b.shard_params) {
    const GroupHyper* group = groups != nullptr && f.group >= 0 ? &groups->at(static_cast<size_t>(f.group)) : nullptr;
    const DeviceAdamCoeffs c = device_adam_coeffs(h, f.weight_decay_scale, group);
    const auto part = [&](const torch::Tensor& t) { return t.narrow(0, f.offset, f.numel); };
    device_adam(part(b.master), part(g), part(b.m), part(b.v), part(out), c,
                static_cast<uint64_t>(b.index_base + b.shard_offset + f.offset));
  }
  return true;
}

void DeviceUpdater::update_fused(size_t block, double lr, int64_t step, double grad_scale,
                                 const std::vector<GroupHyper>* groups) {
  auto& b = store_.blocks()[block];
  // ATen's kernel takes fp32 states: bf16 ones (Note [Device Adam]) widen for the call.
  const bool widen = b.m.scalar_type() != torch::kFloat32;
  const torch::Tensor m = widen ? b.m.to(torch::kFloat32) : b.m, v = widen ? b.v.to(torch::kFloat32) : b.v;
  auto buckets = fused_buckets(block, m, v, lr, grad_scale, groups);
  run_fused(buckets, step);
  if (widen) {
    b.m.copy_(m);
    b.v.copy_(v);
  }
  b.working.narrow(0, b.shard_offset, b.shard_numel).copy_(b.master);
}

std::vector<DeviceUpdater::FusedBucket> DeviceUpdater::fused_buckets(size_t block, const torch::Tensor& m,
                                                                     const torch::Tensor& v, double lr,
                                                                     double grad_scale,
                                                                     const std::vector<GroupHyper>* groups) {
  auto& b = store_.blocks()[block];
  const auto g = (store_.sharded() ? b.grad_shard : b.grad).to(torch::kFloat32) * grad_scale;
  std::vector<FusedBucket> out;
  std::map<std::pair<int, bool>, size_t> index;  // (group, decayed) -> bucket
  for (const auto& f : b.shard_params) {
    const bool grouped = groups != nullptr && f.group >= 0;
    const std::pair<int, bool> key{grouped ? f.group : -1, f.weight_decay_scale != 0.0f};
    auto it = index.find(key);
    if (it == index.end()) {
      FusedBucket bucket;
      bucket.hyper = grouped ? (*groups)[static_cast<size_t>(f.group)]
                             : GroupHyper{lr, adam_.beta1, adam_.beta2, adam_.eps, adam_.weight_decay};
      bucket.hyper.weight_decay *= f.weight_decay_scale;
      it = index.emplace(key, out.size()).first;
      out.push_back(std::move(bucket));
    }
    FusedBucket& bucket = out[it->second];
    bucket.params.push_back(b.master.narrow(0, f.offset, f.numel));
    bucket.grads.push_back(g.narrow(0, f.offset, f.numel));
    bucket.m.push_back(m.narrow(0, f.offset, f.numel));
    bucket.v.push_back(v.narrow(0, f.offset, f.numel));
  }
  return out;
}

void DeviceUpdater::run_fused(std::vector<FusedBucket>& buckets, int64_t step) {
  const auto dev = store_.options().device;
  for (auto& k : buckets) {
    // _fused_adamw_ reads its step tensors as this update's 1-based count (FusedAdamW increments
    // them before the call).
    std::vector<torch::Tensor> steps(k.params.size());
    const GroupHyper& h = k.hyper;
    for (auto& s : steps) s = torch::full({}, double(step - h.steps_before), torch::TensorOptions().device(dev));
    if (adam_.decoupled)
      at::_fused_adamw_(k.params, k.grads, k.m, k.v, {}, steps, h.lr, h.beta1, h.beta2, h.weight_decay, h.eps, false,
                        false, std::nullopt, std::nullopt);
    else
      at::_fused_adam_(k.params, k.grads, k.m, k.v, {}, steps, h.lr, h.beta1, h.beta2, h.weight_decay, h.eps, false,
                       false, std::nullopt, std::nullopt);
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
// exactly whatever either solved. On a GPU the device Adam kernel repeats the CPU kernel's
// arithmetic bit for bit (Note [Device Adam]), so there too the split does not change the result
// (ATen's fused AdamW, the fallback where the kernel is missing, rounds differently in the last
// bits; with offload.delayed_update, where only CPU-updated Blocks lag, the split matters on any
// device).
void DeviceUpdater::update_on_host(const std::vector<size_t>& blocks, double lr, int64_t step, double grad_scale) {
  const auto groups = store_.group_hypers();  // Note [Parameter groups]
  std::vector<UpdateSpan> all;
  std::vector<torch::Tensor> keep;  // fp16 gradients widened, as the copy into the landing buffer widens them
  for (const size_t i : blocks) {
    auto& b = store_.blocks()[i];
    torch::Tensor g = store_.sharded() ? b.grad_shard : b.grad;
    if (g.scalar_type() != torch::kFloat32 && g.scalar_type() != torch::kBFloat16) g = g.to(torch::kFloat32);
    keep.push_back(g);
    const auto sp = block_update_spans(b, g, b.working.narrow(0, b.shard_offset, b.shard_numel), groups.get());
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
