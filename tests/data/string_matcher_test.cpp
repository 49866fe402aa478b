// The leftmost-longest matcher of added tokens and user-defined pieces (data/string_matcher.h).

#include "tandem/data/string_matcher.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(StringMatcher, FindsTheLeftmostThenTheLongest) {
  StringMatcher m;
  EXPECT_TRUE(m.empty());
  m.add("", 9);  // ignored
  EXPECT_TRUE(m.empty());
  m.add("ab", 0);
  m.add("abc", 1);
  m.add("bcd", 2);
  m.add("a", 3);
  EXPECT_FALSE(m.empty());
  auto found = m.find("xabcd", 0);
  ASSERT_TRUE(found.has_value());
  // "bcd" is longer but starts later; at position 1 the longest is "abc".
  EXPECT_EQ(found->start, 1u);
  EXPECT_EQ(found->end, 4u);
  EXPECT_EQ(found->token, 1);
  // "ab" then an 'x': the walk ends past "ab" and keeps the longest full match it passed.
  found = m.find("abx", 0);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->end, 2u);
  EXPECT_EQ(found->token, 0);
  found = m.find("axb", 0);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->token, 3);
  found = m.find("abcd", 1);  // from the 'b'
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->start, 1u);
  EXPECT_EQ(found->token, 2);
  EXPECT_FALSE(m.find("abcd", 4).has_value());
  EXPECT_FALSE(m.find("xyz", 0).has_value());
  EXPECT_FALSE(m.find("b", 0).has_value()) << "a prefix of a pattern is no match";
}

TEST(StringMatcher, KeepsTheFirstTokenOfARepeatedPattern) {
  StringMatcher m;
  m.add("<s>", 4);
  m.add("<s>", 7);
  const auto found = m.find("a<s>", 0);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->token, 4);
}

}  // namespace
}  // namespace tandem
