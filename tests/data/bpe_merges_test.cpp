// BPE merges (data/bpe_merges.h): the pair of lowest rank first, the leftmost on a tie, until none
// applies; both file forms of a merge; a merge of unknown tokens named.

#include "tandem/data/bpe_merges.h"

#include <gtest/gtest.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "../error_of.h"

namespace tandem::detail {
namespace {

const std::unordered_map<std::string, TokenId> kVocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3},
                                                         {"bc", 4}, {"abc", 5}, {"aa", 6}};

std::vector<TokenId> merged(const char* merges_json, const std::vector<TokenId>& ids) {
  const MergeTable table = MergeTable::parse(json::parse(merges_json), kVocab, "test.json");
  MergeScratch scratch;
  std::vector<TokenId> out;
  merge_symbols(table, ids, scratch, out);
  return out;
}

TEST(BpeMerges, LowestRankFirstThenLeftmost) {
  // "b c" ranks before "a b": a|b|c -> a|bc, and no rule joins a and bc.
  EXPECT_EQ(merged(R"({"merges": ["b c", "a b", "ab c"]})", {0, 1, 2}), (std::vector<TokenId>{0, 4}));
  // "a b" first: ab|c, then "ab c" -> abc.
  EXPECT_EQ(merged(R"({"merges": ["a b", "b c", "ab c"]})", {0, 1, 2}), (std::vector<TokenId>{5}));
  // a|a|a: the leftmost pair merges, the last a stays.
  EXPECT_EQ(merged(R"({"merges": [["a", "a"]]})", {0, 0, 0}), (std::vector<TokenId>{6, 0}));
  EXPECT_EQ(merged(R"({"merges": []})", {2, 1}), (std::vector<TokenId>{2, 1}));
}

TEST(BpeMerges, AMergeOfUnknownTokensIsNamed) {
  const std::string msg = test::error_of([] { MergeTable::parse(json::parse(R"({"merges": ["a z"]})"), kVocab, "m.json"); });
  EXPECT_NE(msg.find("m.json"), std::string::npos) << msg;
}

TEST(BpeMerges, TheWordCacheGivesBackWhatWasPut) {
  WordCache cache;
  std::vector<TokenId> out;
  EXPECT_FALSE(cache.lookup("abc", out));
  const TokenId ids[] = {5};
  cache.insert("abc", ids, 1);
  ASSERT_TRUE(cache.lookup("abc", out));
  EXPECT_EQ(out, (std::vector<TokenId>{5}));
}

}  // namespace
}  // namespace tandem::detail
