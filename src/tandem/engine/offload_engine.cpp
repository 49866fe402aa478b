#include "tandem/engine/offload_engine.h"

#include <c10/core/StreamGuard.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>

#include "tandem/core/error.h"
#include "tandem/engine/cpu_updater.h"
#include "tandem/engine/device_updater.h"
#include "tandem/engine/offload_trace.h"
#include "tandem/engine/step_stamps.h"
#include "tandem/engine/transfer_streams.h"

namespace tandem {

// Note [Gradient streaming]
// Each parameter carries a post-accumulate-grad hook; a Block is complete when every one of its
// parameters has fired in the last micro-batch's backward (a tied weight fires once, with both
// uses summed, so the embedding completes last). Its squared gradient norm is then queued on the
// compute stream and, for a CPU-updated Block:
//   compute stream: event G_i      D2H stream: waits G_i, copies grad -> landing, event D_i
//   updater thread: waits D_i on the host, runs the fused CPU update (master, m, v in place; the
//                   new weights in the compute dtype straight into staging)
//   H2D stream:     copies staging -> working, event U_i
// No device-wide synchronisation: the next step's forward waits, per Block, only for U_i (the
// host waits until the updater has issued the copy, the compute stream waits on U_i). The
// GPU-updated Blocks (the update split's prefix) complete last and are updated on the compute
// stream in end_step(). With the CPU as the device the streams are the calling thread, copies are
// memcpy and the updater thread still runs beside autograd. The engine dispatches each Block and
// copies its gradient down; the CpuUpdater runs the updater thread and the copies up, the
// DeviceUpdater the GPU-updated Blocks; TransferStreams holds the streams and G_i, D_i, U_i.
//
// Note [Speculative clipping]
// Global-norm clipping and the non-finite check need every gradient, but the CPU updates start as
// soon as the first Block completes. They run speculatively with clip coefficient 1 and an undo
// log (the overwritten master and states). end_step() reads the global norm once (one host
// synchronisation per step, which the trainer makes anyway for its metrics): when it is finite and
// within the clip, the speculation was right; when clipping applies, the CPU Blocks are rolled back
// bit for bit and updated again with the coefficient; when it is not finite, they are rolled back
// and the step is skipped. The result is exactly synchronous AdamW with clipping; the cost is the
// undo log's host memory and one repeated CPU update per clipped step (counted in stats().rollbacks).
// Early in training most steps clip, and a rollback costs more than waiting for the norm, so by
// default (Speculate::kAuto) the engine speculates only after 8 steps in a row that would not have
// rolled back, and otherwise queues the CPU updates in forward order once the norm is known.

namespace {

// Steps in a row that would not have rolled back before kAuto speculates (Note [Speculative clipping]).
constexpr size_t kSpeculationWindow = 8;

struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  std::function<void()> fn;
  explicit ReadyHook(std::function<void()> f) : fn(std::move(f)) {}
  void operator()(const torch::autograd::Variable&) override { fn(); }
};

// The CPU kernel's coefficients for the engine's optimizer; each update sets lr, step and scale.
UpdateHyper base_hyper(const EngineOptions& o) {
  UpdateHyper h;
  h.rule = o.adam.decoupled ? UpdateRule::kAdamW : UpdateRule::kAdam;
  h.beta1 = o.adam.beta1;
  h.beta2 = o.adam.beta2;
  h.eps = o.adam.eps;
  h.weight_decay = o.adam.weight_decay;
  h.rounding = o.state_rounding;
  return h;
}

SplitTunerOptions tuner_options(const EngineOptions& o, const UpdateHyper& hyper) {
  SplitTunerOptions t;
  t.solve = o.solve_split;
  t.fixed_k = o.fixed_k;
  t.min_gpu_blocks = o.min_gpu_blocks;
  t.max_gpu_blocks = o.max_gpu_blocks;
  t.first_solve_step = o.first_solve_step;
  t.resolve_every = o.resolve_every;
  t.hyper = hyper;
  t.pool = o.pool;
  t.comm = o.comm;
  t.log = o.log;
  return t;
}

OffloadTraceOptions trace_options(const EngineOptions& o) {
  OffloadTraceOptions t;
  t.steps = o.trace_steps;
  t.path = o.trace_path;
  t.counters = o.trace_counters;
  t.log = o.log;
  return t;
}

}  // namespace

