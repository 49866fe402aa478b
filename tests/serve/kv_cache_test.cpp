// KV pages: a budget becomes whole pages (and a scratch page no sequence gets), a refusal leaves a page table as it
// was, and the free count comes back to the start after many sequences grown and released in random order.

#include "tandem/serve/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
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

// A cache made where another one stood (the same address) is still another cache.
TEST(ServeKvCache, EveryCacheHasItsOwnId) {
  const auto s = shape();
  std::optional<KvCache> cache;
  cache.emplace(s, 4 * s.page_bytes());
  const uint64_t first = cache->id();
  const void* where = &*cache;
  cache.reset();
  cache.emplace(s, 4 * s.page_bytes());
  EXPECT_EQ(&*cache, where);
  EXPECT_NE(cache->id(), first);
  EXPECT_NE(cache->id(), 0u);
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

// Note [Prefix cache]: a published page is found by its whole prefix only, held by every table that
// shares it until the last one lets go, then stays cached without taking capacity, and is handed
// out again, oldest first, only when no free page is left.
TEST(ServeKvCache, SharedPrefixPagesAreHeldCachedAndReusedOldestFirst) {
  KvCache cache(shape(), 6 * shape().page_bytes());  // 6 pages of 4 tokens
  const std::vector<TokenId> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  PageTable a;
  ASSERT_TRUE(cache.reserve(a, 10));    // 3 pages
  cache.publish_prefix(a, prompt, 10);  // the 2 full pages
  EXPECT_EQ(cache.pages_cached(), 2);

  PageTable b;  // the same first 8 tokens, then others
  std::vector<TokenId> other = {1, 2, 3, 4, 5, 6, 7, 8, 42, 43};
  EXPECT_EQ(cache.share_prefix(b, other, 9), 8);
  EXPECT_EQ(std::vector<int32_t>(b.pages.begin(), b.pages.end()),
            std::vector<int32_t>(a.pages.begin(), a.pages.begin() + 2));
  PageTable c;  // a different first page: nothing, even though the second page's tokens match
  EXPECT_EQ(cache.share_prefix(c, {9, 2, 3, 4, 5, 6, 7, 8, 1}, 9), 0);
  PageTable d;  // the last token's page is never shared: at most max_tokens, in whole pages
  EXPECT_EQ(cache.share_prefix(d, prompt, 7), 4);
  cache.release(d);

  const auto shared = b.pages;
  cache.release(a);  // b still holds the two shared pages; a's third page is free
  EXPECT_EQ(cache.pages_used(), 2);
  cache.release(b);  // cached, idle: counted free
  EXPECT_EQ(cache.pages_used(), 0);
  EXPECT_EQ(cache.pages_free(), 6);
  EXPECT_EQ(cache.pages_cached(), 2);

  PageTable e;  // 4 free pages first, the cached ones untouched
  ASSERT_TRUE(cache.reserve(e, 16));
  for (const int32_t p : e.pages) EXPECT_EQ(std::count(shared.begin(), shared.end(), p), 0);
  PageTable f;
  EXPECT_EQ(cache.share_prefix(f, prompt, 9), 8);  // still found
  cache.release(f);
  // No free page left: the oldest cached one is reused, and of one table's pages the last first, so
  // the prefix keeps its first page.
  ASSERT_TRUE(cache.reserve(e, 20));
  EXPECT_EQ(cache.pages_cached(), 1);
  EXPECT_EQ(e.pages.back(), shared[1]);
  PageTable g;
  EXPECT_EQ(cache.share_prefix(g, prompt, 9), 4);
  EXPECT_EQ(g.pages.front(), shared[0]);
  cache.release(g);
  cache.release(e);
  EXPECT_EQ(cache.pages_used(), 0);
  PageTable h;  // evicting the first page ends the whole prefix, though nothing else was reused
  ASSERT_TRUE(cache.reserve(h, 24));
  EXPECT_EQ(cache.pages_cached(), 0);
  PageTable i;
  EXPECT_EQ(cache.share_prefix(i, prompt, 9), 0);
  cache.release(h);
}

}  // namespace
}  // namespace tandem
