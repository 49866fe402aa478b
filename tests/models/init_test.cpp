// Parallel initialisation (models/init.h): values fixed by the seed whatever the thread count, one
// draw of the default generator per tensor, N(0, std^2) in every chunk, and SkipInitialFill leaving
// memory untouched while keeping the generator in step.

#include "tandem/models/init.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <mutex>
#include <thread>

#include "tandem/core/error.h"
#include "tandem/core/thread_pool.h"

namespace tandem {
namespace {

constexpr int64_t kChunk = int64_t(1) << 20;  // init.cpp's chunk: two full chunks and a short one
constexpr int64_t kN = 2 * kChunk + 17;

torch::Tensor drawn(uint64_t seed, int64_t n, double std) {
  torch::manual_seed(seed);
  auto t = torch::empty({n});
  init_normal(t, std);
  return t;
}

// Restores the global pool's shape at scope exit.
class GlobalPoolShape {
 public:
  GlobalPoolShape() : threads_(CpuThreadPool::global().size()), pin_(CpuThreadPool::global().pinned()) {}
  ~GlobalPoolShape() { CpuThreadPool::configure_global(threads_, pin_); }

 private:
  int threads_;
  bool pin_;
};

TEST(Init, ValuesDependOnTheSeedAndNotOnTheThreadCount) {
  GlobalPoolShape restore;
  CpuThreadPool::configure_global(1, false);
  const auto one = drawn(11, kN, 1.0);
  CpuThreadPool::configure_global(3, false);
  const auto three = drawn(11, kN, 1.0);
  EXPECT_TRUE(torch::equal(one, three)) << "the values depend on the thread count";
  EXPECT_FALSE(torch::equal(drawn(12, kN, 1.0), one)) << "another seed gave the same values";
  // Each chunk draws from a generator of its own: the chunks are not copies of each other.
  EXPECT_FALSE(torch::equal(one.narrow(0, 0, 1000), one.narrow(0, kChunk, 1000)));
}

TEST(Init, ValuesDependOnTheElementsNotOnTheShape) {
  torch::manual_seed(3);
  auto flat = torch::empty({6 * 7 * 11});
  init_normal(flat, 0.5);
  torch::manual_seed(3);
  auto shaped = torch::empty({6, 7, 11});
  init_normal(shaped, 0.5);
  EXPECT_TRUE(torch::equal(shaped.view({-1}), flat));
}

TEST(Init, EachTensorTakesOneDrawOfTheDefaultGenerator) {
  torch::manual_seed(5);
  auto t = torch::empty({kN});
  init_normal(t, 1.0);
  const auto after_init = torch::rand({8});
  torch::manual_seed(5);
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.get<at::CPUGeneratorImpl>()->random64();
  }
  EXPECT_TRUE(torch::equal(torch::rand({8}), after_init)) << "init_normal moved the default generator by more or "
                                                             "less than one 64-bit draw, whatever the tensor's size";
  // Consecutive tensors take consecutive seeds: the second differs from the first.
  torch::manual_seed(5);
  auto a = torch::empty({1000}), b = torch::empty({1000});
  init_normal(a, 1.0);
  init_normal(b, 1.0);
  EXPECT_FALSE(torch::equal(a, b));
}

TEST(Init, EveryChunkIsNormalWithTheRequestedStd) {
  const double std = 0.02;
  const auto t = drawn(7, kN, std).to(torch::kFloat64);
  for (int64_t c = 0; c < 2; ++c) {  // the two full chunks, each from its own generator
    const auto chunk = t.narrow(0, c * kChunk, kChunk);
    const double mean = chunk.mean().item<double>(), sd = chunk.std().item<double>();
    // Standard errors at n = 2^20: the mean's std / 1024, the std's about std / 1448.
    EXPECT_LT(std::abs(mean), 5 * std / 1024) << "chunk " << c;
    EXPECT_NEAR(sd, std, 5 * std / 1448) << "chunk " << c;
    // About 68.3% of N(0, s^2) lies within one s of the mean (binomial sd 0.05%).
    const double within = (chunk.abs() < std).to(torch::kFloat64).mean().item<double>();
    EXPECT_NEAR(within, 0.6827, 0.003) << "chunk " << c;
  }
  const auto tail = t.narrow(0, 2 * kChunk, 17);
  EXPECT_TRUE(tail.ne(0).all().item<bool>()) << "the short last chunk was not filled";
  EXPECT_LT(tail.abs().max().item<double>(), 7 * std);
}

TEST(Init, AZeroStdFillsZerosAndAnEmptyTensorStillTakesItsDraw) {
  auto t = torch::full({17}, 3.0f);
  init_normal(t, 0.0);
  EXPECT_TRUE(t.eq(0).all().item<bool>());
  torch::manual_seed(9);
  auto empty = torch::empty({0});
  init_normal(empty, 1.0);
  const auto after = torch::rand({4});
  torch::manual_seed(9);
  auto one = torch::empty({1});
  init_normal(one, 1.0);
  EXPECT_TRUE(torch::equal(torch::rand({4}), after));
}

TEST(Init, SkipInitialFillLeavesMemoryUntouchedAndKeepsTheGeneratorInStep) {
  torch::manual_seed(13);
  auto filled = torch::empty({kN});
  init_normal(filled, 1.0);
  const auto next_filled = torch::rand({8});

  torch::manual_seed(13);
  auto skipped = torch::full({kN}, 7.0f);
  {
    const SkipInitialFill skip(true);
    init_normal(skipped, 1.0);
  }
  EXPECT_TRUE(skipped.eq(7.0f).all().item<bool>()) << "a skipped tensor was written";
  EXPECT_TRUE(torch::equal(torch::rand({8}), next_filled)) << "a skipped tensor did not take its seed";

  // After the guard the next tensor fills, with the values a build without the skip gives it.
  torch::manual_seed(13);
  auto first = torch::empty({100}), second = torch::empty({100});
  init_normal(first, 1.0);
  init_normal(second, 1.0);
  torch::manual_seed(13);
  auto skipped_first = torch::zeros({100}), second_after = torch::empty({100});
  {
    const SkipInitialFill skip(true);
    init_normal(skipped_first, 1.0);
  }
  init_normal(second_after, 1.0);
  EXPECT_TRUE(skipped_first.eq(0).all().item<bool>());
  EXPECT_TRUE(torch::equal(second_after, second));
}

TEST(Init, SkipGuardsNestAndAFalseOneSkipsNothing) {
  auto t = torch::zeros({64});
  {
    const SkipInitialFill no(false);
    init_normal(t, 1.0);
  }
  EXPECT_FALSE(t.eq(0).all().item<bool>()) << "a guard made with false skipped the fill";
  t.zero_();
  {
    const SkipInitialFill outer(true);
    {
      const SkipInitialFill inner(true);
      init_normal(t, 1.0);
    }
    init_normal(t, 1.0);  // the outer guard still lives
    EXPECT_TRUE(t.eq(0).all().item<bool>()) << "the end of an inner guard ended the outer one's skip";
    {
      const SkipInitialFill inner(false);
      init_normal(t, 1.0);
    }
    EXPECT_TRUE(t.eq(0).all().item<bool>()) << "a false guard inside a true one filled";
  }
  init_normal(t, 1.0);
  EXPECT_FALSE(t.eq(0).all().item<bool>()) << "the skip outlived its guards";
}

TEST(Init, ASkipGuardAppliesToItsOwnThreadOnly) {
  const SkipInitialFill skip(true);
  auto t = torch::zeros({64});
  std::thread other([&] { init_normal(t, 1.0); });
  other.join();
  EXPECT_FALSE(t.eq(0).all().item<bool>()) << "another thread's init was skipped";
}

TEST(Init, ANonContiguousTensorIsRefused) {
  auto t = torch::zeros({4, 6}).t();
  EXPECT_THROW(init_normal(t, 1.0), InternalError);
}

}  // namespace
}  // namespace tandem