OffloadEngine::OffloadEngine(BlockSequence& model, ParamStore& store, EngineOptions options)
    : model_(model),
      store_(store),
      options_(std::move(options)),
      cuda_(store.options().device.is_cuda()),
      ring_(store.options().ring_slots > 0) {
  check_options();
  const size_t n = store_.blocks().size();
  remaining_.assign(n, 0);
  dispatched_.assign(n, 0);
  sqnorm_.resize(n);
  if (ring_)
    for (size_t i = 0; i < n; ++i)
      sqnorm_host_.push_back(torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(cuda_)));
  host_run_.assign(n, false);
  upload_now_.assign(n, true);
  zero_landing_.assign(n, false);
  step_tensor_ = torch::zeros({}, torch::kFloat32);
  if (cuda_) streams_ = std::make_unique<TransferStreams>(store_.options().device, n);
  stamps_ = std::make_unique<StepStamps>(n, cuda_);
  const UpdateHyper hyper = base_hyper(options_);
  tuner_ = std::make_unique<SplitTuner>(store_, *stamps_, streams_.get(), tuner_options(options_, hyper));
  trace_ = std::make_unique<OffloadTrace>(trace_options(options_), cuda_);
  device_updater_ =
      std::make_unique<DeviceUpdater>(store_, options_.adam, hyper, options_.pool, streams_.get(), *stamps_);
  for (size_t i = 0; i < n; ++i)
    for (auto& f : store_.blocks()[i].params)
      torch::autograd::impl::set_post_acc_grad_hooks(f.param,
                                                     std::make_unique<ReadyHook>([this, i] { on_param_ready(i); }));
  if (options_.delayed) {  // Note [Delayed update]: the backward's order, and the ring's waits
    arrived_.assign(n, 0);
    await_gradient_taken_.assign(n, 0);
    for (size_t i = 0; i < n; ++i)
      for (auto& f : store_.blocks()[i].params)
        gradient_prehooks_.emplace_back(
            f.param, f.param.register_hook([this, i](const torch::Tensor&) { on_gradient_arriving(i); }));
  }
  model_.set_before_block([this](size_t i) { before_block(i); });
  updater_ = std::make_unique<CpuUpdater>(store_, CpuUpdaterOptions{hyper, options_.pool, false}, streams_.get(),
                                          *stamps_);
}

OffloadEngine::~OffloadEngine() {
  updater_.reset();  // runs what is queued, then stops the thread
  model_.set_before_block(nullptr);
  for (auto& [param, hook] : gradient_prehooks_) param.remove_hook(hook);
  for (auto& b : store_.blocks())
    for (auto& f : b.params) torch::autograd::impl::set_post_acc_grad_hooks(f.param, nullptr);
}

void OffloadEngine::check_options() const {
  TANDEM_CHECK(!(options_.delayed && options_.speculate == EngineOptions::Speculate::kAlways),
               "offload.delayed_update=true updates once the norm is known; it does not speculate. Set "
               "offload.speculate=auto or never");
  TANDEM_CHECK(store_.disk() == nullptr || options_.speculate == EngineOptions::Speculate::kNever ||
                   (options_.delayed && options_.delayed_after == 0),
               "the NVMe tier (offload.nvme_path) updates each Block once the norm is known (no undo log on disk): "
               "set offload.speculate=never, or unset offload.nvme_path");
  TANDEM_CHECK(!ring_ || !options_.delayed || store_.options().ring_slots >= kDelayedRingSlots,
               "a delayed update through a host ring needs at least ", kDelayedRingSlots,
               " slots (one may wait for a tied embedding; Note [Delayed host ring]); got offload.host_ring=",
               store_.options().ring_slots, ": set offload.host_ring=4");
  TANDEM_CHECK(options_.mirror_every >= 1, "placement.mirror_every must be >= 1, got ", options_.mirror_every);
  TANDEM_CHECK(options_.mirror_every == 1 || (!options_.delayed && !ring_),
               "placement.mirror_every > 1 (stale device copies) does not combine with offload.delayed_update or a "
               "host ring; set placement.mirror_every=1");
}

