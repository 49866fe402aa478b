// Google Benchmark targets for the CPU update kernels: every level and dtype mix on 16M
// parameters (far beyond the caches), on the process's thread pool. Counters report parameters/s
// and bytes/s by the byte model of bytes_per_element(). End-to-end figures against the peers come
// from `tandem bench optim` and bench/optim_peers.py.

#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/cpu_update.h"
#include "tandem/optim/q8_codes.h"

namespace {

using namespace tandem;

constexpr int64_t kN = int64_t(1) << 24;

void BM_AdamW(benchmark::State& state) {
  const auto isa = static_cast<CpuIsa>(state.range(0));
  const auto gd = state.range(1) != 0 ? Dtype::kBF16 : Dtype::kF32;
  const Dtype sd = state.range(2) == 2 ? Dtype::kQ8 : state.range(2) == 1 ? Dtype::kBF16 : Dtype::kF32;
  const bool out = state.range(3) != 0;
  try {
    set_cpu_isa(isa);
  } catch (const UserError&) {
    state.SkipWithError("this CPU lacks the level");
    return;
  }
  std::vector<float> p(kN, 0.5f), g32(kN, 1e-3f), m32(kN, 0.0f), v32(kN, 0.0f);
  std::vector<uint16_t> g16(kN, 0x3A83), m16(kN, 0), v16(kN, 0), o16(kN, 0);
  for (int64_t i = 0; i < kN; ++i) {  // gradients of both signs and many magnitudes, as training's
    uint32_t x = static_cast<uint32_t>(i) * 0x9E3779B1u;
    x ^= x >> 15;
    g32[i] = 1e-3f * (static_cast<float>(x >> 8) * (1.0f / 8388608.0f) - 1.0f);
    uint32_t b;
    std::memcpy(&b, &g32[i], 4);
    g16[i] = static_cast<uint16_t>(b >> 16);
  }
  std::vector<int8_t> m8(kN, 0);
  std::vector<uint8_t> v8(kN, 0);
  std::vector<float> scales(2 * q8::scale_count(kN), 0.0f);
  UpdateSpan s;
  s.master = p.data();
  s.grad = gd == Dtype::kF32 ? static_cast<const void*>(g32.data()) : g16.data();
  s.m = sd == Dtype::kF32  ? static_cast<void*>(m32.data())
        : sd == Dtype::kQ8 ? static_cast<void*>(m8.data())
                           : m16.data();
  s.v = sd == Dtype::kF32  ? static_cast<void*>(v32.data())
        : sd == Dtype::kQ8 ? static_cast<void*>(v8.data())
                           : v16.data();
  s.m_scale = scales.data();
  s.v_scale = scales.data() + q8::scale_count(kN);
  s.bf16_out = out ? o16.data() : nullptr;
  s.n = kN, s.grad_dtype = gd, s.state_dtype = sd;
  UpdateHyper h;
  h.beta2 = 0.95, h.weight_decay = 0.1;
  int64_t step = 0;
  for (auto _ : state) {
    h.step = ++step;
    benchmark::DoNotOptimize(cpu_update({s}, h, nullptr, nullptr, isa));
  }
  const int bytes = bytes_per_element(UpdateRule::kAdamW, gd, sd, out);
  state.counters["params/s"] = benchmark::Counter(double(kN), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["bytes/s"] = benchmark::Counter(double(kN) * bytes, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(to_string(isa)));
  set_cpu_isa(best_cpu_isa());
}

void Args(benchmark::internal::Benchmark* b) {
  // state: 0 fp32, 1 bf16, 2 8-bit codes (Note [8-bit states])
  b->ArgNames({"isa", "grad_bf16", "state", "out"});
  for (int isa = 0; isa <= 3; ++isa) b->Args({isa, 0, 0, 0});
  for (int isa = 1; isa <= 3; ++isa) {
    b->Args({isa, 1, 0, 1});
    b->Args({isa, 1, 1, 0});
    b->Args({isa, 1, 1, 1});
    b->Args({isa, 1, 2, 1});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_AdamW)->Apply(Args);

}  // namespace

BENCHMARK_MAIN();
