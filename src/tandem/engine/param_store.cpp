#include "tandem/engine/param_store.h"

#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <chrono>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/engine/host_states.h"
#include "tandem/memory/pinned.h"

namespace tandem {

namespace {

torch::Tensor view_of(const torch::Tensor& flat, const FlatParam& p) {
  return flat.narrow(0, p.offset, p.numel).view(p.shape);
}

// dst = src over 1-D host tensors, in chunks on tandem's CPU pool.
void host_copy(torch::Tensor dst, const torch::Tensor& src) {
  constexpr int64_t kChunk = int64_t(1) << 22;
  const int64_t n = dst.numel(), chunks = (n + kChunk - 1) / kChunk;
  CpuThreadPool::global().run(chunks, [&](int64_t c) {
    const int64_t lo = c * kChunk, len = std::min(kChunk, n - lo);
    dst.narrow(0, lo, len).copy_(src.narrow(0, lo, len));
  });
}

}  // namespace

// Zero-filled (Note [Pinned host buffers]): the states and the masters' padding need no clearing.
torch::Tensor ParamStore::host_buffer(int64_t n, torch::ScalarType t) const {
  const bool pin = options_.pin_memory && options_.device.is_cuda();
  return host_tensor(n, t, pin ? HostMemory::kPinned : HostMemory::kPageable);
}

torch::Tensor ParamStore::landing(size_t i, int64_t slot) const {
  const auto& b = blocks_.at(i);
  if (options_.ring_slots == 0) return b.landing;
  return ring_.at(static_cast<size_t>(slot)).landing.narrow(0, 0, b.shard_numel);
}

torch::Tensor ParamStore::staging(size_t i, int64_t slot) const {
  const auto& b = blocks_.at(i);
  if (options_.ring_slots == 0) return b.staging;
  return ring_.at(static_cast<size_t>(slot)).staging.narrow(0, 0, b.shard_numel);
}

ParamStore::ParamStore(BlockSequence& model, ParamStoreOptions options, int64_t gpu_blocks) : options_(options) {
  torch::NoGradGuard no_grad;
  const size_t count = model.block_count();
  TANDEM_CHECK(gpu_blocks >= 0 && gpu_blocks <= static_cast<int64_t>(count), "gpu_blocks=", gpu_blocks,
               " is outside 0 .. ", count);
  TANDEM_ASSERT(options_.host_state_dtype == torch::kFloat32 || options_.host_state_dtype == torch::kBFloat16 ||
                    options_.host_state_dtype == torch::kInt8,
                "host state dtype ", options_.host_state_dtype);
  TANDEM_ASSERT(options_.device_state_dtype == torch::kFloat32 || options_.device_state_dtype == torch::kBFloat16,
                "device state dtype ", options_.device_state_dtype);
  TANDEM_ASSERT(options_.ring_slots == 0 || !options_.undo, "a host ring keeps no undo log");
  TANDEM_ASSERT(options_.nvme_blocks == 0 || !options_.undo, "the NVMe tier keeps no undo log");
  if (options_.nvme_blocks > 0)
    disk_ = std::make_unique<DiskStates>(options_.nvme_path, options_.host_state_dtype,
                                         [this](int64_t n) { return host_buffer(n, torch::kUInt8); });
  TANDEM_ASSERT(options_.shard_count >= 1 && options_.shard_rank >= 0 && options_.shard_rank < options_.shard_count,
                "shard ", options_.shard_rank, " of ", options_.shard_count);
  TANDEM_ASSERT(options_.shard_count == 1 || options_.comm != nullptr, "a sharded store needs the groups");
  int64_t base = 0;
  // Block by Block, each buffer allocated once on its final side, and each Block's parameters
  // rebound (their initial fp32 storage freed) before the next Block: the host never holds the
  // whole initial model and all the masters at once.
  for (size_t bi = 0; bi < count; ++bi) {
    const auto side = static_cast<int64_t>(bi) < gpu_blocks ? UpdateSide::kGpu : UpdateSide::kCpu;
    BlockStore b = describe_block(model, bi, base, side);
    b.nvme = disk_ && static_cast<int64_t>(bi) >= static_cast<int64_t>(count) - options_.nvme_blocks;
    base += b.numel;
    allocate_masters(b);
    bind_to_working(b);
    if (side == UpdateSide::kCpu) allocate_host_side(b);
    blocks_.push_back(std::move(b));
  }
  if (options_.ring_slots > 0) {
    int64_t largest = 0;
    for (const auto& b : blocks_) largest = std::max(largest, b.shard_numel);
    for (int64_t s = 0; s < options_.ring_slots; ++s)
      ring_.push_back({host_buffer(largest, landing_dtype()), host_buffer(largest, options_.compute_dtype)});
  }
}

BlockStore ParamStore::describe_block(BlockSequence& model, size_t bi, int64_t base, UpdateSide side) const {
  BlockStore b;
  b.name = model.block_name(bi);
  b.index_base = base;
  b.side = side;
  for (auto& [name, p] : model.block_parameters(bi)) {
    TANDEM_ASSERT(p.scalar_type() == torch::kFloat32, "parameter ", name, " is ", p.scalar_type(),
                  ", the store takes fp32 masters");
    FlatParam f{name, p, b.numel, p.numel(), p.sizes().vec(), p.dim() >= 2 || options_.decay_1d ? 1.0f : 0.0f};
    b.numel += p.numel();
    b.params.push_back(std::move(f));
  }
  // This rank's slice of the padded range, and the parameters' pieces in it (Note [Sharded store]).
  const int64_t w = options_.shard_count;
  b.padded_numel = (b.numel + w - 1) / w * w;
  b.shard_numel = b.padded_numel / w;
  b.shard_offset = b.shard_numel * options_.shard_rank;
  for (const auto& f : b.params) {
    const int64_t lo = std::max(f.offset, b.shard_offset),
                  hi = std::min(f.offset + f.numel, b.shard_offset + b.shard_numel);
    if (lo < hi)
      b.shard_params.push_back({f.name, f.param, lo - b.shard_offset, hi - lo, {hi - lo}, f.weight_decay_scale});
  }
  return b;
}

void ParamStore::allocate_masters(BlockStore& b) {
  const int64_t sn = b.shard_numel;
  const bool gpu = b.side == UpdateSide::kGpu;
  const auto t_pin = std::chrono::steady_clock::now();
  if (gpu) {
    const auto fdev = torch::TensorOptions().dtype(torch::kFloat32).device(options_.device);
    b.master = torch::zeros({sn}, fdev);
    b.m = torch::zeros({sn}, fdev.dtype(options_.device_state_dtype));
    b.v = torch::zeros({sn}, fdev.dtype(options_.device_state_dtype));
  } else {  // zero-filled and pinned (Note [Pinned host buffers])
    allocate_host_master(b, options_.host_master, [this](int64_t n, torch::ScalarType t) { return host_buffer(n, t); });
    if (b.nvme)
      disk_->evict(b);  // a file of zero states, none in memory
    else
      allocate_host_states(b, options_.host_state_dtype,
                           [this](int64_t n, torch::ScalarType t) { return host_buffer(n, t); });
    pin_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_pin).count();
  }
  for (const auto& f : b.params) {
    const int64_t lo = std::max(f.offset, b.shard_offset), hi = std::min(f.offset + f.numel, b.shard_offset + sn);
    if (lo >= hi) continue;
    auto dst = b.master.narrow(0, lo - b.shard_offset, hi - lo);
    const auto src = f.param.detach().reshape(-1).narrow(0, lo - f.offset, hi - lo);
    if (gpu)
      dst.copy_(src);
    else if (bf16_master(b))
      set_master(b, lo - b.shard_offset, src);
    else
      host_copy(dst, src);
  }
}

