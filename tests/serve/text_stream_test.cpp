// Note [Streaming text]: pieces never split a character or show the start of a stop string that
// then completes, and joined they equal the decoded text up to the first stop string.
#include "tandem/serve/text_stream.h"

#include <gtest/gtest.h>

#include "tandem/data/byte_tokenizer.h"

namespace tandem {
namespace {

struct Run {
  std::vector<std::string> pieces;
  std::string text;
  bool stopped = false;
};

Run stream(const std::string& bytes, std::vector<std::string> stops) {
  ByteTokenizer tok;
  TextStream s(tok, std::move(stops));
  Run r;
  for (const unsigned char c : bytes) {
    r.pieces.push_back(s.push(c));
    r.text += r.pieces.back();
  }
  r.pieces.push_back(s.flush());
  r.text += r.pieces.back();
  r.stopped = s.stopped();
  return r;
}

TEST(TextStream, NeverSplitsACharacter) {
  const std::string text = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z";  // a é € 😀 z
  const auto r = stream(text, {});
  EXPECT_EQ(r.text, text);
  for (const auto& p : r.pieces) EXPECT_EQ(utf8_complete_length(p), p.size()) << p;
  EXPECT_EQ(r.pieces[1], "");  // the first byte of é waits for the second
  EXPECT_EQ(r.pieces[2], "\xc3\xa9");
  EXPECT_FALSE(r.stopped);
}

TEST(TextStream, CutsAtTheFirstStopStringAndHoldsBackItsStart) {
  const auto r = stream("one two END three", {"END", "two E?"});
  EXPECT_EQ(r.text, "one two ");
  EXPECT_TRUE(r.stopped);
  std::string shown;
  for (const auto& p : r.pieces) {
    shown += p;
    EXPECT_EQ(shown.find('E'), std::string::npos) << "the start of END was shown before it completed";
  }
}

TEST(TextStream, ShowsAHeldBackPrefixWhenItDoesNotComplete) {
  const auto r = stream("an EN and no end", {"END"});
  EXPECT_EQ(r.text, "an EN and no end");
  EXPECT_FALSE(r.stopped);
  const auto tail = stream("ends with EN", {"END"});
  EXPECT_EQ(tail.pieces.back(), "EN");                     // flushed at the end
  EXPECT_EQ(stream("\xe2\x82", {}).text, "\xef\xbf\xbd");  // an unfinished character becomes U+FFFD
}

TEST(TextStream, AStopStringAcrossACharacterBoundary) {
  const auto r = stream("x\xc3\xa9y\xc3\xa9z", {"y\xc3\xa9"});
  EXPECT_EQ(r.text, "x\xc3\xa9");
  EXPECT_TRUE(r.stopped);
}

}  // namespace
}  // namespace tandem
