#include "tandem/models/init.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"

namespace tandem {
namespace {

// Note [Parallel initialisation]
// The default CPU generator is one sequential Mersenne Twister stream, so a tensor drawn from it
// fills on one core: about 80 s for the 7B preset's weights, longer than the first steps. Each
// tensor instead takes one 64-bit seed from the default generator (so torch::manual_seed still
// decides everything, in construction order), and each chunk of kChunk elements draws from its own
// generator seeded by mixing that seed with the chunk's index, on tandem's CPU pool (LibTorch's
// intra-op threads may be limited to one): the values depend on the seed and
// the tensor's place in the model, not on the thread count. They are not the values the
// sequential stream gave before this change (no parallel scheme can reproduce one sequential
// stream); a run's initial weights are bitwise reproducible for its seed.
constexpr int64_t kChunk = int64_t(1) << 20;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

thread_local int skip_fill = 0;  // SkipInitialFill guards alive on this thread

uint64_t draw_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

}  // namespace

void init_normal(torch::Tensor& t, double std) {
  TANDEM_ASSERT(t.device().is_cpu() && t.is_contiguous(), "init_normal takes a contiguous CPU tensor");
  torch::NoGradGuard no_grad;
  const uint64_t seed = draw_seed();
  if (skip_fill > 0) return;
  auto flat = t.view({-1});
  const int64_t n = flat.numel(), chunks = (n + kChunk - 1) / kChunk;
  CpuThreadPool::global().run(chunks, [&](int64_t c) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(mix(seed ^ mix(static_cast<uint64_t>(c))));
    flat.narrow(0, c * kChunk, std::min(kChunk, n - c * kChunk)).normal_(0.0, std, gen);
  });
}

SkipInitialFill::SkipInitialFill(bool skip) : skip_(skip) { skip_fill += skip_ ? 1 : 0; }
SkipInitialFill::~SkipInitialFill() { skip_fill -= skip_ ? 1 : 0; }

}  // namespace tandem
