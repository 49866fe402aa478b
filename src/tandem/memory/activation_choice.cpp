#include "tandem/memory/activation_choice.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "tandem/core/device.h"
#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/stats.h"
#include "tandem/core/strings.h"
#include "tandem/memory/estimate.h"
#include "tandem/memory/pinned.h"
#include "tandem/models/autocast.h"

namespace tandem {

// Note [Automatic activation offload]
// Offloading a layer's saved tensors replaces its recomputation (a forward, f) with two copies of
// its bytes over the host link, c = kept_per_layer / link rate each way. The copies out run on
// their own stream beside the forward; the copies back start when the forward ends (Note
// [Activation prefetch]) and must be done, all N of them, by the time the backward reaches the
// first layers: during the backward of the L - N recomputed layers (3f each: recompute and
// backward) and of the offloaded ones (2f each) before them. Counting each direction's copies
// serially, N c <= 3f (L - N) + 2f N, so
//   N <= 3 f L / (c + f).
// The copies out are the looser bound (they have the whole forward as well). f is the layer's
// forward FLOPs (2 per parameter per token, and the causal attention's 2 B T^2 d) at the rate of
// its largest product timed at start, which runs faster than the layer's smaller products and
// its elementwise work: f comes out short, and N with it, the safe side. 13B, B=4, T=2048 on an
// H200: f = 7.3 ms (734 TFLOP/s), c = 44.9 ms (2.25 GiB at 53.8 GB/s), so 16 of 40 layers. Measured
// in one invocation: 1730 ms a step recomputing every layer, 1566 ms offloading 16, 2238 ms
// offloading 24 (docs/benchmarks.md).
// It is 0 where the link has no room: with the offload engine, whose gradients and weights cross
// it every step (13B, B=4, int8 states, exact: 1.834 s a step recomputing, 1.914 s offloading 8
// layers, one invocation); without checkpointing, where nothing is recomputed; and with a
// pipeline, whose micro-batches in flight would multiply the bytes.

namespace {

using Clock = std::chrono::steady_clock;

// Median of three timed runs of `fn` after one untimed, the device synchronised around each.
template <typename Fn>
double timed(const c10::Device& device, Fn fn) {
  const auto sync = [&] { accelerator()->synchronize(device.index()); };
  fn();
  sync();
  std::vector<double> t;
  for (int i = 0; i < 3; ++i) {
    const auto t0 = Clock::now();
    fn();
    sync();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return median(std::move(t));
}

}  // namespace

ActivationRates measure_activation_rates(const ModelSpec& spec, const Config& cfg, int64_t seq_len,
                                         const c10::Device& device) {
  TANDEM_ASSERT(device.is_cuda() && accelerator(), "measure_activation_rates needs a GPU, got ", device.str());
  const torch::NoGradGuard no_grad;
  const auto on = torch::TensorOptions().dtype(compute_dtype(cfg.train.precision)).device(device);
  const int64_t m = cfg.train.micro_batch * seq_len, k = spec.d_model, n = std::max(spec.d_ff, spec.d_model);
  const auto a = torch::randn({m, k}, on), b = torch::randn({k, n}, on);
  auto out = torch::empty({m, n}, on);
  ActivationRates r;
  r.flops_per_s = 2.0 * double(m) * double(k) * double(n) / timed(device, [&] { torch::mm_out(out, a, b); });
  const int64_t bytes = int64_t{64} << 20;
  const auto src = torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  auto dst = host_tensor(bytes, torch::kUInt8, HostMemory::kPinned);
  r.link_bytes_per_s = double(bytes) / timed(device, [&] { dst.copy_(src, /*non_blocking=*/true); });
  return r;
}

std::string activation_offload_excluded(const Config& cfg) {
  if (!cfg.model.checkpointing) return "model.checkpointing is off: nothing is recomputed, every activation stays";
  if (cfg.offload.optimizer == OffloadTarget::kCpu)
    return "the offload engine's gradients and weights use the host link every step";
  if (pipeline_stage_count(cfg.dist) != 1) return "a pipeline's micro-batches in flight would multiply the bytes";
  return "";
}

ActivationChoice choose_offloaded_layers(const ModelSpec& spec, const Config& cfg, int64_t seq_len,
                                         const ActivationRates& rates, int64_t host_room) {
  if (const std::string why = activation_offload_excluded(cfg); !why.empty()) return {0, why};
  const int64_t L = spec.n_layer, B = cfg.train.micro_batch;
  const int64_t bytes = activation_cost(spec, B, seq_len, cfg.train.precision, false).kept_per_layer;
  const double tokens = double(B) * double(seq_len);
  const double flops = 2.0 * double(spec.layer_params(0)) * tokens + 2.0 * tokens * double(seq_len) * double(spec.d_model);
  const double f = flops / rates.flops_per_s, c = double(bytes) / rates.link_bytes_per_s;
  int64_t n = static_cast<int64_t>(std::floor(3.0 * f * double(L) / (c + f)));
  n = std::clamp<int64_t>(n, 0, L);
  std::string cap;
  if (host_room >= 0 && bytes > 0 && n * bytes > host_room) {
    n = host_room / bytes;
    cap = strprintf(", %s of host memory left for %lld", format_bytes(double(host_room)).c_str(), (long long)n);
  }
  return {n, strprintf("%lld of %lld layers: a layer's forward %.1f ms at %.0f TFLOP/s, its %s over the link %.1f ms "
                       "at %.1f GB/s, N <= 3 f L / (c + f)%s",
                       (long long)n, (long long)L, f * 1e3, rates.flops_per_s / 1e12, format_bytes(double(bytes)).c_str(),
                       c * 1e3, rates.link_bytes_per_s / 1e9, cap.c_str())};
}

Config resolve_activation_offload(Config cfg, const ModelSpec& spec, int64_t seq_len, const c10::Device& device,
                                  int64_t host_room) {
  if (cfg.model.activation_offload != ModelConfig::kAutoActivationOffload) return cfg;
  ActivationChoice choice{0, "the device is the CPU"};
  if (const std::string why = activation_offload_excluded(cfg); !why.empty())
    choice = {0, why};
  else if (device.is_cuda() && accelerator())
    choice = choose_offloaded_layers(spec, cfg, seq_len, measure_activation_rates(spec, cfg, seq_len, device),
                                     host_room);
  log::info("model.activation_offload=auto: " + choice.why);
  cfg.model.activation_offload = choice.layers;
  return cfg;
}

}  // namespace tandem
