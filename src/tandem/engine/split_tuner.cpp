#include "tandem/engine/split_tuner.h"

#include <algorithm>
#include <utility>

#include "tandem/core/strings.h"
#include "tandem/engine/step_stamps.h"
#include "tandem/engine/transfer_streams.h"
#include "tandem/engine/update_spans.h"
#include "tandem/optim/q8_codes.h"

namespace tandem {

namespace {

constexpr int64_t kScratch = int64_t{1} << 24;  // parameters in each calibration buffer

// The best of three runs of `fn`, each between two `sync`s, per scratch parameter.
double seconds_per_param(const std::function<void()>& fn, const std::function<void()>& sync) {
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    sync();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best / double(kScratch);
}

// The fused CPU kernel with the engine's pool: bf16 gradients and weights out, states in the
// store's host dtype (fp32, bf16, or 8 bits with their scales), the master as the store keeps it.
double time_cpu_kernel(const UpdateHyper& base, CpuThreadPool* pool, torch::ScalarType state, MasterKind kind) {
  const bool q8 = state == torch::kInt8;
  auto master = torch::zeros({kScratch}, kind == MasterKind::kFp32 ? torch::kFloat32 : torch::kBFloat16);
  auto comp = kind == MasterKind::kBf16Kahan ? torch::zeros({kScratch}, torch::kBFloat16) : torch::Tensor();
  auto m = torch::zeros({kScratch}, state), v = torch::zeros({kScratch}, q8 ? torch::kUInt8 : state);
  auto scales = torch::zeros({2 * q8::scale_count(kScratch)});
  auto grad = torch::full({kScratch}, 1e-3, torch::kBFloat16), out = torch::empty({kScratch}, torch::kBFloat16);
  UpdateSpan sp;
  if (kind == MasterKind::kFp32)
    sp.master = master.data_ptr<float>();
  else
    sp.master_bf16 = reinterpret_cast<uint16_t*>(master.data_ptr());
  if (comp.defined()) sp.master_comp = reinterpret_cast<uint16_t*>(comp.data_ptr());
  sp.grad = grad.data_ptr();
  sp.grad_dtype = Dtype::kBF16;
  sp.m = m.data_ptr();
  sp.v = v.data_ptr();
  sp.state_dtype = q8 ? Dtype::kQ8 : (state == torch::kBFloat16 ? Dtype::kBF16 : Dtype::kF32);
  sp.m_scale = scales.data_ptr<float>();
  sp.v_scale = sp.m_scale + q8::scale_count(kScratch);
  sp.bf16_out = reinterpret_cast<uint16_t*>(out.data_ptr());
  sp.n = kScratch;
  const UpdateHyper h = update_hyper(base, 1e-4, 1, 1.0);
  return seconds_per_param([&] { cpu_update({sp}, h, nullptr, pool); }, [] {});
}

// The device's fused AdamW as DeviceUpdater runs it: the gradient widened to fp32, the update, the
// working copy written.
double time_fused_adamw(torch::Device dev, torch::ScalarType cdt, const std::function<void()>& sync) {
  const auto f = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
  std::vector<torch::Tensor> p{torch::zeros({kScratch}, f)}, g{torch::full({kScratch}, 1e-3, f)},
      m{torch::zeros({kScratch}, f)}, v{torch::zeros({kScratch}, f)}, st{torch::ones({}, f)};
  return seconds_per_param(
      [&] {
        auto gw = torch::empty({kScratch}, torch::TensorOptions().dtype(cdt).device(dev)).to(torch::kFloat32);
        at::_fused_adamw_(p, g, m, v, {}, st, 1e-4, 0.9, 0.95, 0.1, 1e-8, false, false, std::nullopt, std::nullopt);
        auto w = p[0].to(cdt);
      },
      sync);
}

// The gradient's copy down and the weights' copy up, in the compute dtype: (D2H, H2D).
std::pair<double, double> time_copies(torch::Device dev, torch::ScalarType cdt, bool cuda, bool pin,
                                      const std::function<void()>& sync) {
  auto d = torch::zeros({kScratch}, torch::TensorOptions().dtype(cdt).device(dev));
  auto h = torch::empty({kScratch}, torch::TensorOptions().dtype(cdt).pinned_memory(pin));
  const double d2h = seconds_per_param([&] { h.copy_(d, cuda); }, sync);
  const double h2d = seconds_per_param([&] { d.copy_(h, cuda); }, sync);
  return {d2h, h2d};
}

}  // namespace

SplitTuner::SplitTuner(ParamStore& store, const StepStamps& stamps, const TransferStreams* streams,
                       SplitTunerOptions options)
    : store_(store), stamps_(stamps), streams_(streams), options_(std::move(options)) {}

bool SplitTuner::begin_step(int64_t begun) {
  const auto now = std::chrono::steady_clock::now();
  if (begun > 1) step_times_.push_back(std::chrono::duration<double>(now - last_begin_).count());
  last_begin_ = now;
  const int64_t first = options_.first_solve_step;
  return options_.solve && begun >= first &&
         (begun == first || begun == extra_solve_ ||
          (options_.resolve_every > 0 && (begun - first) % options_.resolve_every == 0));
}

// Note [Split tuner]
// How the engine feeds Note [Update split]: per-Block forward and backward times come from the last
// step's stamps (the forward from Block i's start to the arrival at Block i+1, without the wait for
// Block i+1's upload, which the solver simulates: Note [Step stamps]; the backward from Block
// i+1's gradients to Block i's; the head's forward, loss and backward count as its backward); the
// per-parameter costs from the CPU updater's clock and the D2H, H2D and GPU-update stamps where
// Blocks of that side exist, else from scratch-buffer calibration. The solver's choice is then
// limited to the memory plan's range and applied between steps (Blocks move bit-exactly).
void SplitTuner::solve(const SplitInputs& in, const std::function<void()>& before_move) {
  const std::vector<BlockTiming> timing = block_timing();
  int64_t cpu_params = 0, gpu_params = 0;
  for (const auto& b : store_.blocks()) (b.side == UpdateSide::kCpu ? cpu_params : gpu_params) += b.shard_numel;
  calibrate(cpu_params, gpu_params);
  const SplitCosts c = costs(in, cpu_params, gpu_params);
  const int64_t current = store_.gpu_blocks();
  const int64_t g = choose(timing, c, current);
  std::vector<double> sorted = step_times_;
  std::sort(sorted.begin(), sorted.end());
  status_.measured_step_s = sorted.empty() ? 0.0 : sorted[sorted.size() / 2];
  status_.predicted_measured_s = predict_step(timing, c, current).step_s;
  status_.gpu_blocks = g;
  status_.k = double(g) / double(timing.size());
  status_.alpha = c.cpu_update_s_per_param > 0 ? c.gpu_update_s_per_param / c.cpu_update_s_per_param : 0.0;
  status_.predicted_step_s = predict_step(timing, c, g).step_s;
  status_.solved = true;
  step_times_.clear();
  log_solve(in, c, current);
  if (g == current) return;
  if (before_move) before_move();
  store_.set_gpu_blocks(g);
}

std::vector<BlockTiming> SplitTuner::block_timing() const {
  const auto& blocks = store_.blocks();
  const size_t n = blocks.size();
  std::vector<BlockTiming> timing(n);
  for (size_t i = 0; i < n; ++i) {
    timing[i].params = blocks[i].shard_numel;  // this rank's slice is what it updates and moves
    if (i + 1 < n) {
      timing[i].fwd_s = std::max(0.0, stamps_.forward_s(i));
      timing[i].bwd_s = std::max(0.0, stamps_.backward_s(i));
    } else {
      timing[i].bwd_s = std::max(0.0, stamps_.last_block_s());
    }
  }
  return timing;
}

// Per-parameter costs with scratch buffers, for a side no Block measures live yet: the CPU update,
// the device's fused AdamW, and the two copies. With the CPU as the device both sides run the CPU
// kernel (Note [One update kernel on the CPU device]).
void SplitTuner::calibrate(int64_t cpu_params, int64_t gpu_params) {
  torch::NoGradGuard no_grad;
  const auto& so = store_.options();
  const bool cuda = streams_ != nullptr;
  const auto sync = [&] {
    if (streams_ != nullptr) streams_->synchronize();
  };
  if (cal_.cpu == 0 && cpu_params == 0) cal_.cpu = time_cpu_kernel(options_.hyper, options_.pool, so.host_state_dtype, so.host_master);
  if (cal_.gpu == 0 && gpu_params == 0 && !cuda)  // the CPU as the device: fp32 states there
    cal_.gpu = time_cpu_kernel(options_.hyper, options_.pool, torch::kFloat32, MasterKind::kFp32);
  if (cal_.gpu == 0 && gpu_params == 0) cal_.gpu = time_fused_adamw(so.device, so.compute_dtype, sync);
  if ((cal_.d2h == 0 || cal_.h2d == 0) && cpu_params == 0)
    std::tie(cal_.d2h, cal_.h2d) = time_copies(so.device, so.compute_dtype, cuda, cuda && so.pin_memory, sync);
}

SplitCosts SplitTuner::costs(const SplitInputs& in, int64_t cpu_params, int64_t gpu_params) {
  double d2h_s = 0, h2d_s = 0;
  for (size_t i = 0; i < store_.blocks().size(); ++i) {
    if (store_.blocks()[i].side != UpdateSide::kCpu) continue;
    d2h_s += stamps_.d2h_s(i);
    h2d_s += stamps_.h2d_s(i);
  }
  SplitCosts c;
  const int64_t live_params = in.cpu_updated_params - live_cpu_params_;
  c.cpu_update_s_per_param = live_params > 0 ? (in.cpu_update_s - live_cpu_s_) / double(live_params) : cal_.cpu;
  live_cpu_s_ = in.cpu_update_s;
  live_cpu_params_ = in.cpu_updated_params;
  c.gpu_update_s_per_param = gpu_params > 0 ? stamps_.device_update_s() / double(gpu_params) : cal_.gpu;
  c.d2h_s_per_param = cpu_params > 0 ? d2h_s / double(cpu_params) : cal_.d2h;
  c.h2d_s_per_param = cpu_params > 0 ? h2d_s / double(cpu_params) : cal_.h2d;
  // fp32 master, m and v (Note [Device Adam]): only the budget's ratio to the Blocks' sizes counts.
  c.gpu_bytes_per_param_resident = 4 + 2 * c10::elementSize(store_.options().device_state_dtype);
  c.cpu_start = in.cpu_start;
  return c;
}

int64_t SplitTuner::choose(const std::vector<BlockTiming>& timing, const SplitCosts& c, int64_t current) {
  const auto& blocks = store_.blocks();
  const auto n = static_cast<int64_t>(blocks.size());
  const int64_t hi = options_.max_gpu_blocks < 0 ? n : std::min<int64_t>(options_.max_gpu_blocks, n);
  const int64_t lo = std::clamp<int64_t>(options_.min_gpu_blocks, 0, hi);
  int64_t budget = 0;
  for (int64_t i = 0; i < hi; ++i) budget += blocks[i].shard_numel * c.gpu_bytes_per_param_resident;
  const SplitDecision d = solve_update_split(timing, c, budget, options_.fixed_k, lo);
  int64_t g = d.gpu_blocks;
  // Moving Blocks costs a synchronisation and copies: keep the split in force unless the new one
  // is predicted at least 2% faster (or the split in force is outside the memory range).
  if (!options_.fixed_k && current >= lo && current <= hi && g != current &&
      d.predicted_step_s > 0.98 * predict_step(timing, c, current).step_s)
    g = current;
  // Every replica of a stage applies its first replica's split: their collectives must match Block
  // for Block (pipeline stages hold different Blocks and split on their own).
  if (options_.comm) g = static_cast<int64_t>(options_.comm->from_stage_first(double(g)));
  return g;
}

void SplitTuner::log_solve(const SplitInputs& in, const SplitCosts& c, int64_t current) const {
  if (!options_.log) return;
  const auto& s = status_;
  options_.log(strprintf(
      "update split at step %lld: k = %.2f (%lld of %zu blocks GPU-updated%s), alpha = %.3f (GPU %.3g ns, CPU %.3g "
      "ns per param; D2H %.3g, H2D %.3g ns per param), predicted %.1f ms per step; measured %.1f ms with %lld GPU "
      "blocks, predicted %.1f ms for it",
      static_cast<long long>(in.step), s.k, static_cast<long long>(s.gpu_blocks), store_.blocks().size(),
      s.gpu_blocks == current ? ", unchanged" : "", s.alpha, c.gpu_update_s_per_param * 1e9,
      c.cpu_update_s_per_param * 1e9, c.d2h_s_per_param * 1e9, c.h2d_s_per_param * 1e9, s.predicted_step_s * 1e3,
      s.measured_step_s * 1e3, static_cast<long long>(current), s.predicted_measured_s * 1e3));
}

}  // namespace tandem
