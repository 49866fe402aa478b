// The batch loader: window offsets that depend only on (seed, index, row) and stay inside the
// buffer, batches whose targets are the inputs shifted by one, positions that reproduce batches
// after a seek, rows that partition one global batch between ranks, and the vocabulary check.

#include "tandem/data/loader.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <vector>

#include "../test_util.h"
#include "tandem/core/error.h"
#include "tandem/data/synthetic.h"
#include "tandem/data/token_file.h"

namespace tandem {
namespace {

using test::error_of;

/// Tokens 0, 1, 2, ... wrapping below `vocab`: a window's first token names its offset (mod vocab).
std::vector<uint16_t> counting_tokens(int64_t n, int64_t vocab) {
  std::vector<uint16_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i % vocab);
  return t;
}

TEST(Loader, SampleOffsetsDependOnlyOnSeedIndexAndRow) {
  const int64_t T = 16, n = 100000;
  for (int64_t index : {0, 1, 7, 123456}) {
    const auto a = sample_offsets(42, index, 8, T, n);
    EXPECT_EQ(a, sample_offsets(42, index, 8, T, n)) << "same arguments, same offsets";
    EXPECT_NE(a, sample_offsets(43, index, 8, T, n)) << "another seed";
    EXPECT_NE(a, sample_offsets(42, index + 1, 8, T, n)) << "another batch";
    // Row r is the same whether it is asked for alone, in a smaller batch or from a later first row.
    for (int64_t r = 0; r < 8; ++r) {
      EXPECT_EQ(sample_offsets(42, index, 1, T, n, r), std::vector<int64_t>{a[r]}) << index << ", row " << r;
      EXPECT_EQ(sample_offsets(42, index, r + 1, T, n)[r], a[r]) << index << ", row " << r;
    }
    // Rows differ from one another (a fixed expectation: the hash is fixed).
    EXPECT_EQ(std::set<int64_t>(a.begin(), a.end()).size(), a.size()) << index;
  }
  // A seed that differs in one high bit still changes every row.
  const auto lo = sample_offsets(1, 5, 8, T, n), hi = sample_offsets(1 | (uint64_t{1} << 63), 5, 8, T, n);
  for (size_t r = 0; r < lo.size(); ++r) EXPECT_NE(lo[r], hi[r]) << r;
}

TEST(Loader, SampleOffsetsCoverExactlyTheWindowsInsideTheBuffer) {
  // n tokens hold n - T windows of T + 1 tokens: offsets 0 .. n - T - 1, each of them reached.
  for (const int64_t T : {1, 5, 64}) {
    const int64_t n = T + 4;  // offsets 0, 1, 2, 3
    std::set<int64_t> seen;
    for (int64_t i = 0; i < 200; ++i)
      for (auto off : sample_offsets(9, i, 4, T, n)) {
        EXPECT_GE(off, 0) << T;
        EXPECT_LE(off, n - T - 1) << T;
        seen.insert(off);
      }
    EXPECT_EQ(seen, (std::set<int64_t>{0, 1, 2, 3})) << "T = " << T;
  }
  for (uint64_t seed : {uint64_t{0}, uint64_t{7}, ~uint64_t{0}})
    for (int64_t i = 0; i < 100; ++i)
      for (auto off : sample_offsets(seed, i, 16, 1000, 1017)) {
        EXPECT_GE(off, 0);
        EXPECT_LE(off, 16);
      }
}

TEST(Loader, AFileOfExactlySeqLenPlusOneTokensIsOneWindowAtOffsetZero) {
  const int64_t T = 8;
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(sample_offsets(3, i, 4, T, T + 1), std::vector<int64_t>(4, 0)) << i;
  const auto toks = counting_tokens(T + 1, 256);  // 0 .. 8
  BatchLoader l(TokenBuffer::from_tokens(toks, "nine tokens"), 2, T, 3, torch::kCPU, 2, 256, "train");
  for (int64_t i = 0; i < 3; ++i) {
    const Batch b = l.next();
    ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{2, T}));
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(b.inputs[r][t].item<int64_t>(), t) << i << ", " << r << ", " << t;
        EXPECT_EQ(b.targets[r][t].item<int64_t>(), t + 1) << i << ", " << r << ", " << t;
      }
  }
  // One token fewer is no window at all.
  const std::string msg = error_of([&] {
    BatchLoader short_one(TokenBuffer::from_tokens(counting_tokens(T, 256), "eight tokens"), 2, T, 3, torch::kCPU, 2,
                          256, "val");
  });
  EXPECT_NE(msg.find("the val split has 8 tokens, too few for one sequence of train.seq_len=8"), std::string::npos)
      << msg;
}

