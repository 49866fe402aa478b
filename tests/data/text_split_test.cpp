// The Split pre-tokenizer step (data/text_split.h): the five split behaviours and invert on the
// `tokenizers` docs' example, byte offsets of ICU matches in UTF-8, literal matching, and what
// parse_split and compile_regex refuse.

#include "tandem/data/text_split.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../error_of.h"

namespace tandem {
namespace {

using detail::ByteRange;
using detail::SplitBehavior;
using detail::SplitStep;
using json = nlohmann::json;
using test::error_of;
using Pieces = std::vector<std::string>;

SplitStep literal_step(const std::string& literal, SplitBehavior behavior, bool invert = false) {
  SplitStep s;
  s.literal = literal;
  s.behavior = behavior;
  s.invert = invert;
  return s;
}

SplitStep regex_step(const std::string& pattern, SplitBehavior behavior, bool invert = false) {
  SplitStep s;
  s.regex = detail::compile_regex(pattern, "test.json");
  s.behavior = behavior;
  s.invert = invert;
  return s;
}

// The text of each piece `step` cuts `text` into.
Pieces pieces(const std::string& text, const SplitStep& step) {
  const auto matcher = detail::new_matcher(step.regex.get());
  Pieces out;
  for (const auto& [a, b] : detail::split_pieces(text, step, matcher.get())) out.push_back(text.substr(a, b - a));
  return out;
}

TEST(TextSplit, EachBehaviourOnTheDocumentedExample) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(pieces(text, literal_step("-", SplitBehavior::kRemoved)), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(pieces(text, literal_step("-", SplitBehavior::kIsolated)),
            (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pieces(text, literal_step("-", SplitBehavior::kMergedWithPrevious)),
            (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pieces(text, literal_step("-", SplitBehavior::kMergedWithNext)),
            (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pieces(text, literal_step("-", SplitBehavior::kContiguous)),
            (Pieces{"the", "-", "final", "--", "countdown"}));
}

TEST(TextSplit, MatchesAtTheEdgesOfTheText) {
  const std::string text = "-a-";
  EXPECT_EQ(pieces(text, literal_step("-", SplitBehavior::kRemoved)), (Pieces{"a"}));
  EXPECT_EQ(pieces(text, literal_step("-", SplitBehavior::kIsolated)), (Pieces{"-", "a", "-"}));
  EXPECT_EQ(pieces(text, literal_step("-", SplitBehavior::kMergedWithPrevious)), (Pieces{"-", "a-"}));
  EXPECT_EQ(pieces(text, literal_step("-", SplitBehavior::kMergedWithNext)), (Pieces{"-a", "-"}));
  EXPECT_EQ(pieces("--", literal_step("-", SplitBehavior::kContiguous)), (Pieces{"--"}));
  EXPECT_EQ(pieces("--", literal_step("-", SplitBehavior::kRemoved)), (Pieces{}));
}

TEST(TextSplit, NoMatchLeavesOnePieceAndAnEmptyTextNone) {
  for (auto behavior : {SplitBehavior::kRemoved, SplitBehavior::kIsolated, SplitBehavior::kMergedWithPrevious,
                        SplitBehavior::kMergedWithNext, SplitBehavior::kContiguous}) {
    EXPECT_EQ(pieces("abc", literal_step("-", behavior)), (Pieces{"abc"}));
    EXPECT_EQ(pieces("", literal_step("-", behavior)), (Pieces{}));
    EXPECT_EQ(pieces("a-b", literal_step("", behavior)), (Pieces{"a-b"})) << "an empty literal matches nothing";
  }
}

TEST(TextSplit, InvertSwapsWhatCountsAsTheMatch) {
  // The non-space runs become the matches: Removed keeps the spaces, MergedWithPrevious ends each
  // piece with a word.
  const std::string text = "ab  cd e";
  EXPECT_EQ(pieces(text, regex_step("\\s+", SplitBehavior::kRemoved, true)), (Pieces{"  ", " "}));
  EXPECT_EQ(pieces(text, regex_step("\\s+", SplitBehavior::kRemoved, false)), (Pieces{"ab", "cd", "e"}));
  EXPECT_EQ(pieces(text, regex_step("\\s+", SplitBehavior::kMergedWithPrevious, true)), (Pieces{"ab", "  cd", " e"}));
  EXPECT_EQ(pieces(text, regex_step("\\s+", SplitBehavior::kMergedWithNext, true)), (Pieces{"ab  ", "cd ", "e"}));
  EXPECT_EQ(pieces(text, regex_step("\\s+", SplitBehavior::kIsolated, true)), (Pieces{"ab", "  ", "cd", " ", "e"}));
  // Contiguous merges adjacent spans of one kind: after an invert the adjacent matches are
  // non-matches, and they merge too (as tokenizers' Split gives "a", "--", "b").
  EXPECT_EQ(pieces("a--b", literal_step("-", SplitBehavior::kContiguous, true)), (Pieces{"a", "--", "b"}));
  EXPECT_EQ(pieces("--a-", literal_step("-", SplitBehavior::kContiguous, true)), (Pieces{"--", "a", "-"}));
  EXPECT_EQ(pieces(text, regex_step("\\s+", SplitBehavior::kContiguous, true)), (Pieces{"ab", "  ", "cd", " ", "e"}));
}

TEST(TextSplit, RegexMatchesAreByteOffsetsIntoUtf8) {
  const auto re = detail::compile_regex("\\p{L}+", "test.json");
  const auto m = detail::new_matcher(re.get());
  // "héllo wörld": é and ö are two bytes each.
  EXPECT_EQ(detail::find_matches("h\xC3\xA9llo w\xC3\xB6rld", m.get(), ""), (std::vector<ByteRange>{{0, 6}, {7, 13}}));
  // The same matcher on another text: nothing of the first one's state is left.
  EXPECT_EQ(detail::find_matches("\xE4\xBD\xA0\xE5\xA5\xBD, ok", m.get(), ""),
            (std::vector<ByteRange>{{0, 6}, {8, 10}}));
  EXPECT_EQ(detail::find_matches("123", m.get(), ""), (std::vector<ByteRange>{}));
  EXPECT_EQ(pieces("h\xC3\xA9llo w\xC3\xB6rld", regex_step("\\p{L}+", SplitBehavior::kIsolated)),
            (Pieces{"h\xC3\xA9llo", " ", "w\xC3\xB6rld"}));
}

TEST(TextSplit, LiteralMatchesDoNotOverlap) {
  EXPECT_EQ(detail::find_matches("aaaa", nullptr, "aa"), (std::vector<ByteRange>{{0, 2}, {2, 4}}));
  EXPECT_EQ(detail::find_matches("aaa", nullptr, "aa"), (std::vector<ByteRange>{{0, 2}}));
  EXPECT_EQ(detail::find_matches("x\xE2\x96\x81y\xE2\x96\x81", nullptr, "\xE2\x96\x81"),
            (std::vector<ByteRange>{{1, 4}, {5, 8}}));
  EXPECT_EQ(detail::find_matches("abc", nullptr, ""), (std::vector<ByteRange>{}));
  EXPECT_FALSE(detail::new_matcher(nullptr)) << "no regex, no matcher";
}

TEST(TextSplit, ARegexIcuCannotCompileNamesTheFileAndPattern) {
  const std::string msg = error_of([] { detail::compile_regex("(unclosed", "model/tokenizer.json"); });
  EXPECT_NE(msg.find("model/tokenizer.json: the regex '(unclosed' does not compile with ICU ("), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("at offset"), std::string::npos) << msg;
  EXPECT_TRUE(detail::compile_regex("(?i:'s|'t)|\\p{N}{1,3}", "t.json"));
}

TEST(TextSplit, ParseSplitReadsPatternBehaviourAndInvert) {
  const SplitStep by_regex = detail::parse_split(
      {{"type", "Split"}, {"pattern", {{"Regex", "\\d+"}}}, {"behavior", "MergedWithNext"}, {"invert", true}},
      "t.json");
  ASSERT_TRUE(by_regex.regex);
  EXPECT_EQ(by_regex.literal, "");
  EXPECT_EQ(by_regex.behavior, SplitBehavior::kMergedWithNext);
  EXPECT_TRUE(by_regex.invert);
  EXPECT_EQ(pieces("ab12cd", by_regex), (Pieces{"ab12", "cd"}));  // inverted: the letters are the matches

  const SplitStep by_string =
      detail::parse_split({{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Removed"}}, "t.json");
  EXPECT_FALSE(by_string.regex);
  EXPECT_EQ(by_string.literal, " ");
  EXPECT_FALSE(by_string.invert) << "invert defaults to false";
  EXPECT_EQ(pieces("a b  c", by_string), (Pieces{"a", "b", "c"}));

  const std::pair<const char*, SplitBehavior> names[] = {{"Removed", SplitBehavior::kRemoved},
                                                         {"Isolated", SplitBehavior::kIsolated},
                                                         {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
                                                         {"MergedWithNext", SplitBehavior::kMergedWithNext},
                                                         {"Contiguous", SplitBehavior::kContiguous}};
  for (const auto& [name, behavior] : names)
    EXPECT_EQ(detail::parse_split({{"pattern", {{"String", "-"}}}, {"behavior", name}}, "t.json").behavior, behavior)
        << name;
}

TEST(TextSplit, ParseSplitRefusesWhatItCannotRead) {
  const std::string unknown = error_of([] {
    detail::parse_split({{"pattern", {{"String", "-"}}}, {"behavior", "Merged"}}, "t.json");
  });
  EXPECT_NE(unknown.find("t.json: Split behavior 'Merged' is unknown (Removed, Isolated, MergedWithPrevious, "
                         "MergedWithNext, Contiguous)"),
            std::string::npos)
      << unknown;
  EXPECT_NE(error_of([] {
              detail::parse_split({{"pattern", {{"String", "-"}}}, {"behavior", "isolated"}}, "t.json");
            }).find("'isolated' is unknown"),
            std::string::npos)
      << "names are case-sensitive, as in tokenizer.json";
  EXPECT_NE(error_of([] {
              detail::parse_split({{"behavior", "Isolated"}}, "t.json");
            }).find("t.json's Split pre-tokenizer has no \"pattern\""),
            std::string::npos);
  EXPECT_NE(error_of([] {
              detail::parse_split({{"pattern", {{"Glob", "*"}}}, {"behavior", "Isolated"}}, "t.json");
            }).find("t.json's Split pattern has no \"String\""),
            std::string::npos);
  EXPECT_NE(error_of([] {
              detail::parse_split({{"pattern", {{"String", "-"}}}}, "t.json");
            }).find("t.json's Split has no \"behavior\""),
            std::string::npos);
  EXPECT_NE(error_of([] {
              detail::parse_split({{"pattern", {{"Regex", "[a-"}}}, {"behavior", "Isolated"}}, "t.json");
            }).find("does not compile with ICU"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem
