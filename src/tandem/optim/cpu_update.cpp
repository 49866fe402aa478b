#include "tandem/optim/cpu_update.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"
#include "tandem/optim/cpu_update_chunks.h"
#include "tandem/optim/q8_codes.h"

namespace tandem {

// Note [CPU update kernels]
// Every good CPU Adam is bound by host memory bandwidth: fp32 master, gradient and two fp32 states
// read, and master and states written back, is 28 bytes per parameter. tandem's kernels go past
// that bound by moving fewer bytes in one pass: a bf16 gradient as it lands from the GPU (-2), the
// bf16 copy of the new weights for the GPU written in the same pass instead of a second sweep, and
// optionally bf16 states (-8). One template body (cpu_update_kernels.inc) is compiled per
// instruction set; a scalar build of the same body is the reference, with the same operations in
// the same order and fused multiply-adds where the SIMD kernels fuse, so all kernels agree bit for
// bit and the tests demand exactly that. Work is cut into chunks of kChunk elements (a few hundred
// KiB per buffer: it stays in L2 while it is read, updated and written) handed to the persistent
// pool; inside a chunk, tiles of 2048 elements are scanned for non-finite gradients before any of
// the tile is written, so the single pass both reports them and keeps NaN out of the state.

namespace {

constexpr int64_t kChunk = detail::kUpdateChunk;
static_assert(kChunk % q8::kBlock == 0, "a chunk starts on an 8-bit state block");

// Whether this CPU, its OS and this build can run each level, decided once per process. GCC's
// __builtin_cpu_supports checks the OS's saved-state support (XCR0) along with CPUID.
bool supported(CpuIsa isa) {
  static const std::array<bool, 4> kSupported = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 =
        __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
    const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
    return std::array<bool, 4>{true, avx2 && detail::avx2_kernels().update != nullptr,
                               avx512 && detail::avx512_kernels(false).update != nullptr,
                               bf16 && detail::avx512_kernels(true).update != nullptr};
  }();
  return kSupported[static_cast<size_t>(isa)];
}

detail::KernelTable kernels_for(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return detail::scalar_kernels();
    case CpuIsa::kAvx2:
      return detail::avx2_kernels();
    case CpuIsa::kAvx512:
      return detail::avx512_kernels(false);
    case CpuIsa::kAvx512Bf16:
      return detail::avx512_kernels(true);
  }
  return detail::scalar_kernels();
}

std::mutex g_isa_mutex;
bool g_isa_set = false;
CpuIsa g_isa = CpuIsa::kScalar;

uint32_t mix_seed(uint64_t seed, int64_t step) {
  uint64_t x = seed ^ (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(x ^ (x >> 31));
}

void check_span(const UpdateSpan& s, const UpdateHyper& h, size_t i) {
  TANDEM_ASSERT(s.n >= 0, "span ", i, " has negative length");
  if (s.n == 0) return;
  TANDEM_ASSERT((s.master != nullptr) != (s.master_bf16 != nullptr) && s.grad, "span ", i,
                " needs a grad and one master, fp32 or bf16");
  TANDEM_ASSERT(s.master_comp == nullptr || s.master_bf16 != nullptr, "span ", i,
                " has a compensation without a bf16 master");
  const bool adam = h.rule == UpdateRule::kAdamW || h.rule == UpdateRule::kAdam;
  const bool needs_m = adam || h.rule == UpdateRule::kLion || (h.rule == UpdateRule::kSgd && h.beta1 != 0.0);
  TANDEM_ASSERT(!needs_m || s.m, "span ", i, " lacks the first state buffer");
  TANDEM_ASSERT(!adam || s.v, "span ", i, " lacks the second-moment buffer");
  if (s.state_dtype == Dtype::kQ8) {
    TANDEM_ASSERT(adam, "span ", i, ": 8-bit states are Adam's (the rule keeps ", needs_m ? "one" : "no", " state)");
    TANDEM_ASSERT(s.m_scale && s.v_scale, "span ", i, " has 8-bit states without their scales");
  }
}

size_t state_size(Dtype d) { return d == Dtype::kF32 ? 4 : (d == Dtype::kBF16 ? 2 : 1); }

}  // namespace

