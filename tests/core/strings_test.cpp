// core/strings.h: the edit distance behind "did you mean", the closest-key rule (dotted suffixes,
// the distance limit, ties), and the small formatting and splitting helpers messages are built from.

#include "tandem/core/strings.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem {
namespace {

using Parts = std::vector<std::string>;

TEST(Strings, EditDistanceCountsInsertionsDeletionsSubstitutionsAndAdjacentSwaps) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("abc", ""), 3u);
  EXPECT_EQ(edit_distance("same", "same"), 0u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(edit_distance("ab", "ba"), 1u) << "an adjacent swap is one edit";
  EXPECT_EQ(edit_distance("stpes", "steps"), 1u);
  EXPECT_EQ(edit_distance("abcd", "acbd"), 1u);
  // Optimal string alignment: a swapped pair is not edited again, so "ca" -> "abc" takes 3, not 2.
  EXPECT_EQ(edit_distance("ca", "abc"), 3u);
  EXPECT_EQ(edit_distance("flaw", "lawn"), 2u);
  EXPECT_EQ(edit_distance("lawn", "flaw"), 2u);
}

TEST(Strings, ClosestMatchComparesTheLastDottedPartAtOneEditMore) {
  // "steps" is 0 edits from train.steps' last part, counted as 1: a tie with "stops", which comes first.
  EXPECT_EQ(closest_match("steps", {"stops", "train.steps"}), "stops");
  EXPECT_EQ(closest_match("steps", {"train.steps", "stops"}), "train.steps");
  EXPECT_EQ(closest_match("steps", {"train.steps"}), "train.steps");
  EXPECT_EQ(closest_match("lr", {"train.seed", "optim.lr"}), "optim.lr");
  // A word that has a dot of its own is compared whole: 5 edits from "train.steps", over the limit of 3.
  EXPECT_EQ(closest_match("x.steps", {"train.steps"}), "");
}

TEST(Strings, ClosestMatchTakesTheFirstOfEquallyCloseCandidates) {
  EXPECT_EQ(closest_match("cat", {"bat", "cut"}), "bat");
  EXPECT_EQ(closest_match("cat", {"cut", "bat"}), "cut");
  EXPECT_EQ(closest_match("cat", {"dog", "cast", "bat"}), "cast");
  EXPECT_EQ(closest_match("cat", {}), "");
}

TEST(Strings, ClosestMatchAcceptsUpToHalfTheWordAndAtLeastThreeEdits) {
  // 10 letters: up to 5 edits.
  EXPECT_EQ(closest_match("abcdefghij", {"abcdevwxyz"}), "abcdevwxyz");  // 5 substitutions
  EXPECT_EQ(closest_match("abcdefghij", {"abcduvwxyz"}), "");            // 6
  // Short words: 3 edits.
  EXPECT_EQ(closest_match("ab", {"abxyz"}), "abxyz");  // 3 insertions
  EXPECT_EQ(closest_match("ab", {"wxyz"}), "");        // 4 edits
}

TEST(Strings, DidYouMeanNamesTheCandidateOrSaysNothing) {
  EXPECT_EQ(did_you_mean("trian.steps", {"train.steps", "train.seed"}), ", did you mean 'train.steps'?");
  EXPECT_EQ(did_you_mean("zzzzzzzzzzzz", {"train.steps"}), "");
  EXPECT_EQ(did_you_mean("anything", {}), "");
}

TEST(Strings, JoinPutsTheSeparatorOnlyBetweenParts) {
  EXPECT_EQ(join({}, ", "), "");
  EXPECT_EQ(join({"a"}, ", "), "a");
  EXPECT_EQ(join({"a", "", "b"}, ", "), "a, , b");
  EXPECT_EQ(join({"x", "y"}, ""), "xy");
}

TEST(Strings, FormatBytesUsesBinaryUnitsUpToTebibytes) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3.0 * 1024 * 1024), "3.00 MiB");
  EXPECT_EQ(format_bytes(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
  EXPECT_EQ(format_bytes(1024.0 * 1024 * 1024 * 1024), "1.00 TiB");
  EXPECT_EQ(format_bytes(1024.0 * 1024 * 1024 * 1024 * 1024), "1024.00 TiB") << "no unit past TiB";
}

TEST(Strings, FormatCountStepsAtEachThousand) {
  EXPECT_EQ(format_count(0), "0");
  EXPECT_EQ(format_count(999), "999");
  EXPECT_EQ(format_count(1000), "1.0 K");
  EXPECT_EQ(format_count(125.0e6), "125.0 M");
  EXPECT_EQ(format_count(1.26e9), "1.26 B");
  EXPECT_EQ(format_count(3e12), "3.00 T");
}

TEST(Strings, StrprintfFormatsOutputOfAnyLength) {
  EXPECT_EQ(strprintf("%d-%s", 7, "x"), "7-x");
  EXPECT_EQ(strprintf("%5.2f|", 3.14159), " 3.14|");
  EXPECT_EQ(strprintf("%s", ""), "");
  const std::string long_text(5000, 'q');
  const std::string out = strprintf("<%s>", long_text.c_str());
  ASSERT_EQ(out.size(), 5002u);
  EXPECT_EQ(out, "<" + long_text + ">");
}

TEST(Strings, ToLowerChangesAsciiLettersOnly) {
  EXPECT_EQ(to_lower("MiXeD 123_Z"), "mixed 123_z");
  EXPECT_EQ(to_lower("\xC3\x84"
                     "B"),
            "\xC3\x84"
            "b")
      << "UTF-8 bytes stay as they are";
  EXPECT_EQ(to_lower(""), "");
}

TEST(Strings, OneLineJoinsLinesAndCutsLibTorchFrames) {
  EXPECT_EQ(one_line("first\nsecond\r\nthird"), "first second  third");
  EXPECT_EQ(one_line("  padded \n"), "padded");
  EXPECT_EQ(one_line("shape mismatch\nException raised from check at x.cpp:1 (most recent call first):\nframe #0"),
            "shape mismatch");
  // A message that is nothing but frames keeps them, on one line.
  EXPECT_EQ(one_line("Exception raised from f\nframe #0"), "Exception raised from f frame #0");
  EXPECT_EQ(one_line(""), "");
}

TEST(Strings, TrimRemovesSpacesAndTabsOnly) {
  EXPECT_EQ(trim(" \ta b\t "), "a b");
  EXPECT_EQ(trim("   "), "");
  EXPECT_EQ(trim(""), "");
  EXPECT_EQ(trim("x"), "x");
  EXPECT_EQ(trim("\nx\n"), "\nx\n") << "line breaks are not trimmed";
}

TEST(Strings, SplitKeepsEmptyParts) {
  EXPECT_EQ(split("a,,b", ','), (Parts{"a", "", "b"}));
  EXPECT_EQ(split("", ','), (Parts{""}));
  EXPECT_EQ(split(",", ','), (Parts{"", ""}));
  EXPECT_EQ(split("a,b,", ','), (Parts{"a", "b", ""}));
  EXPECT_EQ(split("a b", ','), (Parts{"a b"}));
  EXPECT_EQ(split("1:2", ':'), (Parts{"1", "2"}));
}

}  // namespace
}  // namespace tandem
