#include "tandem/engine/offload_engine.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/core/fs.h"
#include "tandem/sched/update_split.h"

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
// memcpy and the updater thread still runs beside autograd.
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

struct OffloadEngine::Streams {
  c10::impl::VirtualGuardImpl impl{c10::DeviceType::CUDA};
  c10::Device device;
  c10::Stream d2h, h2d;
  std::vector<std::unique_ptr<c10::Event>> grad_ready, landed, uploaded;
  explicit Streams(c10::Device d, size_t blocks)
      : device(d), d2h(impl.getStreamFromGlobalPool(d, false)), h2d(impl.getStreamFromGlobalPool(d, false)) {
    // Timing enabled: the same events measure the split solver's times and draw the trace.
    const auto timed = [] { return std::make_unique<c10::Event>(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT); };
    for (size_t i = 0; i < blocks; ++i) {
      grad_ready.push_back(timed());
      landed.push_back(timed());
      uploaded.push_back(timed());
    }
  }
  c10::Stream compute() const { return impl.getStream(device); }
};

// A point in time on a stream: a timing CUDA event, or the host clock when the device is the CPU
// (its "streams" are the calling thread).
struct Stamp {
  std::unique_ptr<c10::Event> ev;
  double host = -1;  // seconds since the engine's epoch; CPU device
  bool set = false;
};

struct OffloadEngine::Stamps {
  // Per Block: forward start (compute), backward done (compute: the event is grad_ready on CUDA),
  // D2H start, H2D start; the D2H and H2D ends are the landed and uploaded events.
  std::vector<Stamp> fwd, bwd, d2h0, d2h1, h2d0, h2d1;
  Stamp gpu0, gpu1, ref;
  explicit Stamps(size_t n, bool cuda) {
    for (auto* v : {&fwd, &bwd, &d2h0, &d2h1, &h2d0, &h2d1}) {
      v->resize(n);
      if (cuda)
        for (auto& st : *v) st.ev = std::make_unique<c10::Event>(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
    }
    for (auto* st : {&gpu0, &gpu1, &ref})
      if (cuda) st->ev = std::make_unique<c10::Event>(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
  }
};

namespace {

void mark(Stamp& st, const c10::Stream* stream, double host_now) {
  if (st.ev) {
    st.ev->record(*stream);
  } else {
    st.host = host_now;
  }
  st.set = true;
}

// Seconds from a to b; both recorded and complete.
double between(const Stamp& a, const Stamp& b) {
  if (!a.set || !b.set) return 0.0;
  if (a.ev) return a.ev->elapsedTime(*b.ev) / 1e3;
  return b.host - a.host;
}

// The time of a span whose end has completed; 0 while either end is unset or still pending.
double completed_between(const Stamp& a, const Stamp& b) {
  if (!a.set || !b.set || (b.ev && !b.ev->query())) return 0.0;
  return between(a, b);
}

struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  std::function<void()> fn;
  explicit ReadyHook(std::function<void()> f) : fn(std::move(f)) {}
  void operator()(const torch::autograd::Variable&) override { fn(); }
};

}  // namespace

OffloadEngine::OffloadEngine(Model& model, ParamStore& store, EngineOptions options)
    : model_(model),
      store_(store),
      options_(options),
      cuda_(store.options().device.is_cuda()),
      ring_(store.options().ring_slots > 0) {
  const size_t n = store_.blocks().size();
  remaining_.assign(n, 0);
  dispatched_.assign(n, 0);
  host_run_.assign(n, false);
  upload_now_.assign(n, true);
  zero_landing_.assign(n, false);
  sqnorm_.resize(n);
  done_.assign(n, 1);
  step_tensor_ = torch::zeros({}, torch::kFloat32);
  pending_upload_.assign(n, false);
  if (cuda_) streams_ = std::make_unique<Streams>(store_.options().device, n);
  stamps_ = std::make_unique<Stamps>(n, cuda_);
  TANDEM_CHECK(!(options_.delayed && options_.speculate == EngineOptions::Speculate::kAlways),
               "offload.delayed_update=true updates once the norm is known; it does not speculate. Set "
               "offload.speculate=auto or never");
  TANDEM_CHECK(!ring_ || (options_.speculate == EngineOptions::Speculate::kNever && !options_.delayed),
               "a host ring (offload.host_ring) updates each Block once the norm is known, one slot at a time: set "
               "offload.speculate=never and offload.delayed_update=false, or offload.host_ring=0");
  TANDEM_CHECK(options_.mirror_every >= 1, "placement.mirror_every must be >= 1, got ", options_.mirror_every);
  TANDEM_CHECK(options_.mirror_every == 1 || (!options_.delayed && !ring_),
               "placement.mirror_every > 1 (stale device copies) does not combine with offload.delayed_update or a "
               "host ring; set placement.mirror_every=1");
  slot_owner_.assign(static_cast<size_t>(store_.options().ring_slots), -1);
  for (size_t i = 0; i < n; ++i)
    for (auto& f : store_.blocks()[i].params)
      torch::autograd::impl::set_post_acc_grad_hooks(f.param,
                                                     std::make_unique<ReadyHook>([this, i] { on_param_ready(i); }));
  model_.set_before_block([this](size_t i) { before_block(i); });
  updater_ = std::thread([this] { updater_loop(); });
}

OffloadEngine::~OffloadEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  updater_.join();
  model_.set_before_block(nullptr);
  for (auto& b : store_.blocks())
    for (auto& f : b.params) torch::autograd::impl::set_post_acc_grad_hooks(f.param, nullptr);
}

UpdateHyper OffloadEngine::hyper(double lr, int64_t step, double grad_scale) const {
  UpdateHyper h;
  h.rule = options_.adam.decoupled ? UpdateRule::kAdamW : UpdateRule::kAdam;
  h.lr = lr;
  h.beta1 = options_.adam.beta1;
  h.beta2 = options_.adam.beta2;
  h.eps = options_.adam.eps;
  h.weight_decay = options_.adam.weight_decay;
  h.step = step;
  h.grad_scale = grad_scale;
  h.rounding = options_.state_rounding;
  return h;
}