EngineStats OffloadEngine::stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    s = stats_;
  }
  const CpuUpdaterCounters c = updater_->counters();
  s.cpu_update_s = c.cpu_update_s;
  s.transfer_s = c.transfer_s;
  s.cpu_updated_params = c.cpu_updated_params;
  s.nvme_wait_s = c.nvme_wait_s;
  if (const DiskStates* disk = store_.disk()) {
    const NvmeCounters n = disk->tier().counters();
    s.nvme_read_bytes = n.read_bytes;
    s.nvme_written_bytes = n.written_bytes;
  }
  return s;
}

std::vector<double> OffloadEngine::block_seconds() const { return stamps_->block_seconds(); }

void OffloadEngine::mark_on_compute(Stamp& st) {
  if (!cuda_) return stamps_->mark(st, nullptr);
  const auto compute = streams_->compute();
  stamps_->mark(st, &compute);
}

void OffloadEngine::sync_streams() {
  if (streams_) streams_->synchronize();
}

void OffloadEngine::begin_step(double lr, double loss_scale) {
  TANDEM_ASSERT(loss_scale > 0, "loss scale ", loss_scale);
  if (options_.delayed && !delayed_now_ && stats_.steps >= options_.delayed_after) start_delayed();
  const bool solve_now = tuner_->begin_step(steps_begun_);
  if (trace_->active()) collect_trace();
  if (solve_now) resolve_split();
  ++steps_begun_;
  if (trace_->traces(steps_begun_)) start_trace();
  lr_ = lr;
  loss_scale_ = loss_scale;
  std::fill(dispatched_.begin(), dispatched_.end(), 0);
  for (size_t i = 0; i < dispatched_.size(); ++i) {
    upload_now_[i] = !host_run_[i] && store_.blocks()[i].mirror_lag + 1 >= options_.mirror_every;
    zero_landing_[i] = host_run_[i];
  }
  using S = EngineOptions::Speculate;
  speculate_now_ =
      !delayed_now_ && (options_.speculate == S::kAlways ||
                            (options_.speculate == S::kAuto && would_roll_back_.size() >= kSpeculationWindow &&
                             std::none_of(would_roll_back_.begin(), would_roll_back_.end(), [](bool b) { return b; })));
  if (speculate_now_) ++stats_.speculative_steps;
  if (delayed_now_) {
    ++stats_.delayed_steps;
    std::fill(arrived_.begin(), arrived_.end(), 0);
    backward_order_.clear();
  }
}

void OffloadEngine::begin_micro(bool last) {
  TANDEM_CHECK(last || !(ring_ && options_.delayed),
               "a delayed update through a host ring takes one micro-batch per step (its slots are freed by the last "
               "micro-batch's backward, Note [Delayed host ring]): set train.grad_accum=1, offload.host_ring=0 or "
               "offload.delayed_update=false");
  last_micro_ = last;
  in_forward_ = true;
  for (size_t i = 0; i < remaining_.size(); ++i) remaining_[i] = static_cast<int64_t>(store_.blocks()[i].params.size());
}

// Note [Delayed update]: a gradient about to be added to Block i's buffer. The first one of a step
// records the backward's order; with a ring it waits until the gradient of Block i's last queued
// update has been copied out of that buffer (Note [Delayed host ring]). One autograd thread: a
// delayed update runs no Block on the CPU.
void OffloadEngine::on_gradient_arriving(size_t i) {
  if (!delayed_now_ || arrived_[i]) return;
  arrived_[i] = 1;
  backward_order_.push_back(i);
  if (!await_gradient_taken_[i]) return;
  updater_->wait_gradient_taken(i);
  if (cuda_) streams_->compute().wait(*streams_->landed[i]);
  await_gradient_taken_[i] = 0;
}

