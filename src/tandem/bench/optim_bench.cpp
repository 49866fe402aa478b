#include "tandem/bench/optim_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/stats.h"
#include "tandem/core/strings.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/optim/q8_codes.h"

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  std::string impl, variant;
  int64_t params;
  int bytes_per_param;
  std::vector<double> times;
  double median() const { return tandem::median(times); }
};

// Hyper-parameters shared by every implementation (those of the peers' runs in PERF.md).
constexpr double kLr = 1e-3, kBeta1 = 0.9, kBeta2 = 0.95, kEps = 1e-8, kWd = 0.1;

// Fills every buffer in parallel (first touch places the pages; the values are a cheap hash).
void fill(CpuThreadPool& pool, float* p, int64_t n, float scale, uint32_t salt) {
  const int64_t chunk = 1 << 20;
  pool.run((n + chunk - 1) / chunk, [&](int64_t t) {
    const int64_t b = t * chunk, e = std::min(n, b + chunk);
    for (int64_t i = b; i < e; ++i) {
      uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u ^ salt;
      x ^= x >> 15;
      x *= 0x2C1B3C6Du;
      x ^= x >> 12;
      p[i] = scale * (static_cast<float>(x >> 8) * (1.0f / 8388608.0f) - 1.0f);
    }
  });
}

template <class F>
Result time_it(const std::string& impl, const std::string& variant, int64_t n, int bytes, const OptimBenchOptions& o,
               F&& step) {
  Result r{impl, variant, n, bytes, {}};
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    const auto t0 = Clock::now();
    step(i + 1);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (i >= o.warmup) r.times.push_back(dt);
  }
  return r;
}

void report(const Result& r, int threads, std::ofstream* json) {
  const double t = r.median();
  const double pps = double(r.params) / t, gbps = double(r.params) * r.bytes_per_param / t / 1e9;
  std::printf("%-12s %-66s %6s params  %8.2f ms  %6.3f G params/s  %6.1f GB/s\n", r.impl.c_str(), r.variant.c_str(),
              format_count(double(r.params)).c_str(), t * 1e3, pps / 1e9, gbps);
  std::fflush(stdout);
  if (json != nullptr) {
    nlohmann::json j = {
        {"impl", r.impl},     {"variant", r.variant}, {"params", r.params},
        {"threads", threads}, {"median_s", t},        {"min_s", *std::min_element(r.times.begin(), r.times.end())},
        {"times_s", r.times}, {"params_per_s", pps},  {"bytes_per_param", r.bytes_per_param},
        {"gbps", gbps}};
    *json << j.dump() << '\n';
    json->flush();
  }
}

}  // namespace

int64_t parse_param_count(const std::string& s) {
  TANDEM_CHECK(!s.empty(), "empty parameter count; write e.g. 256M or 1B");
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  double mult = 1;
  const std::string suffix(end);
  if (suffix == "K" || suffix == "k")
    mult = 1 << 10;
  else if (suffix == "M" || suffix == "m")
    mult = 1 << 20;
  else if (suffix == "B" || suffix == "G" || suffix == "b" || suffix == "g")
    mult = double(1 << 30);
  else
    TANDEM_CHECK(suffix.empty(), "cannot read parameter count '", s, "'; write e.g. 256M, 1B or 1000000");
  const double count = std::round(v * mult);
  TANDEM_CHECK(end != s.c_str() && count >= 1 && count < 1e15, "cannot read parameter count '", s,
               "'; write e.g. 256M, 1B or 1000000 (at least one parameter, below 10^15)");
  return static_cast<int64_t>(count);
}

// m and v (fp32) encoded into 8-bit codes and their scales, in chunks on the pool.
void encode_q8(CpuThreadPool& pool, const torch::Tensor& m, const torch::Tensor& v, torch::Tensor& mq,
               torch::Tensor& vq, torch::Tensor& scales) {
  const int64_t n = m.numel(), chunk = 32 * q8::kBlock, sc = q8::scale_count(n);
  pool.run((n + chunk - 1) / chunk, [&](int64_t t) {
    const int64_t b = t * chunk, len = std::min(n, b + chunk) - b;
    q8::encode(m.data_ptr<float>() + b, v.data_ptr<float>() + b, len, mq.data_ptr<int8_t>() + b,
               vq.data_ptr<uint8_t>() + b, scales.data_ptr<float>() + b / q8::kBlock,
               scales.data_ptr<float>() + sc + b / q8::kBlock);
  });
}