void OffloadEngine::mark_on_compute(Stamp& st) {
  if (cuda_) {
    const auto compute = streams_->compute();
    mark(st, &compute, 0);
  } else {
    mark(st, nullptr, host_now());
  }
}

double OffloadEngine::host_now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
}

void OffloadEngine::begin_step(double lr, double loss_scale) {
  TANDEM_ASSERT(loss_scale > 0, "loss scale ", loss_scale);
  const auto now = std::chrono::steady_clock::now();
  if (steps_begun_ > 1) step_times_.push_back(std::chrono::duration<double>(now - last_begin_).count());
  last_begin_ = now;
  if (tracing_) collect_trace();
  const bool solve_now =
      options_.solve_split && steps_begun_ >= options_.first_solve_step &&
      (steps_begun_ == options_.first_solve_step ||
       (options_.resolve_every > 0 && (steps_begun_ - options_.first_solve_step) % options_.resolve_every == 0));
  if (solve_now) resolve_split();
  ++steps_begun_;
  if (std::binary_search(options_.trace_steps.begin(), options_.trace_steps.end(), steps_begun_)) start_trace();
  lr_ = lr;
  loss_scale_ = loss_scale;
  std::fill(dispatched_.begin(), dispatched_.end(), 0);
  for (size_t i = 0; i < dispatched_.size(); ++i) {
    upload_now_[i] = !host_run_[i] && store_.blocks()[i].mirror_lag + 1 >= options_.mirror_every;
    zero_landing_[i] = host_run_[i];
  }
  using S = EngineOptions::Speculate;
  constexpr size_t kSpeculationWindow = 8;
  speculate_now_ = !options_.delayed &&
                   (options_.speculate == S::kAlways ||
                    (options_.speculate == S::kAuto && would_roll_back_.size() >= kSpeculationWindow &&
                     std::none_of(would_roll_back_.begin(), would_roll_back_.end(), [](bool b) { return b; })));
  if (speculate_now_) ++stats_.speculative_steps;
  if (options_.delayed) ++stats_.delayed_steps;
}

void OffloadEngine::begin_micro(bool last) {
  last_micro_ = last;
  in_forward_ = true;
  for (size_t i = 0; i < remaining_.size(); ++i)
    remaining_[i] = static_cast<int64_t>(store_.blocks()[i].params.size());
}

void OffloadEngine::on_param_ready(size_t block) {
  in_forward_ = false;  // a recomputed forward (checkpointing) is not timed as forward
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

void OffloadEngine::dispatch(size_t i) {
  torch::NoGradGuard no_grad;
  dispatched_[i] = 1;
  auto& b = store_.blocks()[i];
  auto& st = *stamps_;
  mark_on_compute(st.bwd[i]);
  if (host_run_[i]) {  // Note [Block placement]: the gradient is already in the landing buffer
    sqnorm_[i] = torch::linalg_vector_norm(b.landing, 2, std::nullopt, false, torch::kFloat32)
                     .square()
                     .to(store_.options().device);
    if (!speculate_now_) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_[i] = 0;
      ++in_flight_;
      Job job{i, 1.0 / loss_scale_, lr_, stats_.steps + 1, true, false};
      job.host = true;
      queue_.push_back(job);
    }
    cv_.notify_all();
    return;
  }
  if (options_.delayed && pending_upload_[i]) upload_after_backward(i);
  const torch::Tensor grad = reduce_gradient(i);
  const bool reduced_on_d2h = cuda_ && options_.comm != nullptr;  // G_i already recorded
  if (b.side == UpdateSide::kGpu) return;  // updated in end_step(), once the clip is known
  if (ring_) {  // the updater copies it down when a slot is free (Note [Host ring])
    if (cuda_ && !reduced_on_d2h) streams_->grad_ready[i]->record(streams_->compute());
    return;
  }
  if (cuda_) {
    auto& s = *streams_;
    if (!reduced_on_d2h) s.grad_ready[i]->record(s.compute());
    s.d2h.wait(*s.grad_ready[i]);
    mark(st.d2h0[i], &s.d2h, 0);
    {
      const c10::StreamGuard guard(s.d2h);
      b.landing.copy_(grad, /*non_blocking=*/true);
    }
    s.landed[i]->record(s.d2h);
    mark(st.d2h1[i], &s.d2h, 0);
  } else {
    mark(st.d2h0[i], nullptr, host_now());
    b.landing.copy_(grad);
    mark(st.d2h1[i], nullptr, host_now());
  }
  if (!speculate_now_) return;  // queued by end_step() once the norm is known
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_[i] = 0;
    ++in_flight_;
    // Always with an undo log: the non-finite check may roll back even without clipping.
    queue_.push_back({i, 1.0 / loss_scale_, lr_, stats_.steps + 1, true, static_cast<bool>(upload_now_[i])});
  }
  cv_.notify_all();
}

std::vector<UpdateSpan> OffloadEngine::spans(size_t i, int64_t slot) {
  return block_spans(store_.blocks()[i], store_.landing(i, slot), store_.staging(i, slot));
}

