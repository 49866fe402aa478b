#include "tandem/data/byte_tokenizer.h"

#include <algorithm>

namespace tandem {

std::vector<TokenId> ByteTokenizer::encode(std::string_view text, SpecialTokens) const {
  std::vector<TokenId> ids(text.size());
  std::transform(text.begin(), text.end(), ids.begin(), [](char c) { return static_cast<unsigned char>(c); });
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<TokenId>& ids, SpecialTokens) const {
  std::string bytes;
  bytes.reserve(ids.size());
  for (TokenId id : ids)
    if (id >= 0 && id < kVocabSize) bytes.push_back(static_cast<char>(id));
  return utf8_lossy(bytes);
}

std::string ByteTokenizer::token_bytes(TokenId id, TokenPlace) const {
  if (id < 0 || id >= kVocabSize) return "";
  return std::string(1, static_cast<char>(id));
}

std::optional<TokenId> ByteTokenizer::token_to_id(std::string_view token) const {
  if (token.size() != 1) return std::nullopt;
  return static_cast<unsigned char>(token[0]);
}

std::string ByteTokenizer::id_to_token(TokenId id) const { return token_bytes(id); }

// Bytes are their own ids, so any cut keeps them; a cut at a character's start keeps each task's
// count of malformed UTF-8 true (a character split across two tasks would count in both).
size_t ByteTokenizer::piece_boundary(std::string_view text, size_t limit) const {
  if (limit >= text.size()) return text.size();
  size_t cut = limit;
  const auto continuation = [&](size_t i) { return (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80; };
  while (cut > 0 && limit - cut < 3 && continuation(cut)) --cut;
  return continuation(cut) || cut == 0 ? limit : cut;
}

std::string ByteTokenizer::description() const { return "byte tokenizer: 256 tokens (one per byte), no BOS or EOS"; }

}  // namespace tandem