void OffloadEngine::on_param_ready(size_t block) {
  in_forward_ = false;  // a recomputed forward (checkpointing) is not timed as forward
  // A gradient into a Block already dispatched (a second backward through a retained graph) would
  // race with its update: refused.
  TANDEM_CHECK(!(last_micro_ && dispatched_[block]), "a second backward into ", store_.blocks()[block].name,
               " before the optimizer's step: the engine is already updating it from the first; call the "
               "step after each backward, or accumulate through train.grad_accum (tandem.Engine)");
  if (--remaining_[block] == 0 && last_micro_ && !dispatched_[block]) dispatch(block);
}

// Note [Data-parallel engine]
// With several ranks, a Block's gradient is summed over them the moment backward completes it: the
// collective is queued behind the Block's backward on the compute stream (NCCL runs it on its own
// stream), and the D2H stream, not the compute stream, waits for it, so the backward of the
// earlier Blocks goes on while the reduction and the copy down run. The squared norm is taken on
// the D2H stream too, and grad_ready (G_i) is recorded there: everything that waited for G_i now
// waits for the reduced gradient. With a sharded store (Note [Sharded store]) the collective is a
// reduce-scatter into this rank's slice, the norm is the sum of every rank's slices (one more
// host-side sum at the end of the step), only the slice goes down, is updated and comes up, and an
// all-gather (on the updater thread's own group) refreshes the whole working copy. The ranks'
// losses are weighted by their share of the global batch (the trainer), so the sum is the
// gradient of the global batch. With the CPU as the device, Gloo reduces synchronously.
torch::Tensor OffloadEngine::reduce_gradient(size_t i) {
  auto& b = store_.blocks()[i];
  const auto square_norm = [&](const torch::Tensor& g) {
    sqnorm_[i] = torch::linalg_vector_norm(g, 2, std::nullopt, false, torch::kFloat32).square();
  };
  if (options_.comm == nullptr) {
    square_norm(b.grad);
    return b.grad;
  }
  auto& group = options_.comm->device_group(0);
  c10::intrusive_ptr<c10d::Work> work;
  torch::Tensor g = b.grad;
  if (store_.sharded()) {
    g = b.grad_shard;
    work = group._reduce_scatter_base(b.grad_shard, b.grad);
  } else {
    std::vector<at::Tensor> t{b.grad};
    work = group.allreduce(t);
  }
  if (!cuda_) {
    const Comm::Waiting waiting(options_.comm, "the gradient reduction of " + b.name + " over the replicas");
    work->wait();
    square_norm(g);
    return g;
  }
  const c10::StreamGuard guard(streams_->d2h);
  work->wait();  // the D2H stream waits; the compute stream goes on with backward
  square_norm(g);
  streams_->grad_ready[i]->record(streams_->d2h);
  return g;
}

CpuUpdateJob OffloadEngine::job(size_t i, double grad_scale, bool undo, bool upload) const {
  CpuUpdateJob j;
  j.block = i;
  j.grad_scale = grad_scale;
  j.lr = lr_;
  j.step = stats_.steps + 1;
  j.undo = undo;
  j.upload = upload;
  j.host = host_run_[i];
  j.groups = store_.group_hypers();
  return j;
}

void OffloadEngine::dispatch(size_t i) {
  torch::NoGradGuard no_grad;
  dispatched_[i] = 1;
  mark_on_compute(stamps_->bwd[i]);
  if (host_run_[i]) return dispatch_host_run(i);
  if (delayed_now_ && updater_->pending_upload(i)) updater_->upload_after_backward(i);
  const torch::Tensor grad = reduce_gradient(i);
  const bool reduced_on_d2h = cuda_ && options_.comm != nullptr;  // G_i already recorded
  if (store_.blocks()[i].side == UpdateSide::kGpu) return;        // updated in end_step(), once the clip is known
  if (ring_) {  // the updater copies it down when a slot is free (Note [Host ring])
    if (cuda_ && !reduced_on_d2h) streams_->grad_ready[i]->record(streams_->compute());
    if (speculate_now_) updater_->enqueue({ring_speculation(i)});
    return;
  }
  copy_down(i, grad, reduced_on_d2h);
  if (!speculate_now_) return;  // queued by end_step() once the norm is known
  // Always with an undo log: the non-finite check may roll back even without clipping.
  updater_->enqueue({job(i, 1.0 / loss_scale_, true, upload_now_[i])});
}