void ParamStore::bind_to_working(BlockStore& b) {
  const auto dopts = torch::TensorOptions().dtype(options_.compute_dtype).device(options_.device);
  b.working = torch::zeros({b.padded_numel}, dopts);
  b.grad = torch::zeros({b.padded_numel}, dopts);
  if (sharded()) {
    // Every rank built the same initial model (one seed): its own copy is the gathered weights.
    for (const auto& f : b.params) view_of(b.working, f).copy_(f.param.detach());
    // NCCL reduce-scatters in place (the output is the input's slice for this rank): no second
    // buffer of 1/world of the gradients on the GPU (Note [Sharded store]). Gloo gets its own.
    b.grad_shard =
        options_.comm->nccl() ? b.grad.narrow(0, b.shard_offset, b.shard_numel) : torch::zeros({b.shard_numel}, dopts);
  } else {
    b.working.copy_(b.master);
  }
  for (auto& f : b.params) {
    f.param.set_data(view_of(b.working, f));
    f.param.mutable_grad() = view_of(b.grad, f);
  }
}

torch::ScalarType ParamStore::landing_dtype() const {
  // The CPU kernels read bf16 or fp32 gradients: fp16 ones are widened by the D2H copy.
  return options_.compute_dtype == torch::kBFloat16 ? torch::kBFloat16 : torch::kFloat32;
}