std::vector<UpdateSpan> OffloadEngine::block_spans(BlockStore& b, const torch::Tensor& grad, const torch::Tensor& out) {
  const bool grad_bf16 = grad.scalar_type() == torch::kBFloat16;
  TANDEM_ASSERT(grad_bf16 || grad.scalar_type() == torch::kFloat32, "gradient dtype ", grad.scalar_type(),
                " (the CPU kernels take fp32 or bf16 gradients)");
  TANDEM_ASSERT(
      grad.numel() >= b.shard_numel && out.numel() >= b.shard_numel && grad.is_contiguous() && out.is_contiguous(),
      "block ", b.name, ": a gradient or output buffer not contiguous or shorter than its slice of ", b.shard_numel);
  const bool bf16_out = out.scalar_type() == torch::kBFloat16;
  const bool state_bf16 = b.m.scalar_type() == torch::kBFloat16;
  const int64_t gsize = grad_bf16 ? 2 : 4, ssize = state_bf16 ? 2 : 4;
  std::vector<UpdateSpan> spans;
  for (const auto& f : b.shard_params) {
    UpdateSpan s;
    s.master = b.master.data_ptr<float>() + f.offset;
    s.grad = static_cast<const char*>(grad.data_ptr()) + f.offset * gsize;
    s.grad_dtype = grad_bf16 ? Dtype::kBF16 : Dtype::kF32;
    s.m = static_cast<char*>(b.m.data_ptr()) + f.offset * ssize;
    s.v = static_cast<char*>(b.v.data_ptr()) + f.offset * ssize;
    s.state_dtype = state_bf16 ? Dtype::kBF16 : Dtype::kF32;
    s.bf16_out = bf16_out ? reinterpret_cast<uint16_t*>(out.data_ptr()) + f.offset : nullptr;
    s.n = f.numel;
    s.index_base = b.index_base + b.shard_offset + f.offset;
    s.weight_decay_scale = f.weight_decay_scale;
    spans.push_back(s);
  }
  return spans;
}

std::vector<UndoLog> OffloadEngine::undo_logs(BlockStore& b) {
  const int64_t ssize = b.undo_m.element_size();
  std::vector<UndoLog> logs;
  for (const auto& f : b.shard_params)
    logs.push_back({b.undo_master.data_ptr<float>() + f.offset, static_cast<char*>(b.undo_m.data_ptr()) + f.offset * ssize,
                    static_cast<char*>(b.undo_v.data_ptr()) + f.offset * ssize});
  return logs;
}

void OffloadEngine::run_cpu_update(const Job& job) {
  const size_t i = job.block;
  const bool undo = job.undo;
  auto& b = store_.blocks()[i];
  const auto t0 = std::chrono::steady_clock::now();
  const auto sp = spans(i, job.slot);
  std::vector<UndoLog> logs;
  if (undo) {
    TANDEM_ASSERT(b.undo_master.defined(), "block ", b.name, " has no undo buffers");
    logs = undo_logs(b);
  }
  UpdateHyper h = hyper(job.lr, job.step, job.grad_scale);
  h.check_finite = false;  // the global norm decides (Note [Speculative clipping])
  cpu_update(sp, h, undo ? &logs : nullptr, options_.pool);
  if (!sp.empty() && sp[0].bf16_out == nullptr) store_.staging(i, job.slot).copy_(b.master);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.cpu_update_s += dt;
  stats_.cpu_updated_params += b.shard_numel;
  if (tracing_) {
    const double end = host_now() - trace_ref_host_;
    cpu_spans_.push_back({i, end - dt, end, undo});
  }
}

void OffloadEngine::upload(size_t i, int64_t slot) {
  auto& b = store_.blocks()[i];
  const auto staging = store_.staging(i, slot);
  auto mine = b.working.narrow(0, b.shard_offset, b.shard_numel);
  // The updater thread gathers on its own group (Note [Process groups]).
  const int lane = std::this_thread::get_id() == updater_.get_id() ? 1 : 0;
  torch::NoGradGuard no_grad;
  if (cuda_) {
    auto& s = *streams_;
    const c10::StreamGuard guard(s.h2d);
    mark(stamps_->h2d0[i], &s.h2d, 0);
    mine.copy_(staging, /*non_blocking=*/true);
    if (store_.sharded()) store_.gather_working(i, lane);  // behind the copy, on the H2D stream
    s.uploaded[i]->record(s.h2d);
    mark(stamps_->h2d1[i], &s.h2d, 0);
  } else {
    mark(stamps_->h2d0[i], nullptr, host_now());
    mine.copy_(staging);
    if (store_.sharded()) store_.gather_working(i, lane);
    mark(stamps_->h2d1[i], nullptr, host_now());
  }
}

// Note [Delayed update]
// With offload.delayed_update the CPU updates of step t are queued once step t's norm is known
// (exact clipping, no undo log) but their new weights are not awaited by step t+1's forward: a
// CPU-updated Block's staging buffer goes up when step t+1's backward is done with that Block (its
// dispatch), so step t+1 computes with the weights of step t-1 for those Blocks and step t+2 sees
// step t's update. The CPU update then overlaps a whole forward and backward instead of the
// backward's tail and the next forward; what it costs is convergence: the gradient of step t+1 is
// taken at weights one update old (the one-step staleness of ZeRO-Offload's delayed parameter
// update), measured against the exact engine in docs/benchmarks.md. GPU-updated Blocks are never
// delayed. The dispatch waits on the host for the Block's previous update before anything else:
// that update reads the landing buffer the new gradient is about to overwrite, and its upload must
// follow the backward. With updates queued in forward order, the backward's first dispatches (the
// last Blocks) wait for nearly all of them; a second landing buffer per Block would remove that
// wait (docs/benchmarks.md). wait_all() (evaluation, checkpoints, split solves, traced steps, the
// end) uploads what is pending, so checkpoints hold consistent weights and a resumed run repeats
// the uninterrupted one.
void OffloadEngine::upload_after_backward(size_t i) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_[i] != 0; });
  }
  upload_pending(i);
}

void OffloadEngine::upload_pending(size_t i) {
  pending_upload_[i] = false;
  if (cuda_) {
    auto& s = *streams_;
    s.grad_ready[i]->record(s.compute());  // nothing queued before may still read the old weights
    s.h2d.wait(*s.grad_ready[i]);
  }
  upload(i);
}

