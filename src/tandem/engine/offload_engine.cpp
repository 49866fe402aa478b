#include "tandem/engine/offload_engine.h"

#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <cmath>

#include "tandem/core/error.h"

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
    for (size_t i = 0; i < blocks; ++i) {
      grad_ready.push_back(std::make_unique<c10::Event>(c10::DeviceType::CUDA));
      landed.push_back(std::make_unique<c10::Event>(c10::DeviceType::CUDA));
      uploaded.push_back(std::make_unique<c10::Event>(c10::DeviceType::CUDA));
    }
  }
  c10::Stream compute() const { return impl.getStream(device); }
};

namespace {

struct ReadyHook : torch::autograd::PostAccumulateGradHook {
  std::function<void()> fn;
  explicit ReadyHook(std::function<void()> f) : fn(std::move(f)) {}
  void operator()(const torch::autograd::Variable&) override { fn(); }
};

}  // namespace

OffloadEngine::OffloadEngine(Model& model, ParamStore& store, EngineOptions options)
    : model_(model), store_(store), options_(options), cuda_(store.options().device.is_cuda()) {
  const size_t n = store_.blocks().size();
  remaining_.assign(n, 0);
  dispatched_.assign(n, false);
  sqnorm_.resize(n);
  done_.assign(n, 1);
  step_tensor_ = torch::zeros({}, torch::kFloat32);
  if (cuda_) streams_ = std::make_unique<Streams>(store_.options().device, n);
  for (size_t i = 0; i < n; ++i)
    for (auto& f : store_.blocks()[i].params)
      torch::autograd::impl::set_post_acc_grad_hooks(f.param,
                                                     std::make_unique<ReadyHook>([this, i] { on_param_ready(i); }));
  model_.set_before_block([this](size_t i) { wait_block(i); });
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
  return h;
}

void OffloadEngine::begin_step(double lr, double loss_scale) {
  TANDEM_ASSERT(loss_scale > 0, "loss scale ", loss_scale);
  lr_ = lr;
  loss_scale_ = loss_scale;
  std::fill(dispatched_.begin(), dispatched_.end(), false);
  using S = EngineOptions::Speculate;
  constexpr size_t kSpeculationWindow = 8;
  speculate_now_ = options_.speculate == S::kAlways ||
                   (options_.speculate == S::kAuto && would_roll_back_.size() >= kSpeculationWindow &&
                    std::none_of(would_roll_back_.begin(), would_roll_back_.end(), [](bool b) { return b; }));
  if (speculate_now_) ++stats_.speculative_steps;
}

void OffloadEngine::begin_micro(bool last) {
  last_micro_ = last;
  for (size_t i = 0; i < remaining_.size(); ++i)
    remaining_[i] = static_cast<int64_t>(store_.blocks()[i].params.size());
}

void OffloadEngine::on_param_ready(size_t block) {
  if (--remaining_[block] == 0 && last_micro_ && !dispatched_[block]) dispatch(block);
}

void OffloadEngine::dispatch(size_t i) {
  torch::NoGradGuard no_grad;
  dispatched_[i] = true;
  auto& b = store_.blocks()[i];
  sqnorm_[i] = torch::linalg_vector_norm(b.grad, 2, std::nullopt, false, torch::kFloat32).square();
  if (b.side == UpdateSide::kGpu) return;  // updated in end_step(), once the clip is known
  if (cuda_) {
    auto& s = *streams_;
    s.grad_ready[i]->record(s.compute());
    s.d2h.wait(*s.grad_ready[i]);
    {
      const c10::StreamGuard guard(s.d2h);
      b.landing.copy_(b.grad, /*non_blocking=*/true);
    }
    s.landed[i]->record(s.d2h);
  } else {
    b.landing.copy_(b.grad);
  }
  if (!speculate_now_) return;  // queued by end_step() once the norm is known
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_[i] = 0;
    ++in_flight_;
    // Always with an undo log: the non-finite check may roll back even without clipping.
    queue_.push_back({i, 1.0 / loss_scale_, lr_, stats_.steps + 1, true});
  }
  cv_.notify_all();
}

