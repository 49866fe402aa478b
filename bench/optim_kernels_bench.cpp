// Google Benchmark targets for the CPU update kernels: every level and dtype mix on 16M
// parameters (far beyond the caches), on the process's thread pool. Counters report parameters/s
// and bytes/s by the byte model of bytes_per_element(). End-to-end figures against the peers come
// from `tandem bench optim` and bench/optim_peers.py.

#include <benchmark/benchmark.h>

#include <vector>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/cpu_update.h"

namespace {

using namespace tandem;

constexpr int64_t kN = int64_t(1) << 24;

void BM_AdamW(benchmark::State& state) {
  const auto isa = static_cast<CpuIsa>(state.range(0));
  const auto gd = static_cast<Dtype>(state.range(1)), sd = static_cast<Dtype>(state.range(2));
  const bool out = state.range(3) != 0;
  try {
    set_cpu_isa(isa);
  } catch (const UserError&) {
    state.SkipWithError("this CPU lacks the level");
    return;
  }
  std::vector<float> p(kN, 0.5f), g32(kN, 1e-3f), m32(kN, 0.0f), v32(kN, 0.0f);
  std::vector<uint16_t> g16(kN, 0x3A83), m16(kN, 0), v16(kN, 0), o16(kN, 0);
  UpdateSpan s;
  s.master = p.data();
  s.grad = gd == Dtype::kF32 ? static_cast<const void*>(g32.data()) : g16.data();
  s.m = sd == Dtype::kF32 ? static_cast<void*>(m32.data()) : m16.data();
  s.v = sd == Dtype::kF32 ? static_cast<void*>(v32.data()) : v16.data();
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
  b->ArgNames({"isa", "grad_bf16", "state_bf16", "out"});
  for (int isa = 0; isa <= 3; ++isa) b->Args({isa, 0, 0, 0});
  for (int isa = 1; isa <= 3; ++isa) {
    b->Args({isa, 1, 0, 1});
    b->Args({isa, 1, 1, 0});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_AdamW)->Apply(Args);

}  // namespace

BENCHMARK_MAIN();