// Note [Host ring]
// Per-Block landing and staging buffers cost 2 x the CPU-updated parameters in the compute dtype
// of pinned memory (about 48 GB at 13B) for buffers that are busy a fraction of the step. With
// offload.host_ring = N the CPU-updated Blocks share N slots instead, each the size of the largest
// Block. The updates then start once the norm is known (no speculation, no delayed update), in
// forward order, and the gradient stays in the device's gradient buffer until the updater takes a
// slot for it, queues the D2H behind that Block's backward (G_i), zeroes the device gradient on
// the same stream and records D_i after the zeroing, and queues the D2H of the next Block before
// running this one's update, so copies down overlap updates; the update waits for the upload of
// the slot's previous Block (its staging half) only when it is about to write it. The next
// backward writes Block i's gradient only after the forward waited for U_i, which follows D_i
// (the host waited for it), so the zeroing. The cost is the overlap with backward that speculation would give; the CPU update is
// the same kernel on the same data, so the result is identical to the per-Block buffers.
void OffloadEngine::ring_d2h(Job& job) {
  const size_t i = job.block;
  const int64_t n = store_.options().ring_slots;
  job.slot = next_slot_++ % n;
  // The slot's landing half was last read by its previous Block's CPU update, already done; its
  // staging half may still be going up: run_cpu_update waits for that upload (job.prev_owner).
  auto& owner = slot_owner_[static_cast<size_t>(job.slot)];
  job.prev_owner = owner;
  owner = static_cast<int64_t>(i);
  auto& b = store_.blocks()[i];
  auto landing = store_.landing(i, job.slot);
  torch::NoGradGuard no_grad;
  if (cuda_) {
    auto& s = *streams_;
    s.d2h.wait(*s.grad_ready[i]);
    const c10::StreamGuard guard(s.d2h);
    mark(stamps_->d2h0[i], &s.d2h, 0);
    landing.copy_(store_.sharded() ? b.grad_shard : b.grad, /*non_blocking=*/true);
    mark(stamps_->d2h1[i], &s.d2h, 0);
    b.grad.zero_();
    s.landed[i]->record(s.d2h);  // after the zeroing: U_i follows it, and the next backward U_i
  } else {
    mark(stamps_->d2h0[i], nullptr, host_now());
    landing.copy_(store_.sharded() ? b.grad_shard : b.grad);
    mark(stamps_->d2h1[i], nullptr, host_now());
    b.grad.zero_();
  }
}

void OffloadEngine::updater_loop() {
  for (;;) {
    Job job;
    Job* next = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
      // Only this thread pops or edits queued jobs; push_back keeps references to the others valid.
      // With one slot the next Block has nowhere to land before this update is uploaded.
      if (ring_ && slot_owner_.size() > 1 && !queue_.empty() && queue_.front().slot < 0) next = &queue_.front();
    }
    // A failure here (a peer rank gone in the all-gather, a CUDA error) must not end the process
    // from this thread: it is kept and rethrown on the step loop's next wait (updater_error_).
    try {
      if (ring_) {
        if (job.slot < 0) ring_d2h(job);
        if (next != nullptr) ring_d2h(*next);  // its copy down overlaps this update
      }
      if (cuda_) {
        streams_->landed[job.block]->synchronize();
        // Delayed mode: the previous update's upload must have read staging before it is rewritten.
        if (options_.delayed) streams_->uploaded[job.block]->synchronize();
        // Host ring: the slot's previous Block must have gone up before staging is rewritten.
        if (job.prev_owner >= 0) streams_->uploaded[static_cast<size_t>(job.prev_owner)]->synchronize();
      }
      {
        // This Block's gradient copy has landed; its previous upload finished before the forward
        // that preceded this gradient. Delayed mode's uploads are issued by the step loop: not read.
        const size_t i = job.block;
        const double xfer = job.host
                                ? 0.0
                                : completed_between(stamps_->d2h0[i], stamps_->d2h1[i]) +
                                      (options_.delayed ? 0.0 : completed_between(stamps_->h2d0[i], stamps_->h2d1[i]));
        std::lock_guard<std::mutex> lock(mu_);
        stats_.transfer_s += xfer;
      }
      run_cpu_update(job);
      if (job.upload) upload(job.block, job.slot);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!updater_error_) updater_error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_[job.block] = 1;
      --in_flight_;
    }
    cv_.notify_all();
  }
}

void OffloadEngine::wait_updated(size_t i) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_[i] != 0; });
  if (updater_error_) std::rethrow_exception(updater_error_);
}

void OffloadEngine::wait_block(size_t i) {
  if (!options_.delayed || !pending_upload_[i]) wait_updated(i);
  if (cuda_ && store_.blocks()[i].side == UpdateSide::kCpu) streams_->compute().wait(*streams_->uploaded[i]);
}

void OffloadEngine::before_block(size_t i) {
  auto& b = store_.blocks()[i];
  if (b.side == UpdateSide::kCpu && !host_run_[i] && b.mirror_lag > 0) {
    wait_updated(i);
    // Note [Block placement]: the device copy is behind the master (the Block ran on the CPU, or
    // stale mirrors): refreshed now when it is mirror_every updates behind.
    if (b.mirror_lag >= options_.mirror_every) {
      upload(i);
      b.mirror_lag = 0;
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.mirror_refreshes;
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.max_mirror_lag = std::max(stats_.max_mirror_lag, b.mirror_lag);
  }
  wait_block(i);
  if (host_run_[i] && zero_landing_[i] && torch::GradMode::is_enabled()) {
    b.landing.zero_();  // its update, which read it, is done (wait_block)
    zero_landing_[i] = false;
  }
  if (in_forward_) mark_on_compute(stamps_->fwd[i]);
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
      TANDEM_CHECK(model_.blocks()[i]->kind() == BlockKind::kLayer, "block ", blocks[i].name,
                   " cannot run on the CPU: only decoder layers move (the embedding and the head stay on the device)");
      TANDEM_CHECK(blocks[i].side == UpdateSide::kCpu, "block ", blocks[i].name,
                   " is GPU-updated and cannot run on the CPU; list it in placement.movable so it stays CPU-updated");
      TANDEM_CHECK(!ring_ && !options_.delayed && options_.comm == nullptr,
                   "blocks run on the CPU only with per-Block host buffers, exact updates and one process: set "
                   "offload.host_ring=0 and offload.delayed_update=false, and run one process (placement.policy=gpu "
                   "otherwise)");
    }
    wait_updated(i);
    store_.bind_block(i, on_host[i]);
  }
  host_run_ = on_host;
  model_.set_host_blocks(on_host);
}