std::vector<UpdateSpan> OffloadEngine::spans(size_t i) {
  auto& b = store_.blocks()[i];
  const bool bf16 = store_.options().compute_dtype == torch::kBFloat16;
  const bool grad_bf16 = b.landing.scalar_type() == torch::kBFloat16;
  TANDEM_ASSERT(grad_bf16 || b.landing.scalar_type() == torch::kFloat32, "landing buffer dtype ",
                b.landing.scalar_type(), " (the CPU kernels take fp32 or bf16 gradients)");
  const int64_t gsize = grad_bf16 ? 2 : 4;
  std::vector<UpdateSpan> out;
  for (const auto& f : b.params) {
    UpdateSpan s;
    s.master = b.master.data_ptr<float>() + f.offset;
    s.grad = static_cast<const char*>(b.landing.data_ptr()) + f.offset * gsize;
    s.grad_dtype = grad_bf16 ? Dtype::kBF16 : Dtype::kF32;
    s.m = b.m.data_ptr<float>() + f.offset;
    s.v = b.v.data_ptr<float>() + f.offset;
    s.state_dtype = Dtype::kF32;
    s.bf16_out = bf16 ? reinterpret_cast<uint16_t*>(b.staging.data_ptr()) + f.offset : nullptr;
    s.n = f.numel;
    s.index_base = b.index_base + f.offset;
    s.weight_decay_scale = f.weight_decay_scale;
    out.push_back(s);
  }
  return out;
}

void OffloadEngine::run_cpu_update(const Job& job) {
  const size_t i = job.block;
  const bool undo = job.undo;
  auto& b = store_.blocks()[i];
  const auto t0 = std::chrono::steady_clock::now();
  const auto sp = spans(i);
  std::vector<UndoLog> logs;
  if (undo) {
    TANDEM_ASSERT(b.undo_master.defined(), "block ", b.name, " has no undo buffers");
    for (const auto& f : b.params)
      logs.push_back({b.undo_master.data_ptr<float>() + f.offset, b.undo_m.data_ptr<float>() + f.offset,
                      b.undo_v.data_ptr<float>() + f.offset});
  }
  UpdateHyper h = hyper(job.lr, job.step, job.grad_scale);
  h.check_finite = false;  // the global norm decides (Note [Speculative clipping])
  cpu_update(sp, h, undo ? &logs : nullptr, options_.pool);
  if (!sp.empty() && sp[0].bf16_out == nullptr) b.staging.copy_(b.master);
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> lock(mu_);
  stats_.cpu_update_s += dt;
  stats_.cpu_updated_params += b.numel;
}

void OffloadEngine::upload(size_t i) {
  auto& b = store_.blocks()[i];
  torch::NoGradGuard no_grad;
  if (cuda_) {
    auto& s = *streams_;
    const c10::StreamGuard guard(s.h2d);
    b.working.copy_(b.staging, /*non_blocking=*/true);
    s.uploaded[i]->record(s.h2d);
  } else {
    b.working.copy_(b.staging);
  }
}

void OffloadEngine::updater_loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
    }
    if (cuda_) streams_->landed[job.block]->synchronize();
    run_cpu_update(job);
    upload(job.block);
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_[job.block] = 1;
      --in_flight_;
    }
    cv_.notify_all();
  }
}

void OffloadEngine::wait_block(size_t i) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_[i] != 0; });
  }
  if (cuda_ && store_.blocks()[i].side == UpdateSide::kCpu) streams_->compute().wait(*streams_->uploaded[i]);
}

void OffloadEngine::wait_cpu_jobs() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return in_flight_ == 0; });
}

void OffloadEngine::wait_all() {
  wait_cpu_jobs();
  for (size_t i = 0; i < store_.blocks().size(); ++i) wait_block(i);
}