void ParamStore::allocate_host_side(BlockStore& b) {
  if (options_.ring_slots == 0 && !b.landing.defined()) {
    b.landing = host_buffer(b.shard_numel, landing_dtype());
    b.staging = host_buffer(b.shard_numel, options_.compute_dtype);
    b.staging.copy_(b.master);  // a host-run Block computes with it before its first update
  }
  if (options_.undo && !b.undo_master.defined()) allocate_undo_states(b);
}

void ParamStore::bind_working() {
  for (auto& b : blocks_)
    for (auto& f : b.params) {
      f.param.set_data(view_of(b.host_run ? b.staging : b.working, f));
      f.param.mutable_grad() = view_of(b.host_run ? b.landing : b.grad, f);
    }
}

void ParamStore::bind_block(size_t i, bool host) {
  auto& b = blocks_.at(i);
  if (b.host_run == host) return;
  if (host) {
    TANDEM_CHECK(b.side == UpdateSide::kCpu && b.staging.defined() && !sharded() &&
                     b.landing.scalar_type() == options_.compute_dtype,
                 "block ", b.name,
                 " cannot run on the CPU: it must be CPU-updated with its own host buffers in the "
                 "compute dtype (no offload.host_ring, no dist.zero_stage=2, train.precision fp32 or bf16)");
  }
  b.host_run = host;
  for (auto& f : b.params) {
    f.param.set_data(view_of(host ? b.staging : b.working, f));
    f.param.mutable_grad() = view_of(host ? b.landing : b.grad, f);
  }
}

void ParamStore::keep_cpu_updated(const std::vector<bool>& keep) {
  TANDEM_ASSERT(keep.size() == blocks_.size(), "keep_cpu_updated: ", keep.size(), " flags for ", blocks_.size(),
                " blocks");
  keep_cpu_ = keep;
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (keep_cpu_[i]) move_block(i, UpdateSide::kCpu);
}

int64_t ParamStore::gpu_blocks() const {
  return std::count_if(blocks_.begin(), blocks_.end(), [](const BlockStore& b) { return b.side == UpdateSide::kGpu; });
}

void ParamStore::move_block(size_t i, UpdateSide side) {
  TANDEM_ASSERT(i < blocks_.size(), "block ", i, " of ", blocks_.size());
  auto& b = blocks_[i];
  if (b.side == side) return;
  TANDEM_ASSERT(!(b.host_run && side == UpdateSide::kGpu), "block ", b.name, " runs on the CPU: it stays CPU-updated");
  torch::NoGradGuard no_grad;
  // Copies only: fp32 to fp32, so the move is exact in both directions (bf16 host states and a
  // bf16 master widen exactly on the way up and round to nearest on the way down; 8-bit states
  // decode and encode; bf16 device states round to nearest on the way up, Note [Device Adam]).
  const auto to_device = [&](const torch::Tensor& t, torch::ScalarType dtype) {
    return t.to(options_.device, dtype, /*non_blocking=*/false, /*copy=*/true);
  };
  const auto alloc = [this](int64_t n, torch::ScalarType t) { return host_buffer(n, t); };
  if (side == UpdateSide::kGpu) {
    if (b.nvme) disk_->page_in(b);
    const auto [m, v] = states_f32(b);  // views of the paged-in buffer keep it alive
    if (b.nvme) disk_->page_out(b, /*write_back=*/false);
    b.master = to_device(master_f32(b), torch::kFloat32);
    b.master_comp = torch::Tensor();
    b.m = to_device(m, options_.device_state_dtype);
    b.v = to_device(v, options_.device_state_dtype);
    b.m_scale = b.v_scale = torch::Tensor();
  } else {
    const torch::Tensor master = b.master, m = b.m, v = b.v;
    allocate_host_master(b, options_.host_master, alloc);
    set_master(b, 0, master);
    allocate_host_states(b, options_.host_state_dtype, alloc);
    set_states(b, m, v);
    if (b.nvme) disk_->evict(b);
  }
  b.side = side;
  if (side == UpdateSide::kCpu) allocate_host_side(b);
}

void ParamStore::set_gpu_blocks(int64_t gpu_blocks) {
  int64_t given = 0;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const bool keep = i < keep_cpu_.size() && keep_cpu_[i];
    const bool gpu = !keep && given < gpu_blocks;
    if (gpu) ++given;
    move_block(i, gpu ? UpdateSide::kGpu : UpdateSide::kCpu);
  }
}

void ParamStore::restore_grad_views() {
  for (auto& b : blocks_) {
    const torch::Tensor& flat = b.host_run ? b.landing : b.grad;
    for (auto& f : b.params) {
      const torch::Tensor want = view_of(flat, f);
      const torch::Tensor& g = f.param.grad();
      if (!g.defined() || g.data_ptr() != want.data_ptr()) f.param.mutable_grad() = want;
    }
  }
}