std::vector<double> OffloadEngine::block_seconds() const {
  const size_t n = store_.blocks().size();
  std::vector<double> out(n, 0.0);
  const auto& st = *stamps_;
  for (size_t i = 1; i + 1 < n; ++i) out[i] = between(st.fwd[i], st.fwd[i + 1]) + between(st.bwd[i + 1], st.bwd[i]);
  return out;
}

void OffloadEngine::wait_cpu_jobs() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return in_flight_ == 0; });
  if (updater_error_) std::rethrow_exception(updater_error_);
}

void OffloadEngine::wait_all() {
  wait_cpu_jobs();
  for (size_t i = 0; i < store_.blocks().size(); ++i) {
    if (pending_upload_[i]) upload_pending(i);
    wait_block(i);
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
void OffloadEngine::update_device_blocks_on_host(const std::vector<size_t>& blocks, double grad_scale) {
  std::vector<UpdateSpan> all;
  std::vector<torch::Tensor> keep;  // fp16 gradients widened, as the copy into the landing buffer widens them
  for (const size_t i : blocks) {
    auto& b = store_.blocks()[i];
    torch::Tensor g = store_.sharded() ? b.grad_shard : b.grad;
    if (g.scalar_type() != torch::kFloat32 && g.scalar_type() != torch::kBFloat16) g = g.to(torch::kFloat32);
    keep.push_back(g);
    const auto sp = block_spans(b, g, b.working.narrow(0, b.shard_offset, b.shard_numel));
    all.insert(all.end(), sp.begin(), sp.end());
  }
  UpdateHyper h = hyper(lr_, stats_.steps + 1, grad_scale);
  h.check_finite = false;  // the global norm decided (Note [Speculative clipping])
  cpu_update(all, h, nullptr, options_.pool);
  for (const size_t i : blocks) {
    auto& b = store_.blocks()[i];
    if (b.working.scalar_type() != torch::kBFloat16) b.working.narrow(0, b.shard_offset, b.shard_numel).copy_(b.master);
    if (store_.sharded()) store_.gather_working(i, 0);
  }
}

void OffloadEngine::update_gpu_blocks(double grad_scale) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params[2], grads[2], m[2], v[2], steps[2];
  std::vector<size_t> gpu;
  for (size_t i = 0; i < store_.blocks().size(); ++i) {
    auto& b = store_.blocks()[i];
    if (b.side != UpdateSide::kGpu) continue;
    gpu.push_back(i);
    if (!cuda_) continue;  // Note [One update kernel on the CPU device]
    const auto g = (store_.sharded() ? b.grad_shard : b.grad).to(torch::kFloat32) * grad_scale;
    for (const auto& f : b.shard_params) {
      const int k = f.weight_decay_scale != 0.0f ? 0 : 1;
      params[k].push_back(b.master.narrow(0, f.offset, f.numel));
      grads[k].push_back(g.narrow(0, f.offset, f.numel));
      m[k].push_back(b.m.narrow(0, f.offset, f.numel));
      v[k].push_back(b.v.narrow(0, f.offset, f.numel));
    }
  }
  if (gpu.empty()) return;
  const auto dev = store_.options().device;
  mark_on_compute(stamps_->gpu0);
  if (!cuda_) {
    update_device_blocks_on_host(gpu, grad_scale);
    mark_on_compute(stamps_->gpu1);
    return;
  }
  for (int k = 0; k < 2; ++k) {
    if (params[k].empty()) continue;
    // _fused_adamw_ reads its step tensors as this update's 1-based count (FusedAdamW increments
    // them before the call).
    steps[k].assign(params[k].size(), torch::Tensor());
    for (auto& s : steps[k]) s = torch::full({}, double(stats_.steps + 1), torch::TensorOptions().device(dev));
    const double wd = k == 0 ? options_.adam.weight_decay : 0.0;
    if (options_.adam.decoupled)
      at::_fused_adamw_(params[k], grads[k], m[k], v[k], {}, steps[k], lr_, options_.adam.beta1, options_.adam.beta2,
                        wd, options_.adam.eps, false, false, std::nullopt, std::nullopt);
    else
      at::_fused_adam_(params[k], grads[k], m[k], v[k], {}, steps[k], lr_, options_.adam.beta1, options_.adam.beta2,
                       wd, options_.adam.eps, false, false, std::nullopt, std::nullopt);
  }
  for (const size_t i : gpu) {
    auto& b = store_.blocks()[i];
    b.working.narrow(0, b.shard_offset, b.shard_numel).copy_(b.master);
    if (store_.sharded()) store_.gather_working(i, 0);  // on the compute stream
  }
  mark_on_compute(stamps_->gpu1);
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
  const double inv_scale = 1.0 / loss_scale_;
  double coef = 1.0;
  if (abandon) {
    out.skipped = true;
  } else {
    if (cuda_ && options_.comm)  // the reductions and norms ran on the D2H stream (Note [Data-parallel engine])
      for (size_t i = 0; i < blocks.size(); ++i) streams_->compute().wait(*streams_->grad_ready[i]);
    double norm_scaled;
    if (store_.sharded())  // every rank holds the norms of its slices
      norm_scaled = std::sqrt(options_.comm->sum(torch::stack(sqnorm_).sum().item<double>()));
    else
      norm_scaled = torch::stack(sqnorm_).sum().sqrt().item<double>();  // one host sync
    out.grad_norm = norm_scaled / loss_scale_;
    if (!std::isfinite(out.grad_norm)) {
      out.skipped = true;
    } else if (options_.grad_clip > 0 && out.grad_norm > options_.grad_clip) {
      coef = options_.grad_clip / (out.grad_norm + 1e-6);
    }
    would_roll_back_.push_back(out.skipped || coef < 1.0);
    if (would_roll_back_.size() > 8) would_roll_back_.pop_front();
  }
  const bool any_cpu = std::any_of(blocks.begin(), blocks.end(), [](auto& b) { return b.side == UpdateSide::kCpu; });
  if (!speculate_now_ && !out.skipped) {
    // The CPU Blocks in forward order, so the next forward's first Blocks are ready first.
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < blocks.size(); ++i) {
        if (blocks[i].side != UpdateSide::kCpu) continue;
        done_[i] = 0;
        ++in_flight_;
        Job job{i, inv_scale * coef, lr_, stats_.steps + 1, false, !options_.delayed && upload_now_[i]};
        job.host = host_run_[i];
        queue_.push_back(job);
        if (options_.delayed) pending_upload_[i] = true;
      }
    }
    cv_.notify_all();
  } else if (speculate_now_ && (out.skipped || coef < 1.0) && any_cpu) {
    wait_cpu_jobs();
    out.rolled_back = true;
    ++stats_.rollbacks;
    for (size_t i = 0; i < blocks.size(); ++i) {
      auto& b = blocks[i];
      if (b.side != UpdateSide::kCpu) continue;
      const auto sp = spans(i, -1);
      cpu_rollback(sp, undo_logs(b), options_.pool);
      if (!sp.empty() && sp[0].bf16_out == nullptr) b.staging.copy_(b.master);
      if (out.skipped) {
        if (upload_now_[i]) upload(i);  // the speculative weights went up: the old ones follow
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      done_[i] = 0;
      ++in_flight_;
      Job job{i, inv_scale * coef, lr_, stats_.steps + 1, false, static_cast<bool>(upload_now_[i])};
      job.host = host_run_[i];
      queue_.push_back(job);
    }
    cv_.notify_all();
  }
  if (abandon) {
    ++stats_.abandoned;
  } else if (out.skipped) {
    ++stats_.skipped;
  } else {
    update_gpu_blocks(inv_scale * coef);
    for (size_t i = 0; i < blocks.size(); ++i)  // Note [Block placement]
      if (blocks[i].side == UpdateSide::kCpu) blocks[i].mirror_lag = upload_now_[i] ? 0 : blocks[i].mirror_lag + 1;
    ++stats_.steps;
    step_tensor_.fill_(static_cast<double>(stats_.steps));
  }
  // The D2H copies read the gradient buffers: the compute stream waits for them before zeroing.
  // With a host ring the updater zeroes a CPU-updated Block's gradient after its D2H instead.
  const bool ring_zeroes = ring_ && !out.skipped;
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto& b = blocks[i];
    if (b.side == UpdateSide::kCpu) {
      if (ring_zeroes || host_run_[i]) continue;  // a host-run Block's device gradient is untouched
      if (cuda_ && dispatched_[i] && !ring_) streams_->compute().wait(*streams_->landed[i]);
    }
    b.grad.zero_();
  }
  return out;
}

