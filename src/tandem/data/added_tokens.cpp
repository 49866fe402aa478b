#include "tandem/data/added_tokens.h"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <algorithm>

namespace tandem::detail {

namespace {

UChar32 char_before(std::string_view s, size_t end, size_t* start = nullptr) {
  auto i = static_cast<int32_t>(end);
  UChar32 c;
  U8_PREV(reinterpret_cast<const uint8_t*>(s.data()), 0, i, c);
  if (start) *start = static_cast<size_t>(i);
  return c;
}

UChar32 char_at(std::string_view s, size_t begin, size_t* end = nullptr) {
  auto i = static_cast<int32_t>(begin);
  UChar32 c;
  U8_NEXT(reinterpret_cast<const uint8_t*>(s.data()), i, static_cast<int32_t>(s.size()), c);
  if (end) *end = static_cast<size_t>(i);
  return c;
}

// A regex \w character (Unicode): alphabetic, mark, decimal digit, connector punctuation, joiner.
bool is_word_char(UChar32 c) {
  if (c < 0) return false;
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || (U_GET_GC_MASK(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) ||
         u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL);
}

// The start of the run of White_Space characters that ends at `end`.
size_t whitespace_start_before(std::string_view s, size_t end) {
  while (end > 0) {
    size_t start;
    if (!u_isUWhiteSpace(char_before(s, end, &start))) break;
    end = start;
  }
  return end;
}

// The end of the run of White_Space characters that starts at `begin`.
size_t whitespace_end_after(std::string_view s, size_t begin) {
  while (begin < s.size()) {
    size_t next;
    if (!u_isUWhiteSpace(char_at(s, begin, &next))) break;
    begin = next;
  }
  return begin;
}

// Cuts `text` at the matches of `matcher`: on_text for the text between them (and where it starts),
// on_token for each match (single_word, lstrip and rstrip applied as `tokenizers` does).
void split_added(std::string_view text, const StringMatcher& matcher, const std::vector<AddedToken>& tokens,
                 const std::function<void(std::string_view, size_t)>& on_text,
                 const std::function<void(TokenId)>& on_token) {
  size_t done = 0, pos = 0;
  while (auto match = matcher.find(text, pos)) {
    const AddedToken& token = tokens[match->token];
    size_t start = match->start, stop = match->end;
    pos = stop;
    if (token.single_word) {
      const bool free_left = start == 0 || !is_word_char(char_before(text, start));
      const bool free_right = stop == text.size() || !is_word_char(char_at(text, stop));
      if (!free_left || !free_right) continue;
    }
    if (token.lstrip) start = std::max(whitespace_start_before(text, start), done);
    if (token.rstrip) stop = pos = whitespace_end_after(text, stop);
    if (done < start) on_text(text.substr(done, start - done), done);
    on_token(token.id);
    done = stop;
  }
  if (done < text.size()) on_text(text.substr(done), done);
}

}  // namespace

AddedTokens AddedTokens::parse(const json& list, const std::string& source, const NormalizeText& normalize) {
  AddedTokens out;
  if (list.is_null()) return out;
  for (const auto& t : list) {
    AddedToken a;
    a.content = member(t, "content", source + "'s added token").get<std::string>();
    a.id = token_id(member(t, "id", source + "'s added token"), source + "'s added token '" + a.content + "'");
    a.special = t.value("special", false);
    a.single_word = t.value("single_word", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.normalized = t.value("normalized", !a.special);
    out.ids[a.content] = a.id;
    out.tokens.push_back(std::move(a));
  }
  for (size_t i = 0; i < out.tokens.size(); ++i) {
    const AddedToken& a = out.tokens[i];
    if (!a.normalized) {
      out.raw.add(a.content, static_cast<int>(i));
    } else {
      std::string storage;
      out.normalized.add(normalize(a.content, storage), static_cast<int>(i));
    }
  }
  return out;
}

std::optional<TokenId> AddedTokens::find(std::string_view content) const {
  const auto it = ids.find(std::string(content));
  return it == ids.end() ? std::nullopt : std::optional<TokenId>(it->second);
}

void AddedTokens::split(std::string_view text, const NormalizeText& normalize,
                        const std::function<void(std::string_view, bool)>& on_piece,
                        const std::function<void(TokenId)>& on_token) const {
  split_added(
      text, raw, tokens,
      [&](std::string_view between, size_t raw_at) {
        std::string storage;
        split_added(
            normalize(between, storage), normalized, tokens,
            [&](std::string_view piece, size_t at) { on_piece(piece, raw_at == 0 && at == 0); }, on_token);
      },
      on_token);
}

std::vector<SpecialToken> AddedTokens::special() const {
  std::vector<SpecialToken> out;
  for (const auto& a : tokens)
    if (a.special) out.push_back({a.id, a.content});
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

}  // namespace tandem::detail