TEST(Loader, BatchesAreTheSampledWindowsWithTargetsShiftedByOne) {
  const int64_t B = 3, T = 10, n = 5000, vocab = 60000;
  const auto toks = counting_tokens(n, vocab);
  BatchLoader l(TokenBuffer::from_tokens(toks, "counting"), B, T, 17, torch::kCPU, 3, vocab, "train");
  for (int64_t i = 0; i < 6; ++i) {
    const Batch b = l.next();
    EXPECT_EQ(b.index, i);
    ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{B, T}));
    ASSERT_EQ(b.targets.sizes(), (std::vector<int64_t>{B, T}));
    EXPECT_EQ(b.inputs.scalar_type(), torch::kInt64);
    EXPECT_EQ(b.targets.scalar_type(), torch::kInt64);
    const auto offsets = sample_offsets(17, i, B, T, n);
    for (int64_t r = 0; r < B; ++r)
      for (int64_t t = 0; t < T; ++t) {
        ASSERT_EQ(b.inputs[r][t].item<int64_t>(), toks[offsets[r] + t]) << "batch " << i << " row " << r << " t " << t;
        ASSERT_EQ(b.targets[r][t].item<int64_t>(), toks[offsets[r] + t + 1])
            << "batch " << i << " row " << r << " t " << t;
      }
  }
}

TEST(Loader, PositionCountsBatchesAndSeekReproducesThem) {
  const auto toks = counting_tokens(20000, 1000);
  const TokenBuffer buf = TokenBuffer::from_tokens(toks, "counting");
  BatchLoader straight(buf, 4, 16, 5, torch::kCPU, 2, 1000, "train");
  std::vector<Batch> first;
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_EQ(straight.position(), i);
    first.push_back(straight.next());
    EXPECT_EQ(first.back().index, i);
  }
  EXPECT_EQ(straight.position(), 8);
  // A loader seeked forward, backward (past prefetched batches) and to where it is.
  BatchLoader l(buf, 4, 16, 5, torch::kCPU, 4, 1000, "train");
  for (const int64_t target : {5, 2, 2, 7, 0}) {
    l.seek(target);
    EXPECT_EQ(l.position(), target);
    for (int64_t i = target; i < std::min<int64_t>(target + 2, 8); ++i) {
      const Batch b = l.next();
      EXPECT_EQ(b.index, i);
      EXPECT_TRUE(torch::equal(b.inputs, first[i].inputs)) << "seek " << target << ", batch " << i;
      EXPECT_TRUE(torch::equal(b.targets, first[i].targets)) << "seek " << target << ", batch " << i;
    }
  }
  // Another seed gives other batches.
  BatchLoader other(buf, 4, 16, 6, torch::kCPU, 2, 1000, "train");
  EXPECT_FALSE(torch::equal(other.next().inputs, first[0].inputs));
}

TEST(Loader, FirstRowPartitionsOneGlobalBatch) {
  // Three ranks taking rows [0, 2), [2, 3), [3, 6) of a global batch of 6 see exactly the rows one
  // loader taking all six sees.
  const auto toks = counting_tokens(30000, 4096);
  const TokenBuffer buf = TokenBuffer::from_tokens(toks, "counting");
  BatchLoader whole(buf, 6, 12, 11, torch::kCPU, 2, 4096, "train");
  BatchLoader r0(buf, 2, 12, 11, torch::kCPU, 2, 4096, "train", 0);
  BatchLoader r1(buf, 1, 12, 11, torch::kCPU, 2, 4096, "train", 2);
  BatchLoader r2(buf, 3, 12, 11, torch::kCPU, 2, 4096, "train", 3);
  r1.seek(3);
  whole.seek(3);  // positions stay global batch indices
  r0.seek(3), r2.seek(3);
  for (int64_t i = 3; i < 7; ++i) {
    const Batch w = whole.next(), a = r0.next(), b = r1.next(), c = r2.next();
    EXPECT_EQ(a.index, i);
    EXPECT_EQ(c.index, i);
    EXPECT_TRUE(torch::equal(torch::cat({a.inputs, b.inputs, c.inputs}), w.inputs)) << i;
    EXPECT_TRUE(torch::equal(torch::cat({a.targets, b.targets, c.targets}), w.targets)) << i;
    EXPECT_FALSE(torch::equal(a.inputs[0], w.inputs[2])) << "rank 1's row is not rank 0's";
  }
}