// Note [Retraction]: a speculative update through the ring keeps no undo log; the device keeps the
// gradient for a retraction until the step's end, and the update runs only on a finite one.
CpuUpdateJob OffloadEngine::ring_speculation(size_t i) const {
  CpuUpdateJob j = job(i, 1.0 / loss_scale_, false, upload_now_[i]);
  j.keep_gradient = true;
  j.square_norm = sqnorm_[i];
  j.square_norm_host = sqnorm_host_[i];
  return j;
}

// Note [Block placement]: a host-run Block's gradient is already in its landing buffer.
void OffloadEngine::dispatch_host_run(size_t i) {
  sqnorm_[i] = torch::linalg_vector_norm(store_.blocks()[i].landing, 2, std::nullopt, false, torch::kFloat32)
                   .square()
                   .to(store_.options().device);
  if (!speculate_now_) return;
  updater_->enqueue({job(i, 1.0 / loss_scale_, true, false)});
}

// The gradient into the landing buffer: on the D2H stream behind G_i, recording D_i.
void OffloadEngine::copy_down(size_t i, const torch::Tensor& grad, bool reduced_on_d2h) {
  auto& b = store_.blocks()[i];
  auto& st = *stamps_;
  if (!cuda_) {
    st.mark(st.d2h0[i], nullptr);
    b.landing.copy_(grad);
    st.mark(st.d2h1[i], nullptr);
    return;
  }
  auto& s = *streams_;
  if (!reduced_on_d2h) s.grad_ready[i]->record(s.compute());
  s.d2h.wait(*s.grad_ready[i]);
  st.mark(st.d2h0[i], &s.d2h);
  {
    const c10::StreamGuard guard(s.d2h);
    b.landing.copy_(grad, /*non_blocking=*/true);
  }
  s.landed[i]->record(s.d2h);
  st.mark(st.d2h1[i], &s.d2h);
}

void OffloadEngine::wait_block(size_t i) {
  if (!delayed_now_ || !updater_->pending_upload(i)) updater_->wait_updated(i);
  if (cuda_ && store_.blocks()[i].side == UpdateSide::kCpu) streams_->compute().wait(*streams_->uploaded[i]);
}

// Note [Step stamps]: the arrival is stamped before the waits for Block i's weights, the start after.
void OffloadEngine::before_block(size_t i) {
  auto& b = store_.blocks()[i];
  if (in_forward_) mark_on_compute(stamps_->arrive[i]);
  if (b.side == UpdateSide::kCpu && !host_run_[i] && b.mirror_lag > 0) refresh_mirror(i);
  wait_block(i);
  if (host_run_[i] && zero_landing_[i] && torch::GradMode::is_enabled()) {
    b.landing.zero_();  // its update, which read it, is done (wait_block)
    zero_landing_[i] = false;
  }
  if (in_forward_) mark_on_compute(stamps_->fwd[i]);
}

// Note [Block placement]: the device copy is behind the master (the Block ran on the CPU, or stale
// mirrors): refreshed now when it is mirror_every updates behind.
void OffloadEngine::refresh_mirror(size_t i) {
  auto& b = store_.blocks()[i];
  updater_->wait_updated(i);
  if (b.mirror_lag >= options_.mirror_every) {
    updater_->upload(i);
    b.mirror_lag = 0;
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.mirror_refreshes;
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.max_mirror_lag = std::max(stats_.max_mirror_lag, b.mirror_lag);
}

// Note [Block placement]
// A Block placed on the CPU (set_placement, from a policy in sched/placement.h) computes with the
// ParamStore's host copies: its parameters become views of the staging buffer (the master in the
// compute dtype, which every CPU update rewrites: with bf16 it is a bf16 mirror, so oneDNN runs
// the matmuls in bf16 on the CPU's matrix units) and their gradients views of the landing buffer,
// so backward accumulates straight into the memory the CPU update reads: no D2H. Activations cross
// through pinned buffers inside autograd (Model::set_host_blocks, cross_device). The Block must be
// CPU-updated (the split keeps such Blocks on the CPU, ParamStore::keep_cpu_updated). Its update
// does not go up; its device copy falls behind (BlockStore::mirror_lag) and is refreshed when it
// next runs on the device. With mirror_every = n > 1 the device copies of CPU-updated Blocks go up
// only every n updates, so the device computes with weights up to n - 1 updates old (the seed's
// "synchronise weights less often"; stats().max_mirror_lag). The landing buffer is cleared in the
// Block's first forward of a step, once its previous update has read it. Placement changes only
// between steps; a host-run Block is never updated on the device.
void OffloadEngine::set_placement(const std::vector<bool>& on_host) {
  auto& blocks = store_.blocks();
  TANDEM_CHECK(on_host.size() == blocks.size(), "a placement names ", on_host.size(), " blocks; the model has ",
               blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (on_host[i] == host_run_[i]) continue;
    if (on_host[i]) {
      TANDEM_CHECK(model_.block_kind(i) == BlockKind::kLayer, "block ", blocks[i].name,
                   " cannot run on the CPU: only decoder layers move (the embedding and the head stay on the device)");
      TANDEM_CHECK(blocks[i].side == UpdateSide::kCpu, "block ", blocks[i].name,
                   " is GPU-updated and cannot run on the CPU; list it in placement.movable so it stays CPU-updated");
      TANDEM_CHECK(!ring_ && !options_.delayed && options_.comm == nullptr,
                   "blocks run on the CPU only with per-Block host buffers, exact updates and one process: set "
                   "offload.host_ring=0 and offload.delayed_update=false, and run one process (placement.policy=gpu "
                   "otherwise)");
    }
    updater_->wait_updated(i);
    store_.bind_block(i, on_host[i]);
  }
  host_run_ = on_host;
  model_.set_host_blocks(on_host);
}

void OffloadEngine::wait_all() {
  // Delayed updates go up in the order queued, which frees the ring slots the updater may be
  // waiting for (Note [Delayed host ring]).
  for (const size_t i : queued_order_)
    if (updater_->pending_upload(i)) updater_->upload_after_backward(i);
  updater_->wait_idle();
  for (size_t i = 0; i < store_.blocks().size(); ++i) wait_block(i);
}

StepOutcome OffloadEngine::end_step() { return finish_step(false); }

void OffloadEngine::abandon_step() {
  last_micro_ = true;  // Blocks not yet dispatched are dispatched (their copies are discarded)
  finish_step(true);
}

// An abandoned step takes the non-finite path (Note [Speculative clipping]): nothing queued,
// speculative updates rolled back and their old weights uploaded again, gradients zeroed. It is not
// an overflow, so it counts neither as a skipped step nor in the speculation window.
StepOutcome OffloadEngine::finish_step(bool abandon) {
  torch::NoGradGuard no_grad;
  auto& blocks = store_.blocks();
  for (size_t i = 0; i < blocks.size(); ++i)
    if (!dispatched_[i]) dispatch(i);  // a Block some of whose parameters got no gradient
  StepOutcome out;
  double coef = 1.0;
  if (abandon) {
    out.skipped = true;
  } else {
    coef = clip_coefficient(out);
  }
  const double inv_scale = 1.0 / loss_scale_;
  const bool any_cpu = std::any_of(blocks.begin(), blocks.end(), [](auto& b) { return b.side == UpdateSide::kCpu; });
  if (!speculate_now_ && !out.skipped) {
    queue_cpu_updates(inv_scale * coef);
  } else if (speculate_now_ && (out.skipped || coef < 1.0) && any_cpu) {
    out.rolled_back = true;
    roll_back(out.skipped, inv_scale * coef);
  }
  if (abandon) {
    ++stats_.abandoned;
  } else if (out.skipped) {
    ++stats_.skipped;
  } else {
    device_updater_->update(lr_, stats_.steps + 1, inv_scale * coef);
    for (size_t i = 0; i < blocks.size(); ++i)  // Note [Block placement]
      if (blocks[i].side == UpdateSide::kCpu) blocks[i].mirror_lag = upload_now_[i] ? 0 : blocks[i].mirror_lag + 1;
    ++stats_.steps;
    step_tensor_.fill_(static_cast<double>(stats_.steps));
  }
  zero_gradients(out.skipped);
  return out;
}

// The global norm (one host synchronisation), the step's skip flag and the clip coefficient;
// recorded in the speculation window.
double OffloadEngine::clip_coefficient(StepOutcome& out) {
  if (cuda_ && options_.comm)  // the reductions and norms ran on the D2H stream (Note [Data-parallel engine])
    for (size_t i = 0; i < sqnorm_.size(); ++i) streams_->compute().wait(*streams_->grad_ready[i]);
  double square = [&] {  // one host sync
    const Comm::Waiting waiting(options_.comm, "the gradient norm (the GPU's backward and the gradient reductions)");
    return torch::stack(sqnorm_).sum().item<double>();
  }();
  // Every rank holds the norms of its slices (sharded), or of its pipeline stage's Blocks, summed
  // once per replica (Note [Pipeline parallel]).
  if (options_.comm && (store_.sharded() || options_.comm->stages() > 1))
    square = options_.comm->sum(square) / (store_.sharded() ? 1.0 : double(options_.comm->replicas()));
  const double norm_scaled = std::sqrt(square);
  out.grad_norm = norm_scaled / loss_scale_;
  double coef = 1.0;
  if (!std::isfinite(out.grad_norm)) {
    out.skipped = true;
  } else if (options_.grad_clip > 0 && out.grad_norm > options_.grad_clip) {
    coef = options_.grad_clip / (out.grad_norm + 1e-6);
  }
  would_roll_back_.push_back(out.skipped || coef < 1.0);
  if (would_roll_back_.size() > kSpeculationWindow) would_roll_back_.pop_front();
  return coef;
}

// The CPU Blocks in forward order, so the next forward's first Blocks are ready first; delayed
// updates in the order this step's backward reached the Blocks (those it did not reach last), so
// the next backward finds its first Blocks updated first (Note [Delayed update]).
void OffloadEngine::queue_cpu_updates(double grad_scale) {
  const size_t n = store_.blocks().size();
  std::vector<size_t> order;
  if (delayed_now_) {
    order = backward_order_;
    for (size_t i = n; i-- > 0;)
      if (!arrived_[i]) order.push_back(i);
  } else {
    for (size_t i = 0; i < n; ++i) order.push_back(i);
  }
  std::vector<CpuUpdateJob> jobs;
  queued_order_.clear();
  for (const size_t i : order) {
    if (store_.blocks()[i].side != UpdateSide::kCpu) continue;
    jobs.push_back(job(i, grad_scale, false, !delayed_now_ && upload_now_[i]));
    queued_order_.push_back(i);
    if (delayed_now_ && ring_) await_gradient_taken_[i] = 1;
  }
  updater_->enqueue(jobs);
}

// The speculative CPU updates undone, bit for bit from the undo log, or solved back through the ring
// (Note [Retraction]); then, unless the step is skipped, redone with the clip coefficient.
void OffloadEngine::roll_back(bool skipped, double grad_scale) {
  updater_->wait_idle();
  ++stats_.rollbacks;
  std::vector<CpuUpdateJob> redo;
  for (size_t i = 0; i < store_.blocks().size(); ++i) {
    if (store_.blocks()[i].side != UpdateSide::kCpu) continue;
    if (ring_) {  // the gradient goes down again, into whichever slot is free
      CpuUpdateJob j = job(i, grad_scale, false, upload_now_[i]);
      j.keep_gradient = true;
      j.retract_scale = 1.0 / loss_scale_;
      j.update = !skipped;
      redo.push_back(j);
      continue;
    }
    updater_->roll_back(i);
    if (!skipped)
      redo.push_back(job(i, grad_scale, false, upload_now_[i]));
    else if (upload_now_[i])
      updater_->upload(i);  // the speculative weights went up: the old ones follow
  }
  updater_->enqueue(redo);
}

// The D2H copies read the gradient buffers: the compute stream waits for them before zeroing.
// With a host ring the updater zeroes a CPU-updated Block's gradient after its D2H instead, unless
// the step speculated (Note [Retraction]): the gradient stayed, and is zeroed here once the updater
// has queued its last copy down.
void OffloadEngine::zero_gradients(bool skipped) {
  const bool ring_zeroes = ring_ && !skipped && !speculate_now_;
  for (size_t i = 0; i < store_.blocks().size(); ++i) {
    auto& b = store_.blocks()[i];
    if (b.side == UpdateSide::kCpu) {
      if (ring_zeroes || host_run_[i]) continue;  // a host-run Block's device gradient is untouched
      if (ring_ && speculate_now_) updater_->wait_gradient_taken(i);
      if (cuda_ && dispatched_[i] && (!ring_ || speculate_now_)) streams_->compute().wait(*streams_->landed[i]);
    }
    b.grad.zero_();
  }
}

// Note [Delayed update]: delayed weights stay pending through a solve unless it moves Blocks (a
// resumed run, whose solves come at other steps, then repeats the straight one). Not through a host
// ring: the updater waits for the slots their uploads free (Note [Delayed host ring]).
void OffloadEngine::resolve_split() {
  if (delayed_now_ && !ring_)
    updater_->wait_idle();
  else
    wait_all();
  sync_streams();
  const CpuUpdaterCounters c = updater_->counters();
  using CS = SplitCosts::CpuStart;
  SplitInputs in;
  in.step = steps_begun_;
  in.cpu_update_s = c.cpu_update_s;
  in.cpu_updated_params = c.cpu_updated_params;
  in.cpu_start = delayed_now_                                                                  ? CS::kDelayed
                 : (options_.speculate == EngineOptions::Speculate::kNever || !speculate_now_) ? CS::kAfterBackward
                                                                                               : CS::kAsGradientsArrive;
  tuner_->solve(in, [this] {
    wait_all();
    sync_streams();
  });
}

// Note [Delayed update]: from the update count offload.delayed_after on (at once by default), with
// every exact update done and uploaded first; a solved split is solved again once a few delayed
// steps are measured, since the delayed mode hides a different share of the CPU's work.
void OffloadEngine::start_delayed() {
  wait_all();
  sync_streams();
  updater_->set_delayed(true);
  delayed_now_ = true;
  if (stats_.steps > 0) {
    tuner_->solve_again(steps_begun_ + options_.first_solve_step);
    if (options_.log) options_.log("delayed update from update " + std::to_string(stats_.steps + 1) + " on");
  }
}

// Note [Offload trace]: a traced step starts and ends with every update done and the streams idle.
void OffloadEngine::start_trace() {
  wait_all();
  sync_streams();
  trace_->start(steps_begun_, *stamps_, streams_.get());
  updater_->trace(true);
}

void OffloadEngine::set_max_gpu_blocks(int64_t max_gpu_blocks) { tuner_->set_max_gpu_blocks(max_gpu_blocks); }

void OffloadEngine::finish_trace() {
  if (trace_->active()) collect_trace();
}

void OffloadEngine::collect_trace() {
  wait_all();
  sync_streams();
  const std::vector<CpuUpdateSpan> cpu = updater_->trace(false);
  trace_->finish(*stamps_, store_.blocks(), cpu);
}

}  // namespace tandem