void ParamStore::sync_working_from_master() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    auto& b = blocks_[i];
    b.working.narrow(0, b.shard_offset, b.shard_numel).copy_(b.master);
    if (sharded()) gather_working(i, 0);
    if (b.side == UpdateSide::kCpu && b.staging.defined()) b.staging.copy_(b.master);
    b.mirror_lag = 0;
  }
}

void ParamStore::gather_working(size_t i, int lane) {
  auto& b = blocks_.at(i);
  auto mine = b.working.narrow(0, b.shard_offset, b.shard_numel);
  // NCCL gathers in place (the input is the output's slice for this rank); Gloo gets its own copy.
  auto input = options_.comm->nccl() ? mine : mine.clone();
  auto work = options_.comm->device_group(lane)._allgather_base(b.working, input);
  work->wait();  // NCCL: the current stream waits for the gather; Gloo: the host does
}

std::vector<NamedTensor> ParamStore::shard_state() {
  std::vector<NamedTensor> out;
  for (auto& b : blocks_) {
    const ResidentStates resident(disk(), b);  // NVMe tier: the views below keep the states read in
    torch::Tensor m = b.m, v = b.v;
    if (q8_states(b)) std::tie(m, v) = states_f32(b);  // fp32 copies, 8 bytes a parameter while written
    out.emplace_back(b.name + ".master", master_f32(b));  // an fp32 copy of a bf16 master
    out.emplace_back(b.name + ".exp_avg", m);
    out.emplace_back(b.name + ".exp_avg_sq", v);
  }
  return out;
}

void ParamStore::load_shard_state(
    const std::function<void(const std::string&, const std::string&, int64_t, int64_t, torch::Tensor)>& read) {
  torch::NoGradGuard no_grad;
  for (auto& b : blocks_) {
    // The slice past the Block's end is padding: it stays zero.
    const int64_t n = std::max<int64_t>(0, std::min(b.shard_numel, b.numel - b.shard_offset));
    const auto slice = [&](const std::string& kind) {
      auto tmp = torch::zeros({b.shard_numel}, torch::kFloat32);
      if (n > 0) read(b.name, kind, b.shard_offset, n, tmp.narrow(0, 0, n));
      return tmp;
    };
    set_master(b, 0, slice("master"));
    ResidentStates resident(disk(), b);
    set_states(b, slice("exp_avg"), slice("exp_avg_sq"));
    resident.commit();
  }
  sync_working_from_master();
}

void ParamStore::with_masters_bound(const std::function<void()>& fn) {
  TANDEM_ASSERT(!sharded(), "a sharded store has no whole masters to bind (Note [Sharded checkpoints])");
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
  TANDEM_ASSERT(!sharded(), "a sharded store's state is per rank (shard_state)");
  std::vector<NamedTensor> out;
  for (auto& b : blocks_) {
    const ResidentStates resident(disk(), b);  // NVMe tier: the views below keep the states read in
    torch::Tensor m = b.m, v = b.v;
    if (q8_states(b)) std::tie(m, v) = states_f32(b);  // fp32 copies, 8 bytes a parameter while written
    for (auto& f : b.params) {
      out.emplace_back(f.name + ".exp_avg", view_of(m, f));
      out.emplace_back(f.name + ".exp_avg_sq", view_of(v, f));
      out.emplace_back(f.name + ".step", step);
      if (b.master_comp.defined()) out.emplace_back(f.name + ".master_comp", view_of(b.master_comp, f));
    }
  }
  return out;
}