TEST(Loader, EveryTokenIsCheckedAgainstTheVocabularyLimit) {
  // The limit itself is outside: a vocabulary of 256 holds 0 .. 255.
  const std::vector<uint16_t> top(300, 255), over(300, 256);
  BatchLoader ok(TokenBuffer::from_tokens(top, "top"), 2, 16, 1, torch::kCPU, 2, 256, "train");
  EXPECT_EQ(ok.next().inputs.max().item<int64_t>(), 255);
  BatchLoader bad(TokenBuffer::from_tokens(over, "over"), 2, 16, 1, torch::kCPU, 2, 256, "val");
  const std::string msg = error_of([&] { bad.next(); });
  EXPECT_NE(msg.find("token id 256 at position "), std::string::npos) << msg;
  EXPECT_NE(msg.find("of the val data"), std::string::npos) << msg;
  EXPECT_NE(msg.find("set model.vocab_size above it"), std::string::npos) << msg;
  // The last token of a window is a target only, and checked too: one bad token at the end.
  std::vector<uint16_t> last = counting_tokens(17, 256);
  last[16] = 999;
  BatchLoader tail(TokenBuffer::from_tokens(last, "tail"), 1, 16, 1, torch::kCPU, 2, 256, "train");
  const std::string tail_msg = error_of([&] { tail.next(); });
  EXPECT_NE(tail_msg.find("token id 999 at position 16"), std::string::npos) << tail_msg;
  // The error stays until a seek; the loader is not left waiting.
  EXPECT_NE(error_of([&] { tail.next(); }).find("token id 999"), std::string::npos);
  tail.seek(0);
  EXPECT_NE(error_of([&] { tail.next(); }).find("token id 999"), std::string::npos);
}

// Moved from tests/data/token_file_test.cpp.

TEST(Loader, SamplerIsDeterministicAndResumable) {
  auto toks = byte_tokenize(generate_corpus_text(20000, 1));
  TokenBuffer buf = TokenBuffer::from_tokens(toks, "test");
  BatchLoader a(buf, 4, 32, 99, torch::kCPU, 2, 256, "train");
  std::vector<torch::Tensor> first;
  for (int i = 0; i < 5; ++i) first.push_back(a.next().inputs);
  BatchLoader b(buf, 4, 32, 99, torch::kCPU, 3, 256, "train");
  b.seek(3);
  auto third = b.next();
  EXPECT_EQ(third.index, 3);
  EXPECT_TRUE(torch::equal(third.inputs, first[3]));
  EXPECT_FALSE(torch::equal(first[0], first[1]));
  // Targets are inputs shifted by one within the same window.
  a.seek(0);
  auto x = a.next();
  EXPECT_TRUE(torch::equal(x.inputs.narrow(1, 1, 31), x.targets.narrow(1, 0, 31)));
  // Windows stay inside the buffer.
  for (int64_t i = 0; i < 200; ++i)
    for (auto off : sample_offsets(5, i, 8, 32, 100)) EXPECT_LE(off + 32, 99);
}

TEST(Loader, TokenOutsideVocabularyIsAUserErrorOnNext) {
  std::vector<uint16_t> toks(1000, 3);
  toks[500] = 300;
  for (size_t i = 0; i < toks.size(); ++i)
    if (i != 500) toks[i] = 300;
  BatchLoader l(TokenBuffer::from_tokens(toks, "bad"), 2, 16, 1, torch::kCPU, 2, 256, "train");
  const std::string msg = error_of([&] { l.next(); });
  EXPECT_NE(msg.find("outside the model's vocabulary of 256"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tandem