int bytes_per_element(UpdateRule rule, Dtype grad, Dtype state, bool bf16_out, int master_bytes) {
  const int g = grad == Dtype::kF32 ? 4 : 2, s = static_cast<int>(state_size(state));
  const int states = rule == UpdateRule::kAdamW || rule == UpdateRule::kAdam ? 2 : 1;  // SGD: with momentum
  return 2 * master_bytes + g + 2 * states * s + (bf16_out ? 2 : 0);
}

const char* to_string(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Bf16:
      return "avx512bf16";
  }
  return "?";
}

CpuIsa best_cpu_isa() {
  for (CpuIsa isa : {CpuIsa::kAvx512Bf16, CpuIsa::kAvx512, CpuIsa::kAvx2})
    if (supported(isa)) return isa;
  return CpuIsa::kScalar;
}

CpuIsa parse_cpu_isa(const std::string& name, const std::string& origin) {
  if (name == "auto") return best_cpu_isa();
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16})
    if (name == to_string(isa)) return isa;
  if (!origin.empty())
    TANDEM_FAIL(origin, "='", name,
                "' is not a kernel level; use auto, scalar, avx2, avx512 or avx512bf16, or unset it");
  TANDEM_FAIL("unknown CPU kernel level '", name, "'; use auto, scalar, avx2, avx512 or avx512bf16");
}

void set_cpu_isa(CpuIsa isa) {
  TANDEM_CHECK(supported(isa), "this CPU cannot run the ", to_string(isa),
               " kernels (best available: ", to_string(best_cpu_isa()), "); choose that or a lower level");
  std::lock_guard<std::mutex> lock(g_isa_mutex);
  g_isa = isa;
  g_isa_set = true;
}

CpuIsa active_cpu_isa() {
  std::lock_guard<std::mutex> lock(g_isa_mutex);
  if (!g_isa_set) {
    const char* env = std::getenv("TANDEM_CPU_ISA");
    CpuIsa isa = best_cpu_isa();
    if (env != nullptr && *env != '\0') {
      isa = parse_cpu_isa(env, "TANDEM_CPU_ISA");
      TANDEM_CHECK(supported(isa), "TANDEM_CPU_ISA=", env,
                   ": this CPU cannot run those kernels (best available: ", to_string(best_cpu_isa()), ")");
    }
    g_isa = isa;
    g_isa_set = true;
  }
  return g_isa;
}

namespace detail {

UpdateCoeffs make_coeffs(const UpdateHyper& call, const UpdateSpan& s) {
  TANDEM_ASSERT(call.step >= 1, "update step must be >= 1, got ", call.step);
  UpdateHyper h = call;
  if (s.group != nullptr) {  // Note [Parameter groups]
    h.lr = s.group->lr;
    h.beta1 = s.group->beta1;
    h.beta2 = s.group->beta2;
    h.eps = s.group->eps;
    h.weight_decay = s.group->weight_decay;
    h.step = call.step - s.group->steps_before;
    TANDEM_ASSERT(h.step >= 1, "a group's update ", h.step, " (the call's ", call.step, ", ", s.group->steps_before,
                  " before the group)");
  }
  const double wd = h.weight_decay * s.weight_decay_scale;
  UpdateCoeffs c{};
  c.rule = h.rule;
  c.rounding = h.rounding;
  c.nesterov = h.nesterov;
  c.first_step = h.step == 1;
  c.check_finite = h.check_finite;
  c.grad_scale = static_cast<float>(h.grad_scale);
  c.b1 = static_cast<float>(h.beta1);
  c.omb1 = static_cast<float>(1.0 - h.beta1);
  c.b2 = static_cast<float>(h.beta2);
  c.omb2 = static_cast<float>(1.0 - h.beta2);
  c.eps = static_cast<float>(h.eps);
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2 = 1.0 - std::pow(h.beta2, static_cast<double>(h.step));
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.neg_step_size = static_cast<float>(-h.lr / bc1);
  const bool decoupled = h.rule == UpdateRule::kAdamW || h.rule == UpdateRule::kLion;
  c.decay = static_cast<float>(decoupled ? 1.0 - h.lr * wd : 1.0);
  c.wd = static_cast<float>(decoupled ? 0.0 : wd);
  c.neg_lr = static_cast<float>(-h.lr);
  c.omdamp = static_cast<float>(1.0 - h.dampening);
  c.seed = mix_seed(h.seed, h.step);
  return c;
}

}  // namespace detail

