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
#include "tandem/optim/cpu_retract.h"
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

namespace {

// The buffers every measurement of one size works on, and their starting values.
struct Buffers {
  int64_t n;
  CpuThreadPool& pool;
  torch::Tensor p, g, m, v;          // fp32
  torch::Tensor g16, m16, v16, out;  // bf16
  torch::Tensor p16, comp16;         // a bf16 master and its Kahan compensation (Note [bf16 master])
  torch::Tensor mq, vq, scales;      // 8-bit states (Note [8-bit states]): codes and a scale per 2048

  Buffers(int64_t n_, CpuThreadPool& pool_) : n(n_), pool(pool_) {
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    for (auto* t : {&p, &g, &m, &v}) *t = torch::empty({n}, f32);
    for (auto* t : {&g16, &m16, &v16, &out, &p16, &comp16}) *t = torch::empty({n}, torch::kBFloat16);
    mq = torch::empty({n}, torch::kInt8);
    vq = torch::empty({n}, torch::kUInt8);
    scales = torch::empty({2 * q8::scale_count(n)}, f32);
    reset();
  }
  static uint16_t* u16(const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }
  void reset() {
    fill(pool, p.data_ptr<float>(), n, 1.0f, 1);
    fill(pool, g.data_ptr<float>(), n, 1e-3f, 2);
    fill(pool, m.data_ptr<float>(), n, 1e-4f, 3);
    fill(pool, v.data_ptr<float>(), n, 1e-7f, 4);
    v.abs_();
    cpu_to_bf16(g.data_ptr<float>(), u16(g16), n, &pool);
    cpu_to_bf16(m.data_ptr<float>(), u16(m16), n, &pool);
    cpu_to_bf16(v.data_ptr<float>(), u16(v16), n, &pool);
    encode_q8(pool, m, v, mq, vq, scales);
    cpu_to_bf16(p.data_ptr<float>(), u16(p16), n, &pool);
    comp16.zero_();
    out.zero_();
  }
};

struct Variant {
  const char* name;
  Dtype grad, state;
  bool out;
  bool check_finite = true;  // "unchecked": the caller has already checked the gradients
  MasterKind master = MasterKind::kFp32;
  Rounding rounding = Rounding::kNearestEven;  // of bf16 states and 8-bit codes
};

const Variant kVariants[] = {
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
    {"AdamW bf16 grads, int8 states (stochastic codes), bf16 out", Dtype::kBF16, Dtype::kQ8, true, true,
     MasterKind::kFp32, Rounding::kStochastic},
    {"AdamW bf16 grads, bf16 states, bf16 master (stochastic), bf16 out", Dtype::kBF16, Dtype::kBF16, true, true,
     MasterKind::kBf16Stochastic},
    {"AdamW bf16 grads, int8 states, bf16 master (stochastic), bf16 out", Dtype::kBF16, Dtype::kQ8, true, true,
     MasterKind::kBf16Stochastic},
    {"AdamW bf16 grads, int8 states, bf16 master (kahan), bf16 out", Dtype::kBF16, Dtype::kQ8, true, true,
     MasterKind::kBf16Kahan},
};

UpdateSpan span_of(const Buffers& b, const Variant& var) {
  UpdateSpan s;
  if (var.master == MasterKind::kFp32)
    s.master = b.p.data_ptr<float>();
  else
    s.master_bf16 = Buffers::u16(b.p16);
  if (var.master == MasterKind::kBf16Kahan) s.master_comp = Buffers::u16(b.comp16);
  s.grad = var.grad == Dtype::kF32 ? b.g.data_ptr() : b.g16.data_ptr();
  s.m = var.state == Dtype::kF32 ? b.m.data_ptr() : var.state == Dtype::kBF16 ? b.m16.data_ptr() : b.mq.data_ptr();
  s.v = var.state == Dtype::kF32 ? b.v.data_ptr() : var.state == Dtype::kBF16 ? b.v16.data_ptr() : b.vq.data_ptr();
  s.m_scale = b.scales.data_ptr<float>();
  s.v_scale = s.m_scale + q8::scale_count(b.n);
  s.bf16_out = var.out ? Buffers::u16(b.out) : nullptr;
  s.n = b.n, s.grad_dtype = var.grad, s.state_dtype = var.state;
  return s;
}

UpdateHyper hyper(bool check_finite = true) {
  UpdateHyper h;
  h.lr = kLr, h.beta1 = kBeta1, h.beta2 = kBeta2, h.eps = kEps, h.weight_decay = kWd;
  h.check_finite = check_finite;
  return h;
}

// What every measurement shares: the options, the pool, where results go.
struct Session {
  const OptimBenchOptions& o;
  CpuThreadPool& pool;
  int threads;
  std::ofstream* json;
  std::vector<Result> all;
  void keep(const Result& r) {
    report(r, threads, json);
    all.push_back(r);
  }
};

// Copy bandwidth: one fp32 buffer into another on the same pool (bytes read + written).
void bench_copy(Session& run, Buffers& b) {
  const int64_t n = b.n, chunk = 1 << 16;
  const float* src = b.g.data_ptr<float>();
  float* dst = b.m.data_ptr<float>();
  run.keep(time_it("memcpy", "fp32 copy (read + write)", n, 8, run.o, [&](int) {
    run.pool.run((n + chunk - 1) / chunk, [&](int64_t t) {
      const int64_t c = t * chunk;
      std::memcpy(dst + c, src + c, (std::min(n, c + chunk) - c) * sizeof(float));
    });
  }));
  b.reset();
}

// tandem's update kernels, each variant at the best level; the plain fp32 one also at `isas`.
void bench_kernels(Session& run, Buffers& b, const std::vector<CpuIsa>& isas) {
  for (const Variant& var : kVariants)
    for (CpuIsa isa : isas) {
      if (isa != best_cpu_isa() &&
          !(var.grad == Dtype::kF32 && var.state == Dtype::kF32 && !var.out && var.check_finite))
        continue;
      const UpdateSpan s = span_of(b, var);
      UpdateHyper h = hyper(var.check_finite);
      h.rounding = var.rounding;
      const int bytes = bytes_per_element(UpdateRule::kAdamW, var.grad, var.state, var.out,
                                          var.master == MasterKind::kBf16Stochastic ? 2 : 4);
      run.keep(time_it("tandem", std::string(var.name) + " [" + to_string(isa) + "]", b.n, bytes, run.o, [&](int step) {
        h.step = step;
        const UpdateReport rep = cpu_update({s}, h, nullptr, &run.pool, isa);
        TANDEM_ASSERT(rep.ok(), "non-finite values in the benchmark's gradients");
      }));
      b.reset();
    }
}

// A clipped speculative step (Note [Retraction]): the update taken back and redone with the clip
// coefficient, as two passes and as one; bytes counted per pass.
void bench_retraction(Session& run, Buffers& b) {
  const Variant var{"", Dtype::kBF16, Dtype::kBF16, true};
  const UpdateSpan s = span_of(b, var);
  const int bytes = bytes_per_element(UpdateRule::kAdamW, var.grad, var.state, var.out);
  const std::string what = "bf16 grads, bf16 states, bf16 out [" + std::string(to_string(best_cpu_isa())) + "]";
  UpdateHyper spec = hyper(), clipped = hyper();
  clipped.grad_scale = 0.25;
  cpu_update({s}, spec, nullptr, &run.pool);  // the speculative update the steps take back
  run.keep(time_it("tandem", "retract, then update: " + what, b.n, 2 * bytes, run.o, [&](int step) {
    spec.step = clipped.step = step;
    cpu_retract({s}, spec, &run.pool);
    cpu_update({s}, clipped, nullptr, &run.pool);
  }));
  run.keep(time_it("tandem", "retract + update in one pass: " + what, b.n, bytes, run.o, [&](int step) {
    spec.step = clipped.step = step;
    const RetractAndUpdate r = cpu_retract_and_update({s}, spec, clipped, &run.pool);
    TANDEM_ASSERT(r.report.ok(), "non-finite values in the benchmark's gradients");
  }));
  b.reset();
}

// LibTorch's CPU AdamW on the same buffers: the fused kernel (torch.optim.AdamW(fused=True)) and
// the foreach sequence (torch.optim.AdamW(foreach=True)).
void bench_torch(Session& run, Buffers& b) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> P{b.p}, G{b.g}, M{b.m}, V{b.v};
  torch::Tensor step_t = torch::zeros({}, torch::kFloat32);
  run.keep(time_it("torch", "fused AdamW (at::_fused_adamw_)", b.n, 28, run.o, [&](int) {
    step_t.add_(1);
    at::_fused_adamw_(P, G, M, V, {}, {step_t}, kLr, kBeta1, kBeta2, kWd, kEps, false, false, std::nullopt,
                      std::nullopt);
  }));
  b.reset();
  run.keep(time_it("torch", "foreach AdamW (at::_foreach_* ops)", b.n, 28, run.o, [&](int step) {
    const double bc2 = 1 - std::pow(kBeta2, step), bc1 = 1 - std::pow(kBeta1, step);
    at::_foreach_mul_(P, 1 - kLr * kWd);
    at::_foreach_lerp_(M, G, 1 - kBeta1);
    at::_foreach_mul_(V, kBeta2);
    at::_foreach_addcmul_(V, G, G, 1 - kBeta2);
    auto denom = at::_foreach_sqrt(V);
    at::_foreach_div_(denom, std::sqrt(bc2));
    at::_foreach_add_(denom, kEps);
    at::_foreach_addcdiv_(P, M, denom, -kLr / bc1);
  }));
}