void OffloadEngine::update_gpu_blocks(double grad_scale) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> params[2], grads[2], m[2], v[2], steps[2];
  std::vector<size_t> gpu;
  for (size_t i = 0; i < store_.blocks().size(); ++i) {
    auto& b = store_.blocks()[i];
    if (b.side != UpdateSide::kGpu) continue;
    gpu.push_back(i);
    const auto g = b.grad.to(torch::kFloat32) * grad_scale;
    for (const auto& f : b.params) {
      const int k = f.weight_decay_scale != 0.0f ? 0 : 1;
      params[k].push_back(b.master.narrow(0, f.offset, f.numel));
      grads[k].push_back(g.narrow(0, f.offset, f.numel));
      m[k].push_back(b.m.narrow(0, f.offset, f.numel));
      v[k].push_back(b.v.narrow(0, f.offset, f.numel));
    }
  }
  if (gpu.empty()) return;
  const auto dev = store_.options().device;
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
  for (const size_t i : gpu) store_.blocks()[i].working.copy_(store_.blocks()[i].master);
}

StepOutcome OffloadEngine::end_step() {
  torch::NoGradGuard no_grad;
  auto& blocks = store_.blocks();
  for (size_t i = 0; i < blocks.size(); ++i)
    if (!dispatched_[i]) dispatch(i);  // a Block some of whose parameters got no gradient
  StepOutcome out;
  const double norm_scaled = torch::stack(sqnorm_).sum().sqrt().item<double>();  // one host sync
  out.grad_norm = norm_scaled / loss_scale_;
  const double inv_scale = 1.0 / loss_scale_;
  double coef = 1.0;
  if (!std::isfinite(out.grad_norm)) {
    out.skipped = true;
  } else if (options_.grad_clip > 0 && out.grad_norm > options_.grad_clip) {
    coef = options_.grad_clip / (out.grad_norm + 1e-6);
  }
  const bool any_cpu = std::any_of(blocks.begin(), blocks.end(), [](auto& b) { return b.side == UpdateSide::kCpu; });
  would_roll_back_.push_back(out.skipped || coef < 1.0);
  if (would_roll_back_.size() > 8) would_roll_back_.pop_front();
  if (!speculate_now_ && !out.skipped) {
    // The CPU Blocks in forward order, so the next forward's first Blocks are ready first.
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < blocks.size(); ++i) {
        if (blocks[i].side != UpdateSide::kCpu) continue;
        done_[i] = 0;
        ++in_flight_;
        queue_.push_back({i, inv_scale * coef, lr_, stats_.steps + 1, false});
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
      const auto sp = spans(i);
      std::vector<UndoLog> logs;
      for (const auto& f : b.params)
        logs.push_back({b.undo_master.data_ptr<float>() + f.offset, b.undo_m.data_ptr<float>() + f.offset,
                        b.undo_v.data_ptr<float>() + f.offset});
      cpu_rollback(sp, logs, options_.pool);
      if (!sp.empty() && sp[0].bf16_out == nullptr) b.staging.copy_(b.master);
      if (out.skipped) {
        upload(i);
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      done_[i] = 0;
      ++in_flight_;
      queue_.push_back({i, inv_scale * coef, lr_, stats_.steps + 1, false});
    }
    cv_.notify_all();
  }
  if (out.skipped) {
    ++stats_.skipped;
  } else {
    update_gpu_blocks(inv_scale * coef);
    ++stats_.steps;
    step_tensor_.fill_(static_cast<double>(stats_.steps));
  }
  // The D2H copies read the gradient buffers: the compute stream waits for them before zeroing.
  if (cuda_)
    for (size_t i = 0; i < blocks.size(); ++i)
      if (blocks[i].side == UpdateSide::kCpu && dispatched_[i]) streams_->compute().wait(*streams_->landed[i]);
  store_.zero_grad();
  return out;
}

}  // namespace tandem