int run_optim_bench(const OptimBenchOptions& o) {
  TANDEM_CHECK(o.repeats >= 1 && o.warmup >= 0, "--repeats must be >= 1 and --warmup >= 0");
  const int threads = resolve_cpu_threads(o.threads);
  CpuThreadPool pool(threads, o.pin);
  at::set_num_threads(threads);  // LibTorch's kernels get the same cores, one at a time
  std::vector<CpuIsa> isas = {best_cpu_isa()};
  for (const auto& name : o.isas) {
    const CpuIsa isa = parse_cpu_isa(name);
    set_cpu_isa(isa);  // UserError when this CPU lacks it
    if (std::find(isas.begin(), isas.end(), isa) == isas.end()) isas.push_back(isa);
  }
  set_cpu_isa(best_cpu_isa());
  std::unique_ptr<std::ofstream> json;
  if (!o.json_path.empty()) {
    json = std::make_unique<std::ofstream>(o.json_path, std::ios::app);
    TANDEM_CHECK(json->good(), "cannot open '", o.json_path, "' for writing; check the directory");
  }
  std::printf("tandem bench optim: %d threads%s, kernels %s, AdamW lr %g betas (%g, %g) eps %g wd %g\n", threads,
              o.pin ? " (pinned)" : "", to_string(best_cpu_isa()), kLr, kBeta1, kBeta2, kEps, kWd);
  std::vector<Result> all;
  for (const int64_t n : o.sizes) {
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    torch::Tensor p = torch::empty({n}, f32), g = torch::empty({n}, f32), m = torch::empty({n}, f32),
                  v = torch::empty({n}, f32);
    torch::Tensor g16 = torch::empty({n}, torch::kBFloat16), m16 = torch::empty({n}, torch::kBFloat16),
                  v16 = torch::empty({n}, torch::kBFloat16), out = torch::empty({n}, torch::kBFloat16);
    // A bf16 master and its Kahan compensation (Note [bf16 master]).
    torch::Tensor p16 = torch::empty({n}, torch::kBFloat16), comp16 = torch::empty({n}, torch::kBFloat16);
    // 8-bit states (Note [8-bit states]): codes and a scale per 2048 elements.
    torch::Tensor mq = torch::empty({n}, torch::kInt8), vq = torch::empty({n}, torch::kUInt8),
                  scales = torch::empty({2 * q8::scale_count(n)}, f32);
    const auto reset = [&] {
      fill(pool, p.data_ptr<float>(), n, 1.0f, 1);
      fill(pool, g.data_ptr<float>(), n, 1e-3f, 2);
      fill(pool, m.data_ptr<float>(), n, 1e-4f, 3);
      fill(pool, v.data_ptr<float>(), n, 1e-7f, 4);
      v.abs_();
      cpu_to_bf16(g.data_ptr<float>(), reinterpret_cast<uint16_t*>(g16.data_ptr()), n, &pool);
      cpu_to_bf16(m.data_ptr<float>(), reinterpret_cast<uint16_t*>(m16.data_ptr()), n, &pool);
      cpu_to_bf16(v.data_ptr<float>(), reinterpret_cast<uint16_t*>(v16.data_ptr()), n, &pool);
      encode_q8(pool, m, v, mq, vq, scales);
      cpu_to_bf16(p.data_ptr<float>(), reinterpret_cast<uint16_t*>(p16.data_ptr()), n, &pool);
      comp16.zero_();
      out.zero_();
    };
    reset();

    // Copy bandwidth: one fp32 buffer into another on the same pool (bytes read + written).
    {
      const int64_t chunk = 1 << 16;
      const float* src = g.data_ptr<float>();
      float* dst = m.data_ptr<float>();
      auto r = time_it("memcpy", "fp32 copy (read + write)", n, 8, o, [&](int) {
        pool.run((n + chunk - 1) / chunk, [&](int64_t t) {
          const int64_t b = t * chunk;
          std::memcpy(dst + b, src + b, (std::min(n, b + chunk) - b) * sizeof(float));
        });
      });
      report(r, threads, json.get());
      all.push_back(r);
      reset();
    }

    struct Variant {
      const char* name;
      Dtype grad, state;
      bool out;
      bool check_finite = true;  // "unchecked": the caller has already checked the gradients
      MasterKind master = MasterKind::kFp32;
    };
    const Variant variants[] = {
        {"AdamW fp32 grads, fp32 states", Dtype::kF32, Dtype::kF32, false},
        {"AdamW fp32 grads, fp32 states, bf16 out", Dtype::kF32, Dtype::kF32, true},
        {"AdamW bf16 grads, fp32 states, bf16 out", Dtype::kBF16, Dtype::kF32, true},
        {"AdamW fp32 grads, bf16 states", Dtype::kF32, Dtype::kBF16, false},
        {"AdamW bf16 grads, bf16 states", Dtype::kBF16, Dtype::kBF16, false},
        {"AdamW bf16 grads, bf16 states, bf16 out", Dtype::kBF16, Dtype::kBF16, true},
        {"AdamW fp32 grads, fp32 states, unchecked", Dtype::kF32, Dtype::kF32, false, false},
        {"AdamW bf16 grads, bf16 states, unchecked", Dtype::kBF16, Dtype::kBF16, false, false},
        {"AdamW fp32 grads, int8 states", Dtype::kF32, Dtype::kQ8, false},
        {"AdamW bf16 grads, int8 states, bf16 out", Dtype::kBF16, Dtype::kQ8, true},
        {"AdamW bf16 grads, bf16 states, bf16 master (stochastic), bf16 out", Dtype::kBF16, Dtype::kBF16, true, true,
         MasterKind::kBf16Stochastic},
        {"AdamW bf16 grads, int8 states, bf16 master (stochastic), bf16 out", Dtype::kBF16, Dtype::kQ8, true, true,
         MasterKind::kBf16Stochastic},
        {"AdamW bf16 grads, int8 states, bf16 master (kahan), bf16 out", Dtype::kBF16, Dtype::kQ8, true, true,
         MasterKind::kBf16Kahan},
    };
    for (const Variant& var : variants) {
      for (CpuIsa isa : isas) {
        if (isa != best_cpu_isa() &&
            !(var.grad == Dtype::kF32 && var.state == Dtype::kF32 && !var.out && var.check_finite))
          continue;
        UpdateSpan s;
        if (var.master == MasterKind::kFp32)
          s.master = p.data_ptr<float>();
        else
          s.master_bf16 = reinterpret_cast<uint16_t*>(p16.data_ptr());
        if (var.master == MasterKind::kBf16Kahan) s.master_comp = reinterpret_cast<uint16_t*>(comp16.data_ptr());
        s.grad = var.grad == Dtype::kF32 ? g.data_ptr() : g16.data_ptr();
        s.m = var.state == Dtype::kF32 ? m.data_ptr() : var.state == Dtype::kBF16 ? m16.data_ptr() : mq.data_ptr();
        s.v = var.state == Dtype::kF32 ? v.data_ptr() : var.state == Dtype::kBF16 ? v16.data_ptr() : vq.data_ptr();
        s.m_scale = scales.data_ptr<float>();
        s.v_scale = s.m_scale + q8::scale_count(n);
        s.bf16_out = var.out ? reinterpret_cast<uint16_t*>(out.data_ptr()) : nullptr;
        s.n = n, s.grad_dtype = var.grad, s.state_dtype = var.state;
        UpdateHyper h;
        h.lr = kLr, h.beta1 = kBeta1, h.beta2 = kBeta2, h.eps = kEps, h.weight_decay = kWd;
        h.check_finite = var.check_finite;
        auto r = time_it("tandem", std::string(var.name) + " [" + to_string(isa) + "]", n,
                         bytes_per_element(UpdateRule::kAdamW, var.grad, var.state, var.out,
                                           var.master == MasterKind::kBf16Stochastic ? 2 : 4),
                         o, [&](int step) {
                           h.step = step;
                           const UpdateReport rep = cpu_update({s}, h, nullptr, &pool, isa);
                           TANDEM_ASSERT(rep.ok(), "non-finite values in the benchmark's gradients");
                         });
        report(r, threads, json.get());
        all.push_back(r);
        reset();
      }
    }

    // LibTorch's CPU AdamW on the same buffers: the fused kernel (torch.optim.AdamW(fused=True))
    // and the foreach sequence (torch.optim.AdamW(foreach=True)).
    {
      torch::NoGradGuard no_grad;
      std::vector<torch::Tensor> P{p}, G{g}, M{m}, V{v};
      torch::Tensor step_t = torch::zeros({}, f32);
      auto r = time_it("torch", "fused AdamW (at::_fused_adamw_)", n, 28, o, [&](int) {
        step_t.add_(1);
        at::_fused_adamw_(P, G, M, V, {}, {step_t}, kLr, kBeta1, kBeta2, kWd, kEps, false, false, std::nullopt,
                          std::nullopt);
      });
      report(r, threads, json.get());
      all.push_back(r);
      reset();
      r = time_it("torch", "foreach AdamW (at::_foreach_* ops)", n, 28, o, [&](int step) {
        const double bc1 = 1 - std::pow(kBeta1, step), bc2 = 1 - std::pow(kBeta2, step);
        at::_foreach_mul_(P, 1 - kLr * kWd);
        at::_foreach_lerp_(M, G, 1 - kBeta1);
        at::_foreach_mul_(V, kBeta2);
        at::_foreach_addcmul_(V, G, G, 1 - kBeta2);
        auto denom = at::_foreach_sqrt(V);
        at::_foreach_div_(denom, std::sqrt(bc2));
        at::_foreach_add_(denom, kEps);
        at::_foreach_addcdiv_(P, M, denom, -kLr / bc1);
      });
      report(r, threads, json.get());
      all.push_back(r);
    }
  }

  std::printf("\n%-12s %-66s %8s %10s %12s %8s %6s\n", "impl", "variant", "params", "ms/step", "G params/s", "GB/s",
              "B/par");
  for (const auto& r : all) {
    const double t = r.median();
    std::printf("%-12s %-66s %8s %10.2f %12.3f %8.1f %6d\n", r.impl.c_str(), r.variant.c_str(),
                format_count(double(r.params)).c_str(), t * 1e3, double(r.params) / t / 1e9,
                double(r.params) * r.bytes_per_param / t / 1e9, r.bytes_per_param);
  }
  return 0;
}

}  // namespace tandem
