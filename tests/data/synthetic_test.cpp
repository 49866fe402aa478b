// The embedded default corpus (data/synthetic.h): exactly the bytes asked for, a shorter corpus the
// prefix of a longer one of the same seed, and every line one of the three learnable shapes with
// its structure right (the subject repeated, counting by one, sums that add up).

#include "tandem/data/synthetic.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace tandem {
namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The words before a clause's verb (the verbs are the grammar's ten).
std::string subject_of(const std::string& clause) {
  static const std::vector<std::string> verbs = {"sees",  "likes",   "builds", "paints", "carries",
                                                 "finds", "follows", "cleans", "opens",  "watches"};
  std::istringstream words(clause);
  std::string subject;
  for (std::string w; words >> w;) {
    for (const auto& v : verbs)
      if (w == v) return subject;
    subject += (subject.empty() ? "" : " ") + w;
  }
  return "";  // no verb
}

TEST(Synthetic, ExactlyTheBytesAskedForAndShorterIsAPrefix) {
  EXPECT_EQ(generate_corpus_text(0, 1), "");
  EXPECT_EQ(generate_corpus_text(1, 1).size(), 1u);
  const std::string longer = generate_corpus_text(20000, 9);
  EXPECT_EQ(longer.size(), 20000u);
  for (int64_t n : {1, 7, 17, 1000, 19999}) {
    const std::string shorter = generate_corpus_text(n, 9);
    ASSERT_EQ(shorter.size(), static_cast<size_t>(n));
    EXPECT_EQ(longer.compare(0, shorter.size(), shorter), 0) << n << " bytes are not the start of 20000";
  }
  // Another seed, another text; printable ASCII and line breaks only (a byte model's easy case).
  EXPECT_NE(generate_corpus_text(2000, 10), generate_corpus_text(2000, 9));
  for (char c : longer) EXPECT_TRUE(c == '\n' || (c >= ' ' && c <= '~')) << int(static_cast<unsigned char>(c));
}

TEST(Synthetic, EveryLineIsASentencePairACountOrASum) {
  const std::string text = generate_corpus_text(40000, 20240520);
  std::vector<std::string> lines = lines_of(text);
  ASSERT_GT(lines.size(), 100u);
  lines.pop_back();  // the last line is cut at the byte limit
  const std::vector<std::string> digits = {"zero", "one", "two",   "three", "four",
                                           "five", "six", "seven", "eight", "nine"};
  int sentences = 0, counts = 0, sums = 0;
  for (const std::string& line : lines) {
    SCOPED_TRACE(line);
    if (line.rfind("count:", 0) == 0) {
      // "count: d d+1 d+2 d+3 d+4." in words, starting at most at five.
      std::istringstream words(line.substr(6));
      std::vector<std::string> got;
      for (std::string w; words >> w;) got.push_back(w);
      ASSERT_EQ(got.size(), 5u);
      ASSERT_EQ(got.back().back(), '.');
      got.back().pop_back();
      size_t start = 0;
      while (start < digits.size() && digits[start] != got[0]) ++start;
      ASSERT_LE(start, 5u);
      for (size_t i = 0; i < 5; ++i) EXPECT_EQ(got[i], digits[start + i]);
      ++counts;
    } else if (line.find(" + ") != std::string::npos) {
      // "a + b = a+b", single digits.
      int a = -1, b = -1, sum = -1;
      char plus = 0, eq = 0;
      std::istringstream in(line);
      in >> a >> plus >> b >> eq >> sum;
      ASSERT_TRUE(in && plus == '+' && eq == '=');
      EXPECT_TRUE(a >= 0 && a <= 9 && b >= 0 && b <= 9);
      EXPECT_EQ(sum, a + b);
      EXPECT_EQ(line, std::to_string(a) + " + " + std::to_string(b) + " = " + std::to_string(a + b));
      ++sums;
    } else {
      // "<subject> <verb> <object>[ <place>]. then <subject> <verb> <object>." with one subject.
      const size_t then = line.find(". then ");
      ASSERT_NE(then, std::string::npos);
      ASSERT_EQ(line.back(), '.');
      const std::string first = subject_of(line.substr(0, then)), second = subject_of(line.substr(then + 7));
      EXPECT_FALSE(first.empty());
      EXPECT_EQ(first, second);
      ++sentences;
    }
  }
  // The mixture is 6 : 2 : 2 by construction; each shape is common.
  const double n = double(lines.size());
  EXPECT_GT(sentences / n, 0.45);
  EXPECT_GT(counts / n, 0.1);
  EXPECT_GT(sums / n, 0.1);
}

}  // namespace
}  // namespace tandem