void OffloadEngine::sync_streams() {
  if (!cuda_) return;
  auto& s = *streams_;
  s.impl.synchronizeStream(s.compute());
  s.impl.synchronizeStream(s.d2h);
  s.impl.synchronizeStream(s.h2d);
}

// Per-parameter costs with scratch buffers, for a side no Block measures live yet: the CPU update
// (the fused kernel with the engine's pool), the device's fused AdamW, and the two copies.
void OffloadEngine::calibrate_costs(int64_t cpu_params, int64_t gpu_params) {
  torch::NoGradGuard no_grad;
  constexpr int64_t kN = int64_t{1} << 24;
  const auto time_it = [](const std::function<void()>& fn, const std::function<void()>& sync) {
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      sync();
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      sync();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best / double(kN);
  };
  const auto dev = store_.options().device;
  const auto dsync = [&] { sync_streams(); };
  const bool pin = cuda_ && store_.options().pin_memory;
  const auto cdt = store_.options().compute_dtype;
  const auto time_cpu_kernel = [&] {
    auto master = torch::zeros({kN}, torch::kFloat32), m = torch::zeros({kN}), v = torch::zeros({kN});
    auto grad = torch::full({kN}, 1e-3, torch::kBFloat16), out = torch::empty({kN}, torch::kBFloat16);
    UpdateSpan sp;
    sp.master = master.data_ptr<float>();
    sp.grad = grad.data_ptr();
    sp.grad_dtype = Dtype::kBF16;
    sp.m = m.data_ptr<float>();
    sp.v = v.data_ptr<float>();
    sp.state_dtype = Dtype::kF32;
    sp.bf16_out = reinterpret_cast<uint16_t*>(out.data_ptr());
    sp.n = kN;
    UpdateHyper h = hyper(1e-4, 1, 1.0);
    h.check_finite = false;
    return time_it([&] { cpu_update({sp}, h, nullptr, options_.pool); }, [] {});
  };
  if (cal_cpu_ == 0 && cpu_params == 0) cal_cpu_ = time_cpu_kernel();
  // With the CPU as the device both sides run the CPU kernel (Note [One update kernel on the CPU device]).
  if (cal_gpu_ == 0 && gpu_params == 0 && !cuda_) cal_gpu_ = time_cpu_kernel();
  if (cal_gpu_ == 0 && gpu_params == 0) {
    const auto f = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
    std::vector<torch::Tensor> p{torch::zeros({kN}, f)}, g{torch::full({kN}, 1e-3, f)}, m{torch::zeros({kN}, f)},
        v{torch::zeros({kN}, f)}, st{torch::ones({}, f)};
    cal_gpu_ = time_it(
        [&] {
          // As update_gpu_blocks: the gradient widened to fp32, the step, the working copy written.
          auto gw = torch::empty({kN}, torch::TensorOptions().dtype(cdt).device(dev)).to(torch::kFloat32);
          at::_fused_adamw_(p, g, m, v, {}, st, 1e-4, 0.9, 0.95, 0.1, 1e-8, false, false, std::nullopt, std::nullopt);
          auto w = p[0].to(cdt);
        },
        dsync);
  }
  if ((cal_d2h_ == 0 || cal_h2d_ == 0) && cpu_params == 0) {
    auto d = torch::zeros({kN}, torch::TensorOptions().dtype(cdt).device(dev));
    auto h = torch::empty({kN}, torch::TensorOptions().dtype(cdt).pinned_memory(pin));
    cal_d2h_ = time_it([&] { h.copy_(d, cuda_); }, dsync);
    cal_h2d_ = time_it([&] { d.copy_(h, cuda_); }, dsync);
  }
}