UpdateReport cpu_update(const std::vector<UpdateSpan>& spans, const UpdateHyper& hyper,
                        const std::vector<UndoLog>* undo, CpuThreadPool* pool) {
  return cpu_update(spans, hyper, undo, pool, active_cpu_isa());
}

UpdateReport cpu_update(const std::vector<UpdateSpan>& spans, const UpdateHyper& hyper,
                        const std::vector<UndoLog>* undo, CpuThreadPool* pool, CpuIsa isa) {
  return detail::update_in_chunks(spans, hyper, undo, pool, isa, nullptr).report;
}

namespace detail {

void for_each_chunk(const std::vector<UpdateSpan>& spans, CpuThreadPool* pool, const ChunkFn& f) {
  struct Chunk {
    size_t span;
    int64_t begin, end;
  };
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < spans.size(); ++i)
    for (int64_t b = 0; b < spans[i].n; b += kChunk) chunks.push_back({i, b, std::min(spans[i].n, b + kChunk)});
  CpuThreadPool& p = pool != nullptr ? *pool : CpuThreadPool::global();
  p.run(static_cast<int64_t>(chunks.size()), [&](int64_t t) {
    const Chunk& ch = chunks[static_cast<size_t>(t)];
    f(ch.span, ch.begin, ch.end);
  });
}

ChunkedUpdate update_in_chunks(const std::vector<UpdateSpan>& spans, const UpdateHyper& hyper,
                               const std::vector<UndoLog>* undo, CpuThreadPool* pool, CpuIsa isa,
                               const ChunkFn& before) {
  TANDEM_ASSERT(undo == nullptr || undo->size() == spans.size(), "undo log has ", undo ? undo->size() : 0,
                " entries for ", spans.size(), " spans");
  TANDEM_CHECK(supported(isa), "this CPU cannot run the ", to_string(isa), " kernels");
  for (size_t i = 0; i < spans.size(); ++i) check_span(spans[i], hyper, i);
  const KernelTable k = kernels_for(isa);
  std::vector<UpdateCoeffs> coeffs;
  coeffs.reserve(spans.size());
  for (const auto& s : spans) coeffs.push_back(make_coeffs(hyper, s));

  using Clock = std::chrono::steady_clock;
  std::atomic<int64_t> nonfinite{0}, skipped{0}, before_ns{0}, update_ns{0};
  std::mutex first_mutex;
  std::vector<int64_t> first_bad(spans.size(), -1);
  for_each_chunk(spans, pool, [&](size_t span, int64_t begin, int64_t end) {
    const UndoLog* u = undo ? &(*undo)[span] : nullptr;
    Clock::time_point t0, t1;
    if (before) {
      t0 = Clock::now();
      before(span, begin, end);
      t1 = Clock::now();
    }
    int64_t first = -1, skip = 0;
    const int64_t bad = k.update(coeffs[span], spans[span], u, begin, end, &first, &skip);
    if (before) {
      before_ns.fetch_add(std::chrono::nanoseconds(t1 - t0).count(), std::memory_order_relaxed);
      update_ns.fetch_add(std::chrono::nanoseconds(Clock::now() - t1).count(), std::memory_order_relaxed);
    }
    if (bad > 0) {
      nonfinite.fetch_add(bad, std::memory_order_relaxed);
      skipped.fetch_add(skip, std::memory_order_relaxed);
      std::lock_guard<std::mutex> lock(first_mutex);
      int64_t& f = first_bad[span];
      if (f < 0 || first < f) f = first;
    }
  });

  ChunkedUpdate out;
  out.report.nonfinite = nonfinite.load();
  out.report.skipped_tiles = skipped.load();
  for (size_t i = 0; i < spans.size(); ++i)
    if (first_bad[i] >= 0) {
      out.report.first_nonfinite = spans[i].index_base + first_bad[i];
      break;
    }
  out.before_s = 1e-9 * static_cast<double>(before_ns.load());
  out.update_s = 1e-9 * static_cast<double>(update_ns.load());
  return out;
}

}  // namespace detail

