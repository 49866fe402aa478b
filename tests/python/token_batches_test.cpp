// The Python package's training batches (python/token_batches.h, tandem.data.TokenBatches) in C++:
// windows of the training split at the sampler's offsets for train.seed, a rank's rows of the global
// batch, seek and position, and the refusals (no train.seq_len, tokens past the vocabulary).

#include "tandem/python/token_batches.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "../test_util.h"
#include "tandem/data/dataset.h"
#include "tandem/data/loader.h"

namespace tandem {
namespace {

constexpr int64_t kTokens = 5000;

// A raw uint16 token file (nanoGPT's layout) whose token i is i % 251: a window's tokens name its offset.
std::string counting_tokens(const test::TempDir& dir) {
  std::vector<uint16_t> t(kTokens);
  for (int64_t i = 0; i < kTokens; ++i) t[i] = static_cast<uint16_t>(i % 251);
  const std::string path = dir.file("count.bin");
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(t.data()), kTokens * 2);
  return path;
}

Config batches_config(const std::string& path, int64_t micro_batch, int64_t seq_len, uint64_t seed) {
  Config c;
  c.data.path = path;
  c.train.micro_batch = micro_batch;
  c.train.seq_len = seq_len;
  c.train.seed = seed;
  return c;
}

// "" when every row of (x, y) is the window at offsets[r] (x) and the same shifted by one (y).
std::string windows_mismatch(const torch::Tensor& x, const torch::Tensor& y, const std::vector<int64_t>& offsets) {
  const auto xa = x.accessor<int64_t, 2>(), ya = y.accessor<int64_t, 2>();
  for (int64_t r = 0; r < x.size(0); ++r)
    for (int64_t t = 0; t < x.size(1); ++t) {
      const int64_t want_x = (offsets[r] + t) % 251, want_y = (offsets[r] + t + 1) % 251;
      if (xa[r][t] != want_x || ya[r][t] != want_y)
        return "row " + std::to_string(r) + " position " + std::to_string(t) + ": (" + std::to_string(xa[r][t]) + ", " +
               std::to_string(ya[r][t]) + "), want (" + std::to_string(want_x) + ", " + std::to_string(want_y) +
               ") from offset " + std::to_string(offsets[r]);
    }
  return "";
}

TEST(TokenBatches, BatchesAreTrainingWindowsAtTheSamplersOffsets) {
  test::TempDir dir;
  const Config c = batches_config(counting_tokens(dir), 4, 17, 7);
  const int64_t train_tokens = open_data(c.data).train.size();
  ASSERT_EQ(train_tokens, kTokens - static_cast<int64_t>(kTokens * c.data.val_fraction));
  TokenBatches batches(c, 256, 0, 0);
  for (int64_t index = 0; index < 3; ++index) {
    const auto [x, y] = batches.next();
    ASSERT_EQ(x.sizes(), (std::vector<int64_t>{4, 17})) << "train.micro_batch rows of train.seq_len";
    ASSERT_EQ(y.sizes(), x.sizes());
    EXPECT_EQ(x.scalar_type(), torch::kInt64);
    EXPECT_EQ(y.scalar_type(), torch::kInt64);
    EXPECT_TRUE(x.device().is_cpu());
    const auto offsets = sample_offsets(7, index, 4, 17, train_tokens, 0);
    for (const int64_t o : offsets) EXPECT_LE(o + 17 + 1, train_tokens) << "a window reaches the held-out tokens";
    EXPECT_EQ(windows_mismatch(x, y, offsets), "") << "batch " << index;
    EXPECT_EQ(batches.position(), index + 1);
  }
}

// Data parallel: a rank taking rows [first_row, first_row + rows) sees exactly those rows of the batch
// one process taking all of them sees.
TEST(TokenBatches, ARanksRowsAreItsShareOfTheGlobalBatch) {
  test::TempDir dir;
  const Config c = batches_config(counting_tokens(dir), 4, 9, 3);
  TokenBatches all(c, 256, 0, 0), middle(c, 256, 2, 1), last(c, 256, 1, 3);
  for (int i = 0; i < 3; ++i) {
    const auto [x, y] = all.next();
    const auto [mx, my] = middle.next();
    const auto [lx, ly] = last.next();
    ASSERT_EQ(mx.size(0), 2);
    ASSERT_EQ(lx.size(0), 1);
    EXPECT_TRUE(torch::equal(mx, x.narrow(0, 1, 2))) << "batch " << i;
    EXPECT_TRUE(torch::equal(my, y.narrow(0, 1, 2))) << "batch " << i;
    EXPECT_TRUE(torch::equal(lx, x.narrow(0, 3, 1))) << "batch " << i;
    EXPECT_TRUE(torch::equal(ly, y.narrow(0, 3, 1))) << "batch " << i;
  }
}

TEST(TokenBatches, SeekReplaysTheBatchesFromAPosition) {
  test::TempDir dir;
  const Config c = batches_config(counting_tokens(dir), 2, 8, 11);
  TokenBatches b(c, 256, 0, 0);
  std::vector<torch::Tensor> seen;
  for (int i = 0; i < 4; ++i) seen.push_back(b.next().first);
  EXPECT_EQ(b.position(), 4);
  b.seek(1);
  EXPECT_EQ(b.position(), 1);
  EXPECT_TRUE(torch::equal(b.next().first, seen[1]));
  EXPECT_TRUE(torch::equal(b.next().first, seen[2]));
  EXPECT_EQ(b.position(), 3);
  // A fresh reader seeked to 3 continues where this one would.
  TokenBatches resumed(c, 256, 0, 0);
  resumed.seek(3);
  EXPECT_TRUE(torch::equal(resumed.next().first, seen[3]));
}

TEST(TokenBatches, TheSeedDecidesTheWindows) {
  test::TempDir dir;
  const std::string path = counting_tokens(dir);
  TokenBatches a(batches_config(path, 4, 16, 1), 256, 0, 0), same(batches_config(path, 4, 16, 1), 256, 0, 0),
      other(batches_config(path, 4, 16, 2), 256, 0, 0);
  const auto x = a.next().first;
  EXPECT_TRUE(torch::equal(same.next().first, x));
  EXPECT_FALSE(torch::equal(other.next().first, x));
}

TEST(TokenBatches, TheGeneratedCorpusServesWhenNoFileIsGiven) {
  Config c = batches_config("synthetic", 3, 12, 5);
  c.data.synthetic_bytes = 20000;
  TokenBatches b(c, 256, 0, 0);
  const auto [x, y] = b.next();
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{3, 12}));
  EXPECT_TRUE(torch::equal(x.narrow(1, 1, 11), y.narrow(1, 0, 11))) << "targets are the inputs shifted by one";
  EXPECT_LT(x.max().item<int64_t>(), 256);
}

TEST(TokenBatches, RefusesAMissingSequenceLengthTooLittleDataAndTokensPastTheVocabulary) {
  test::TempDir dir;
  const std::string path = counting_tokens(dir);
  EXPECT_NE(test::error_of([&] {
              TokenBatches b(batches_config(path, 2, 0, 1), 256, 0, 0);
            }).find("tandem.data.TokenBatches needs train.seq_len (> 0)"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] {
              TokenBatches b(batches_config(path, 2, kTokens, 1), 256, 0, 0);
            }).find("the training split has 4750 tokens, too few for one sequence of train.seq_len=5000"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { TokenBatches b(batches_config(dir.file("none.bin"), 2, 8, 1), 256, 0, 0); }), "")
      << "a data.path that does not exist";
  // Tokens run to 250: a vocabulary of 200 is too small, found when a batch is made.
  TokenBatches narrow(batches_config(path, 8, 64, 1), 200, 0, 0);
  const std::string err = test::error_of([&] {
    for (int i = 0; i < 8; ++i) narrow.next();
  });
  EXPECT_NE(err.find("is outside the model's vocabulary of 200; set model.vocab_size above it"), std::string::npos)
      << err;
}

}  // namespace
}  // namespace tandem
