// tokenizer.json's added tokens (data/added_tokens.h): what parse
// reads and its defaults, and split's order of raw and normalized matches with single_word, lstrip
// and rstrip on Unicode text.

#include "tandem/data/added_tokens.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../error_of.h"
#include "tandem/core/strings.h"

namespace tandem {
namespace {

using detail::AddedTokens;
using detail::NormalizeText;
using json = nlohmann::json;
using test::error_of;

// The text as it is.
const NormalizeText kAsIs = [](std::string_view text, std::string&) { return text; };

// Llama 2's legacy normalizer in small: every space becomes U+2581.
const NormalizeText kSpaces = [](std::string_view text, std::string& storage) {
  storage.clear();
  for (char c : text) storage += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
  return std::string_view(storage);
};

json token(TokenId id, const std::string& content, json options = json::object()) {
  options["id"] = id;
  options["content"] = content;
  return options;
}

// split()'s calls in order: text pieces as 'piece' (with ^ when it starts the text), tokens as #id.
std::vector<std::string> split_events(const AddedTokens& added, std::string_view text,
                                      const NormalizeText& normalize = kAsIs) {
  std::vector<std::string> out;
  added.split(
      text, normalize,
      [&](std::string_view piece, bool first) { out.push_back((first ? "^'" : "'") + std::string(piece) + "'"); },
      [&](TokenId id) { out.push_back("#" + std::to_string(id)); });
  return out;
}

using Events = std::vector<std::string>;

// Lower case, as a Lowercase normalizer does for ASCII.
const NormalizeText kLower = [](std::string_view text, std::string& storage) {
  storage = to_lower(std::string(text));
  return std::string_view(storage);
};

TEST(AddedTokens, ParseReadsEachTokenAndNormalizedDefaultsToNotSpecial) {
  const json list = json::array(
      {token(2, "</s>", {{"special", true}}), token(0, "<unk>", {{"special", true}, {"normalized", true}}),
       token(5, "user word"),
       token(1, "<s>",
             {{"special", true}, {"single_word", true}, {"lstrip", true}, {"rstrip", true}, {"normalized", false}})});
  const AddedTokens a = AddedTokens::parse(list, "t.json", kAsIs);
  ASSERT_EQ(a.tokens.size(), 4u);
  EXPECT_FALSE(a.tokens[0].normalized) << "special: normalized defaults to false";
  EXPECT_TRUE(a.tokens[1].normalized) << "as given";
  EXPECT_TRUE(a.tokens[2].normalized) << "not special: normalized defaults to true";
  EXPECT_FALSE(a.tokens[2].special);
  EXPECT_FALSE(a.tokens[2].single_word || a.tokens[2].lstrip || a.tokens[2].rstrip);
  EXPECT_TRUE(a.tokens[3].single_word && a.tokens[3].lstrip && a.tokens[3].rstrip);
  EXPECT_EQ(a.find("user word"), 5);
  EXPECT_EQ(a.find("</s>"), 2);
  EXPECT_FALSE(a.find("<pad>").has_value());
  EXPECT_FALSE(a.find("user").has_value());
  const auto special = a.special();
  ASSERT_EQ(special.size(), 3u);
  EXPECT_EQ(special[0].id, 0);  // by id, not in file order
  EXPECT_EQ(special[0].text, "<unk>");
  EXPECT_EQ(special[1].id, 1);
  EXPECT_EQ(special[2].id, 2);
  EXPECT_EQ(special[2].text, "</s>");
  EXPECT_FALSE(a.raw.empty());
  EXPECT_FALSE(a.normalized.empty());
}

TEST(AddedTokens, NullListHasNoTokensAndAMissingFieldIsNamed) {
  const AddedTokens none = AddedTokens::parse(json(), "t.json", kAsIs);
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_TRUE(none.raw.empty() && none.normalized.empty());
  EXPECT_EQ(split_events(none, "a b"), (Events{"^'a b'"}));
  const std::string no_id = error_of([] {
    AddedTokens::parse(json::array({json{{"content", "<s>"}}}), "m.json", kAsIs);
  });
  EXPECT_NE(no_id.find("m.json's added token has no \"id\""), std::string::npos) << no_id;
  const std::string no_content = error_of([] { AddedTokens::parse(json::array({json{{"id", 3}}}), "m.json", kAsIs); });
  EXPECT_NE(no_content.find("has no \"content\""), std::string::npos) << no_content;
}

TEST(AddedTokens, AnIdOutsideTheTokenRangeIsRefusedNamingTheToken) {
  for (const json& id : {json(-1), json(3000000000LL), json("7"), json(1.5)}) {
    const json list = json::array({token(0, "<x>"), json{{"id", id}, {"content", "<bad>"}}});
    const std::string err = error_of([&] { AddedTokens::parse(list, "m.json", kAsIs); });
    EXPECT_NE(err.find("m.json's added token '<bad>'"), std::string::npos) << id.dump() << ": " << err;
  }
}

TEST(AddedTokens, RawTokensMatchTheTextNormalizedOnesItsNormalizedForm) {
  // "<s>" is matched before normalizing; "a b" is stored and matched as "a▁b" after it.
  const json list = json::array({token(1, "<s>", {{"special", true}}), token(7, "a b")});
  const AddedTokens a = AddedTokens::parse(list, "t.json", kSpaces);
  const std::string sp = "\xE2\x96\x81";
  EXPECT_EQ(split_events(a, "x a b<s>a b", kSpaces), (Events{"^'x" + sp + "'", "#7", "#1", "#7"}));
  // A raw token is matched in the raw text, its space as written (the normalizer would change it).
  const AddedTokens spaced = AddedTokens::parse(json::array({token(3, "<s> ", {{"normalized", false}})}), "t", kSpaces);
  EXPECT_EQ(split_events(spaced, "<s> x", kSpaces), (Events{"#3", "'x'"}));
  // A normalized token matches any spelling that normalizes to its normalized form.
  const AddedTokens lower = AddedTokens::parse(json::array({token(4, "AB")}), "t.json", kLower);
  EXPECT_EQ(split_events(lower, "xAbx", kLower), (Events{"^'x'", "#4", "'x'"}));
  EXPECT_EQ(split_events(lower, "xAbx", kAsIs), (Events{"^'xAbx'"})) << "the text must be normalized alike";
}

TEST(AddedTokens, OnlyTheFirstPieceOfTheTextIsMarkedFirst) {
  const AddedTokens a = AddedTokens::parse(json::array({token(1, "<s>", {{"normalized", false}})}), "t", kAsIs);
  EXPECT_EQ(split_events(a, "<s>hi<s>"), (Events{"#1", "'hi'", "#1"}));
  EXPECT_EQ(split_events(a, "hi<s>yo"), (Events{"^'hi'", "#1", "'yo'"}));
  EXPECT_EQ(split_events(a, ""), (Events{}));
}

TEST(AddedTokens, SingleWordTokensNeedNoWordCharacterOnEitherSide) {
  const AddedTokens a =
      AddedTokens::parse(json::array({token(9, "dd", {{"single_word", true}, {"normalized", false}})}), "t", kAsIs);
  EXPECT_EQ(split_events(a, "dd"), (Events{"#9"}));
  EXPECT_EQ(split_events(a, "(dd)"), (Events{"^'('", "#9", "')'"}));
  EXPECT_EQ(split_events(a, "add"), (Events{"^'add'"}));
  EXPECT_EQ(split_events(a, "dd_"), (Events{"^'dd_'"})) << "connector punctuation is a word character";
  EXPECT_EQ(split_events(a,
                         "\xC3\xA9"
                         "dd"),
            (Events{"^'\xC3\xA9"
                    "dd'"}))
      << "é is a letter";
  EXPECT_EQ(split_events(a, "dd\xE4\xBD\xA0"), (Events{"^'dd\xE4\xBD\xA0'"})) << "你 is a letter";
  EXPECT_EQ(split_events(a, "3dd"), (Events{"^'3dd'"})) << "digits are word characters";
  EXPECT_EQ(split_events(a,
                         "\xE2\x80\x94"
                         "dd"),
            (Events{"^'\xE2\x80\x94'", "#9"}))
      << "an em dash is not";
  // A refused match does not hide a later one.
  EXPECT_EQ(split_events(a, "add dd"), (Events{"^'add '", "#9"}));
}

TEST(AddedTokens, LstripAndRstripTakeUnicodeWhitespaceButNotThePreviousToken) {
  const json list = json::array({token(1, "<l>", {{"lstrip", true}, {"normalized", false}}),
                                 token(2, "<r>", {{"rstrip", true}, {"normalized", false}}),
                                 token(3, "<b>", {{"lstrip", true}, {"rstrip", true}, {"normalized", false}})});
  const AddedTokens a = AddedTokens::parse(list, "t", kAsIs);
  const std::string ideographic_space = "\xE3\x80\x80";  // U+3000
  EXPECT_EQ(split_events(a, "x \t<l> y"), (Events{"^'x'", "#1", "' y'"}));
  EXPECT_EQ(split_events(a, "x <r> \n y"), (Events{"^'x '", "#2", "'y'"}));
  EXPECT_EQ(split_events(a, "x" + ideographic_space + "<b>" + ideographic_space + "y"), (Events{"^'x'", "#3", "'y'"}));
  EXPECT_EQ(split_events(a, "<r>  <l>z"), (Events{"#2", "#1", "'z'"})) << "<r> took the spaces first";
  EXPECT_EQ(split_events(a, "  <l>"), (Events{"#1"}));
  EXPECT_EQ(split_events(a, "<b>"), (Events{"#3"}));
}

}  // namespace
}  // namespace tandem
