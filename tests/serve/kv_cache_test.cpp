// KV pages: a budget becomes whole pages (and a scratch page no sequence gets), a refusal leaves a page table as it
// was, and the free count comes back to the start after many sequences grown and released in random order.

#include "tandem/serve/kv_cache.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "../test_util.h"

namespace tandem {
namespace {

KvCacheShape shape() {
  KvCacheShape s;
  s.n_layer = 3, s.n_kv_head = 2, s.head_dim = 8, s.page_tokens = 4;
  return s;
}

TEST(ServeKvCache, TheBudgetBecomesWholePages) {
  const auto s = shape();
  EXPECT_EQ(s.token_bytes(), 3 * 2 * 2 * 8 * 4);
  KvCache cache(s, 10 * s.page_bytes() + s.page_bytes() - 1);
  EXPECT_EQ(cache.pages_total(), 10);
  EXPECT_EQ(cache.pages_free(), 10);
  EXPECT_EQ(cache.tokens_total(), 40);
  EXPECT_EQ(cache.keys(2).sizes(), (std::vector<int64_t>{11, 2, 4, 8}));  // and the scratch page
  EXPECT_EQ(cache.scratch_page(), 10);
  PageTable all;
  EXPECT_TRUE(cache.reserve(all, 40));
  EXPECT_EQ(std::set<int32_t>(all.pages.begin(), all.pages.end()).count(cache.scratch_page()), 0u);
  EXPECT_FALSE(cache.reserve(all, 41));  // the scratch page is not handed out
  cache.release(all);
  EXPECT_EQ(cache.pages_for(0), 0);
  EXPECT_EQ(cache.pages_for(4), 1);
  EXPECT_EQ(cache.pages_for(5), 2);
  EXPECT_NE(test::error_of([&] { KvCache(s, s.page_bytes() - 1); }).find("--kv-cache-gib"), std::string::npos);
  EXPECT_EQ(kv_cache_budget(1000, 0.5, 0), 500);
  EXPECT_EQ(kv_cache_budget(1000, 0.5, 300), 300);
}

TEST(ServeKvCache, OutOfPagesIsARefusalThatChangesNothing) {
  KvCache cache(shape(), 5 * shape().page_bytes());
  PageTable a, b;
  EXPECT_TRUE(cache.reserve(a, 9));  // 3 pages
  EXPECT_EQ(a.pages.size(), 3u);
  EXPECT_TRUE(cache.reserve(a, 12));  // still 3
  EXPECT_EQ(cache.pages_used(), 3);
  EXPECT_FALSE(cache.reserve(b, 12));  // 3 more do not fit
  EXPECT_TRUE(b.pages.empty());
  EXPECT_EQ(cache.pages_free(), 2);
  EXPECT_TRUE(cache.reserve(b, 8));
  EXPECT_FALSE(cache.reserve(a, 13));
  EXPECT_EQ(a.pages.size(), 3u);
  std::set<int32_t> distinct(a.pages.begin(), a.pages.end());
  distinct.insert(b.pages.begin(), b.pages.end());
  EXPECT_EQ(distinct.size(), 5u);
  cache.release(a);
  EXPECT_TRUE(a.pages.empty());
  EXPECT_EQ(cache.pages_free(), 3);
  EXPECT_TRUE(cache.reserve(a, 12));  // its 3 pages fit again
  EXPECT_FALSE(cache.reserve(a, 13));
  cache.release(a);
  cache.release(b);
  EXPECT_EQ(cache.pages_free(), 5);
}

TEST(ServeKvCache, ManySequencesAndCancellationsLeaveEveryPageFree) {
  KvCache cache(shape(), 64 * shape().page_bytes());
  std::mt19937 rng(5);
  std::vector<PageTable> live(20);
  std::vector<int64_t> tokens(20, 0);
  int refused = 0;
  for (int step = 0; step < 5000; ++step) {
    const size_t i = rng() % live.size();
    if (rng() % 7 == 0) {  // finished or cancelled
      cache.release(live[i]);
      tokens[i] = 0;
      continue;
    }
    const int64_t want = tokens[i] + 1 + rng() % 9;
    if (cache.reserve(live[i], want))
      tokens[i] = want;
    else
      ++refused;
    int64_t held = 0;
    for (const auto& t : live) held += static_cast<int64_t>(t.pages.size());
    ASSERT_EQ(held, cache.pages_used());
  }
  EXPECT_GT(refused, 0);  // the cache did run out
  for (auto& t : live) cache.release(t);
  EXPECT_EQ(cache.pages_free(), cache.pages_total());
}

}  // namespace
}  // namespace tandem