// Note [Update split] in the engine: per-Block forward and backward times come from the last
// step's stamps (the forward from Block i's start to Block i+1's, the backward from Block i+1's
// gradients to Block i's; the head's forward, loss and backward count as its backward); the
// per-parameter costs from the CPU updater's clock and the D2H, H2D and GPU-update events where
// Blocks of that side exist, else from scratch-buffer calibration. The solver's choice is then
// limited to the memory plan's range and applied between steps (Blocks move bit-exactly).
void OffloadEngine::resolve_split() {
  wait_all();
  sync_streams();
  auto& blocks = store_.blocks();
  auto& st = *stamps_;
  const size_t n = blocks.size();
  std::vector<BlockTiming> timing(n);
  int64_t cpu_params = 0, gpu_params = 0;
  double d2h_s = 0, h2d_s = 0;
  for (size_t i = 0; i < n; ++i) {
    timing[i].params = blocks[i].shard_numel;  // this rank's slice is what it updates and moves
    if (i + 1 < n) {
      timing[i].fwd_s = std::max(0.0, between(st.fwd[i], st.fwd[i + 1]));
      timing[i].bwd_s = std::max(0.0, between(st.bwd[i + 1], st.bwd[i]));
    } else {
      timing[i].bwd_s = std::max(0.0, between(st.fwd[i], st.bwd[i]));
    }
    if (blocks[i].side == UpdateSide::kCpu) {
      cpu_params += blocks[i].shard_numel;
      d2h_s += between(st.d2h0[i], st.d2h1[i]);
      h2d_s += between(st.h2d0[i], st.h2d1[i]);
    } else {
      gpu_params += blocks[i].shard_numel;
    }
  }
  calibrate_costs(cpu_params, gpu_params);
  SplitCosts c;
  const int64_t live_params = stats_.cpu_updated_params - live_cpu_params_;
  c.cpu_update_s_per_param =
      live_params > 0 ? (stats_.cpu_update_s - live_cpu_s_) / double(live_params) : cal_cpu_;
  live_cpu_s_ = stats_.cpu_update_s;
  live_cpu_params_ = stats_.cpu_updated_params;
  c.gpu_update_s_per_param = gpu_params > 0 ? between(st.gpu0, st.gpu1) / double(gpu_params) : cal_gpu_;
  c.d2h_s_per_param = cpu_params > 0 ? d2h_s / double(cpu_params) : cal_d2h_;
  c.h2d_s_per_param = cpu_params > 0 ? h2d_s / double(cpu_params) : cal_h2d_;
  c.gpu_bytes_per_param_resident = 12;  // fp32 master, m and v
  using CS = SplitCosts::CpuStart;
  c.cpu_start = options_.delayed ? CS::kDelayed
                : (options_.speculate == EngineOptions::Speculate::kNever || !speculate_now_) ? CS::kAfterBackward
                                                                                               : CS::kAsGradientsArrive;
  const int64_t hi = options_.max_gpu_blocks < 0 ? static_cast<int64_t>(n) : std::min<int64_t>(options_.max_gpu_blocks, n);
  const int64_t lo = std::clamp<int64_t>(options_.min_gpu_blocks, 0, hi);
  int64_t budget = 0;
  for (int64_t i = 0; i < hi; ++i) budget += blocks[i].shard_numel * c.gpu_bytes_per_param_resident;
  const SplitDecision d = solve_update_split(timing, c, budget, options_.fixed_k, lo);
  const int64_t current = store_.gpu_blocks();
  int64_t g = d.gpu_blocks;
  // Moving Blocks costs a synchronisation and copies: keep the split in force unless the new one
  // is predicted at least 2% faster (or the split in force is outside the memory range).
  if (!options_.fixed_k && current >= lo && current <= hi && g != current &&
      d.predicted_step_s > 0.98 * predict_step(timing, c, current).step_s)
    g = current;
  std::vector<double> sorted = step_times_;
  std::sort(sorted.begin(), sorted.end());
  // Every rank applies rank 0's split: the ranks' collectives must match Block for Block.
  if (options_.comm) g = static_cast<int64_t>(options_.comm->from_rank0({double(g)})[0]);
  split_.measured_step_s = sorted.empty() ? 0.0 : sorted[sorted.size() / 2];
  split_.predicted_measured_s = predict_step(timing, c, current).step_s;
  split_.gpu_blocks = g;
  split_.k = double(g) / double(n);
  split_.alpha = c.cpu_update_s_per_param > 0 ? c.gpu_update_s_per_param / c.cpu_update_s_per_param : 0.0;
  split_.predicted_step_s = predict_step(timing, c, g).step_s;
  split_.solved = true;
  step_times_.clear();
  if (options_.log) {
    options_.log(strprintf(
        "update split at step %lld: k = %.2f (%lld of %zu blocks GPU-updated%s), alpha = %.3f (GPU %.3g ns, CPU %.3g "
        "ns per param; D2H %.3g, H2D %.3g ns per param), predicted %.1f ms per step; measured %.1f ms with %lld GPU "
        "blocks, predicted %.1f ms for it",
        static_cast<long long>(steps_begun_), split_.k, static_cast<long long>(g), n,
        g == current ? ", unchanged" : "", split_.alpha, c.gpu_update_s_per_param * 1e9,
        c.cpu_update_s_per_param * 1e9, c.d2h_s_per_param * 1e9, c.h2d_s_per_param * 1e9,
        split_.predicted_step_s * 1e3, split_.measured_step_s * 1e3, static_cast<long long>(current),
        split_.predicted_measured_s * 1e3));
  }
  if (g != current) store_.set_gpu_blocks(g);
}

