// The prefix cache's index (serve/prefix_index.h): keys chained over the pages before them, a
// lookup that checks the page's tokens and parent besides the key, one page per key and one key
// per page, and forgetting a reused page.

#include "tandem/serve/prefix_index.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace tandem {
namespace {

using Ids = std::vector<TokenId>;

uint64_t key_of(uint64_t parent, const Ids& tokens) {
  return PrefixIndex::key(parent, tokens.data(), static_cast<int64_t>(tokens.size()));
}

TEST(ServePrefixIndex, AKeyNamesTheParentTheTokensAndTheirOrder) {
  const Ids page = {1, 2, 3, 4};
  EXPECT_EQ(key_of(0, page), key_of(0, Ids{1, 2, 3, 4}));  // a function of its inputs only
  std::set<uint64_t> keys = {key_of(0, page),
                             key_of(key_of(0, page), page),  // the same tokens after another page
                             key_of(0, Ids{2, 1, 3, 4}),     // two tokens swapped
                             key_of(0, Ids{1, 2, 3}),        // one token fewer
                             key_of(0, Ids{1, 2, 3, 5}),     // the last token differs
                             key_of(0, Ids{1, 2, 3, 4 + 256}),
                             key_of(0, Ids{1, 2, 3, -4}),
                             key_of(key_of(0, Ids{9}), page)};  // after another first page
  EXPECT_EQ(keys.size(), 8u) << "every change of parent or tokens changes the key";
  // Parents that differ in their low byte alone (the key once cancelled it).
  EXPECT_NE(key_of(0, page), key_of(7, page));
  EXPECT_NE(key_of(0x100, page), key_of(0x1ff, page));
  // 0 stands for "no parent", so no page is ever keyed 0, an empty page included.
  for (uint64_t parent : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}}) {
    EXPECT_NE(key_of(parent, {}), 0u);
    EXPECT_NE(key_of(parent, page), 0u);
  }
}

TEST(ServePrefixIndex, FindReturnsThePublishedPageOfExactlyThoseTokensAfterThatParent) {
  PrefixIndex index;
  const Ids first = {10, 11, 12, 13}, second = {14, 15, 16, 17};
  const uint64_t k1 = key_of(0, first), k2 = key_of(k1, second);
  EXPECT_EQ(index.find(k1, 0, first.data(), 4), -1);  // nothing published yet
  ASSERT_TRUE(index.publish(k1, 0, first.data(), 4, 5));
  ASSERT_TRUE(index.publish(k2, k1, second.data(), 4, 9));
  EXPECT_EQ(index.size(), 2);
  EXPECT_TRUE(index.published(5));
  EXPECT_TRUE(index.published(9));
  EXPECT_FALSE(index.published(6));
  EXPECT_EQ(index.find(k1, 0, first.data(), 4), 5);
  EXPECT_EQ(index.find(k2, k1, second.data(), 4), 9);
  // The right key with other tokens, another parent or another length is a collision, not a hit.
  const Ids other = {10, 11, 12, 99};
  EXPECT_EQ(index.find(k1, 0, other.data(), 4), -1);
  EXPECT_EQ(index.find(k2, 0, second.data(), 4), -1);
  EXPECT_EQ(index.find(k1, 0, first.data(), 3), -1);
  EXPECT_EQ(index.find(k1 ^ 1, 0, first.data(), 4), -1);
}

TEST(ServePrefixIndex, AKeyHoldsOnePageAndAPageOneKey) {
  PrefixIndex index;
  const Ids a = {1, 2}, b = {3, 4};
  const uint64_t ka = key_of(0, a), kb = key_of(0, b);
  ASSERT_TRUE(index.publish(ka, 0, a.data(), 2, 0));
  // The same prefix computed into another page stays that sequence's private page.
  EXPECT_FALSE(index.publish(ka, 0, a.data(), 2, 1));
  EXPECT_FALSE(index.published(1));
  EXPECT_EQ(index.find(ka, 0, a.data(), 2), 0);
  // A page already published is not published again under another key.
  EXPECT_FALSE(index.publish(kb, 0, b.data(), 2, 0));
  EXPECT_EQ(index.find(kb, 0, b.data(), 2), -1);
  EXPECT_EQ(index.size(), 1);
}

TEST(ServePrefixIndex, ForgettingAPageFreesItsKeyAndLeavesTheOthers) {
  PrefixIndex index;
  const Ids a = {1, 2, 3}, b = {4, 5, 6};
  const uint64_t ka = key_of(0, a), kb = key_of(ka, b);
  ASSERT_TRUE(index.publish(ka, 0, a.data(), 3, 2));
  ASSERT_TRUE(index.publish(kb, ka, b.data(), 3, 3));
  index.forget(2);
  EXPECT_FALSE(index.published(2));
  EXPECT_EQ(index.size(), 1);
  EXPECT_EQ(index.find(ka, 0, a.data(), 3), -1);
  EXPECT_EQ(index.find(kb, ka, b.data(), 3), 3);  // a child entry is the caller's to forget
  index.forget(2);                                // forgetting twice, or a page never published: nothing
  index.forget(40);
  EXPECT_EQ(index.size(), 1);
  // The key and the page are both free again: the prefix may be published into another page, and
  // the page under another prefix.
  EXPECT_TRUE(index.publish(ka, 0, a.data(), 3, 7));
  EXPECT_EQ(index.find(ka, 0, a.data(), 3), 7);
  const Ids c = {8, 9, 10};
  EXPECT_TRUE(index.publish(key_of(0, c), 0, c.data(), 3, 2));
  EXPECT_EQ(index.find(key_of(0, c), 0, c.data(), 3), 2);
  EXPECT_EQ(index.size(), 3);
}

}  // namespace
}  // namespace tandem