void cpu_rollback(const std::vector<UpdateSpan>& spans, const std::vector<UndoLog>& undo, CpuThreadPool* pool) {
  TANDEM_ASSERT(undo.size() == spans.size(), "undo log has ", undo.size(), " entries for ", spans.size(), " spans");
  const detail::KernelTable k = kernels_for(active_cpu_isa());
  detail::for_each_chunk(spans, pool, [&](size_t span, int64_t begin, int64_t end) {
    const UpdateSpan& s = spans[span];
    const UndoLog& u = undo[span];
    const int64_t len = end - begin;
    const size_t state_bytes = state_size(s.state_dtype);
    if (s.master != nullptr) {
      std::memcpy(s.master + begin, u.master + begin, len * sizeof(float));
    } else {
      std::memcpy(s.master_bf16 + begin, u.master_bf16 + begin, len * sizeof(uint16_t));
      if (s.master_comp != nullptr) std::memcpy(s.master_comp + begin, u.master_comp + begin, len * sizeof(uint16_t));
    }
    if (s.state_dtype == Dtype::kQ8 && u.m_scale && u.v_scale) {  // chunks start on a block (kChunk % kBlock == 0)
      const int64_t b0 = begin / q8::kBlock, nb = q8::scale_count(len);
      std::memcpy(s.m_scale + b0, u.m_scale + b0, nb * sizeof(float));
      std::memcpy(s.v_scale + b0, u.v_scale + b0, nb * sizeof(float));
    }
    if (s.m && u.m)
      std::memcpy(static_cast<char*>(s.m) + begin * state_bytes, static_cast<const char*>(u.m) + begin * state_bytes,
                  len * state_bytes);
    if (s.v && u.v)
      std::memcpy(static_cast<char*>(s.v) + begin * state_bytes, static_cast<const char*>(u.v) + begin * state_bytes,
                  len * state_bytes);
    if (s.bf16_out && s.master != nullptr) k.to_bf16(s.master + begin, s.bf16_out + begin, len);
    if (s.bf16_out && s.master == nullptr)
      std::memcpy(s.bf16_out + begin, s.master_bf16 + begin, len * sizeof(uint16_t));
  });
}

void cpu_to_bf16(const float* src, uint16_t* dst, int64_t n, CpuThreadPool* pool) {
  const detail::KernelTable k = kernels_for(active_cpu_isa());
  const int64_t n_chunks = (n + kChunk - 1) / kChunk;
  CpuThreadPool& p = pool ? *pool : CpuThreadPool::global();
  p.run(n_chunks, [&](int64_t t) {
    const int64_t b = t * kChunk;
    k.to_bf16(src + b, dst + b, std::min(n, b + kChunk) - b);
  });
}

void cpu_split_bf16(const float* src, uint16_t* hi, uint16_t* lo, int64_t n, CpuThreadPool* pool) {
  const detail::KernelTable k = kernels_for(active_cpu_isa());
  const int64_t n_chunks = (n + kChunk - 1) / kChunk;
  CpuThreadPool& p = pool ? *pool : CpuThreadPool::global();
  p.run(n_chunks, [&](int64_t t) {
    const int64_t b = t * kChunk;
    k.split_bf16(src + b, hi + b, lo + b, std::min(n, b + kChunk) - b);
  });
}

}  // namespace tandem