void print_table(const std::vector<Result>& all) {
  std::printf("\n%-12s %-66s %8s %10s %12s %8s %6s\n", "impl", "variant", "params", "ms/step", "G params/s", "GB/s",
              "B/par");
  for (const auto& r : all) {
    const double t = r.median();
    std::printf("%-12s %-66s %8s %10.2f %12.3f %8.1f %6d\n", r.impl.c_str(), r.variant.c_str(),
                format_count(double(r.params)).c_str(), t * 1e3, double(r.params) / t / 1e9,
                double(r.params) * r.bytes_per_param / t / 1e9, r.bytes_per_param);
  }
}

// The best level and the levels asked for; UserError for one this CPU lacks.
std::vector<CpuIsa> requested_isas(const OptimBenchOptions& o) {
  std::vector<CpuIsa> isas = {best_cpu_isa()};
  for (const auto& name : o.isas) {
    const CpuIsa isa = parse_cpu_isa(name);
    set_cpu_isa(isa);  // UserError when this CPU lacks it
    if (std::find(isas.begin(), isas.end(), isa) == isas.end()) isas.push_back(isa);
  }
  set_cpu_isa(best_cpu_isa());
  return isas;
}

}  // namespace

int run_optim_bench(const OptimBenchOptions& o) {
  TANDEM_CHECK(o.repeats >= 1 && o.warmup >= 0, "--repeats must be >= 1 and --warmup >= 0");
  const int threads = resolve_cpu_threads(o.threads);
  CpuThreadPool pool(threads, o.pin);
  at::set_num_threads(threads);  // LibTorch's kernels get the same cores, one at a time
  const std::vector<CpuIsa> isas = requested_isas(o);
  std::unique_ptr<std::ofstream> json;
  if (!o.json_path.empty()) {
    json = std::make_unique<std::ofstream>(o.json_path, std::ios::app);
    TANDEM_CHECK(json->good(), "cannot open '", o.json_path, "' for writing; check the directory");
  }
  std::printf("tandem bench optim: %d threads%s, kernels %s, AdamW lr %g betas (%g, %g) eps %g wd %g\n", threads,
              o.pin ? " (pinned)" : "", to_string(best_cpu_isa()), kLr, kBeta1, kBeta2, kEps, kWd);
  Session run{o, pool, threads, json.get(), {}};
  for (const int64_t n : o.sizes) {
    Buffers b(n, pool);
    bench_copy(run, b);
    bench_kernels(run, b, isas);
    bench_retraction(run, b);
    bench_torch(run, b);
  }
  print_table(run.all);
  return 0;
}

}  // namespace tandem