// Note [Offload trace]
// A traced step starts from idle streams (begin_step waits for the previous step's updates and
// synchronises, which the trace's steps pay once) and a reference stamp taken with the host clock.
// The next begin_step waits again and reads every stamp of the step: per Block the forward and
// backward on the compute stream, the D2H and H2D copies on their streams, the GPU updates, and
// the updater thread's CPU updates by the host clock. Chrome's JSON trace format, one track per
// stream and per updater thread; Perfetto and chrome://tracing load it. With telemetry on, the
// sampler's readings around the traced steps (GPU power, utilisation, memory; CPU utilisation)
// become counter tracks ("ph":"C") on the same clock.
void OffloadEngine::start_trace() {
  wait_all();
  sync_streams();
  if (cuda_) {
    const auto compute = streams_->compute();
    mark(stamps_->ref, &compute, 0);
    stamps_->ref.ev->synchronize();
  }
  trace_ref_host_ = host_now();
  stamps_->ref.host = trace_ref_host_;
  stamps_->ref.set = true;
  for (auto* v : {&stamps_->fwd, &stamps_->bwd, &stamps_->d2h0, &stamps_->d2h1, &stamps_->h2d0, &stamps_->h2d1})
    for (auto& x : *v) x.set = false;
  stamps_->gpu0.set = stamps_->gpu1.set = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cpu_spans_.clear();
    tracing_ = true;
  }
  traced_step_ = steps_begun_;
}

void OffloadEngine::collect_trace() {
  wait_all();
  sync_streams();
  {
    std::lock_guard<std::mutex> lock(mu_);
    tracing_ = false;
  }
  auto& st = *stamps_;
  auto& blocks = store_.blocks();
  const size_t n = blocks.size();
  const double base_us = trace_ref_host_ * 1e6;
  const auto at_us = [&](const Stamp& x) { return base_us + between(st.ref, x) * 1e6; };
  const auto span = [&](int tid, const std::string& name, double t0_us, double t1_us) {
    if (t1_us < t0_us) return;
    trace_events_.push_back(strprintf(
        R"({"name":"%s","cat":"step %lld","ph":"X","pid":1,"tid":%d,"ts":%.3f,"dur":%.3f,"args":{"step":%lld}})",
        name.c_str(), static_cast<long long>(traced_step_), tid, t0_us, t1_us - t0_us,
        static_cast<long long>(traced_step_)));
  };
  enum { kCompute = 1, kD2h = 2, kH2d = 3, kUpdater = 4 };
  for (size_t i = 0; i < n; ++i) {
    const auto& b = blocks[i];
    if (i + 1 < n && st.fwd[i].set && st.fwd[i + 1].set) span(kCompute, "forward " + b.name, at_us(st.fwd[i]), at_us(st.fwd[i + 1]));
    if (i + 1 == n && st.fwd[i].set && st.bwd[i].set) span(kCompute, "forward+loss+backward " + b.name, at_us(st.fwd[i]), at_us(st.bwd[i]));
    if (i + 1 < n && st.bwd[i].set && st.bwd[i + 1].set) span(kCompute, "backward " + b.name, at_us(st.bwd[i + 1]), at_us(st.bwd[i]));
    if (st.d2h0[i].set && st.d2h1[i].set) span(kD2h, "grad " + b.name, at_us(st.d2h0[i]), at_us(st.d2h1[i]));
    if (st.h2d0[i].set && st.h2d1[i].set) span(kH2d, "weights " + b.name, at_us(st.h2d0[i]), at_us(st.h2d1[i]));
  }
  if (st.gpu0.set && st.gpu1.set) span(kCompute, "GPU update (fused AdamW)", at_us(st.gpu0), at_us(st.gpu1));
  for (const auto& c : cpu_spans_)
    span(kUpdater, std::string(c.undo ? "CPU update (speculative) " : "CPU update ") + blocks[c.block].name,
         base_us + c.t0 * 1e6, base_us + c.t1 * 1e6);
  // Counter tracks (Note [Offload trace]): the sampler's readings from just before the step to now.
  if (options_.trace_counters) {
    const auto to_tp = [&](double host_s) {
      return epoch_ + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(host_s));
    };
    for (const auto& c : options_.trace_counters(to_tp(trace_ref_host_ - 1.0), std::chrono::steady_clock::now())) {
      const double us = std::max(0.0, std::chrono::duration<double>(c.t - epoch_).count() * 1e6);
      trace_events_.push_back(strprintf(R"({"name":"%s","ph":"C","pid":1,"tid":0,"ts":%.3f,"args":{"value":%.6g}})",
                                        c.track.c_str(), us, c.value));
    }
  }
  const bool last = options_.trace_steps.empty() || traced_step_ >= options_.trace_steps.back();
  if (!last || options_.trace_path.empty()) return;
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  const char* names[] = {"", cuda_ ? "compute stream" : "compute (CPU device)", "D2H stream (gradients)",
                         "H2D stream (weights)", "CPU updater thread"};
  for (int t = kCompute; t <= kUpdater; ++t)
    out += strprintf(R"({"name":"thread_name","ph":"M","pid":1,"tid":%d,"args":{"name":"%s"}},)", t, names[t]) + "\n";
  out += R"({"name":"process_name","ph":"M","pid":1,"args":{"name":"tandem offload engine"}})";
  for (const auto& e : trace_events_) out += ",\n" + e;
  out += "\n]}\n";
  write_file_atomic(options_.trace_path, out);
  if (options_.log)
    options_.log(strprintf("trace of %zu step(s), %zu spans: %s", options_.trace_steps.size(), trace_events_.size(),
                           options_.trace_path.c_str()));
}

}  // namespace tandem