void ParamStore::load_state(const std::function<std::optional<torch::Tensor>(const std::string&)>& lookup,
                            const std::string& source, torch::Tensor& step) {
  TANDEM_ASSERT(!sharded(), "a sharded store loads per rank (load_shard_state)");
  torch::NoGradGuard no_grad;
  const auto get = [&](const FlatParam& f, const char* kind, int64_t numel) {
    const std::string name = f.name + "." + kind;
    const auto t = lookup(name);
    TANDEM_CHECK(t.has_value(), source, ": optimizer state '", name,
                 "' is missing; the checkpoint does not match this model or optim.type");
    TANDEM_CHECK(t->numel() == numel, source, ": optimizer state '", name, "' has shape ", t->sizes(),
                 " but the model needs ", numel == 1 ? std::vector<int64_t>{} : f.shape,
                 "; resume with the checkpoint's model settings");
    return *t;
  };
  for (auto& b : blocks_) {
    ResidentStates resident(disk(), b);
    for (size_t k = 0; k < b.params.size(); ++k) {  // unsharded: params and shard_params coincide
      const FlatParam& f = b.params[k];
      set_param_states(b, k, get(f, "exp_avg", f.numel), get(f, "exp_avg_sq", f.numel));
      if (!b.master_comp.defined()) continue;
      // A checkpoint of an fp32 or stochastically rounded master has no compensation: it starts at zero.
      const auto comp = lookup(f.name + ".master_comp");
      TANDEM_CHECK(!comp || comp->numel() == f.numel, source, ": '", f.name, ".master_comp' has shape ",
                   comp ? comp->sizes() : torch::IntArrayRef{}, " but the model needs ", f.shape);
      if (comp)
        b.master_comp.narrow(0, f.offset, f.numel).copy_(comp->reshape(-1));
      else
        b.master_comp.narrow(0, f.offset, f.numel).zero_();
    }
    resident.commit();
  }
  TANDEM_CHECK(!blocks_.empty() && !blocks_.front().params.empty(), source, ": the engine holds no parameters");
  step.copy_(get(blocks_.front().params.front(), "step", 1).reshape({}));
}

// Note [Parameter groups]
// torch.optim's param_groups give parameters their own lr, betas, eps and weight decay, and every
// parameter of a group is decayed by the group's weight decay (a bias or a norm scale too); the
// engine's own convention, as GPT and LLaMA recipes train, is one set of hyper-parameters and no
// decay of 1-D parameters. OffloadAdamW assigns each parameter its group once (assign_groups) and,
// before each step, the groups' current values (set_group_hypers: a scheduler's lr, a group changed
// between steps); each update span points at its group's entry of the table current when its
// update was queued (a shared snapshot: a CPU update still running from the last step keeps its
// values), and the CPU kernels and the GPU's fused update use those instead of the engine's.
void ParamStore::assign_groups(const std::function<int(const torch::Tensor&)>& group_of) {
  for (auto& b : blocks_) {
    for (auto& f : b.params) {
      f.group = group_of(f.param);
      if (f.group >= 0) f.weight_decay_scale = 1.0f;
    }
    for (auto& f : b.shard_params) {
      f.group = group_of(f.param);
      if (f.group >= 0) f.weight_decay_scale = 1.0f;
    }
  }
}

void ParamStore::set_group_hypers(std::vector<GroupHyper> groups) {
  groups_ = std::make_shared<const std::vector<GroupHyper>>(std::move(groups));
}

std::shared_ptr<const std::vector<GroupHyper>> ParamStore::group_hypers() const { return groups_; }

std::pair<BlockStore*, const FlatParam*> ParamStore::find(const torch::Tensor& param) {
  TANDEM_ASSERT(!sharded(), "a parameter's state from a sharded store");
  for (auto& b : blocks_)
    for (const auto& f : b.params)
      if (f.param.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return {&b, &f};
  TANDEM_FAIL("a parameter of shape ", param.sizes(),
              " is not among the engine's: the optimizer's parameters must be the model's trainable ones");
}

std::vector<torch::Tensor> ParamStore::param_state(const torch::Tensor& param) {
  const auto [b, f] = find(param);
  const ResidentStates resident(disk(), *b);  // NVMe tier: copies, not the live states
  const auto [m, v] = param_states_f32(*b, static_cast<size_t>(f - b->params.data()));
  const auto shaped = [&](const torch::Tensor& t) { return t.view(f->shape); };
  return {shaped(master_f32(*b, f->offset, f->numel)), shaped(m), shaped(v)};
}

void ParamStore::load_param_state(const torch::Tensor& param, const torch::Tensor& master, const torch::Tensor& m,
                                  const torch::Tensor& v) {
  torch::NoGradGuard no_grad;
  auto [bp, f] = find(param);
  BlockStore& b = *bp;
  for (const auto& [src, what] : {std::pair{master, "master"}, std::pair{m, "exp_avg"}, std::pair{v, "exp_avg_sq"}})
    TANDEM_CHECK(src.numel() == f->numel, "the state's ", what, " of ", f->name, " has ", src.numel(),
                 " elements, the parameter ", f->numel);
  set_master(b, f->offset, master);
  ResidentStates resident(disk(), b);
  set_param_states(b, static_cast<size_t>(f - b.params.data()), m, v);
  resident.commit();
  const torch::Tensor new_weights = b.master.narrow(0, f->offset, f->numel);
  view_of(b.working, *f).copy_(new_weights.view(f->shape));
  if (b.staging.defined()) b.staging.narrow(0, f->offset, f->numel).copy_(new_weights);
}

}  // namespace tandem
