#pragma once
// tandem's byte models: one token per byte, vocabulary 256, no special tokens (the same ids as
// byte_tokenize() in token_file.h, which reads text files for `tandem train`).

#include "tandem/data/tokenizer.h"

namespace tandem {

/// One token per byte: id = the byte's value.
class ByteTokenizer final : public Tokenizer {
 public:
  /// The number of ids: one per byte value.
  static constexpr int64_t kVocabSize = 256;

  TokenizerKind kind() const override { return TokenizerKind::kByte; }
  std::vector<TokenId> encode(std::string_view text, SpecialTokens special = SpecialTokens::kOmit) const override;
  std::string decode(const std::vector<TokenId>& ids, SpecialTokens special = SpecialTokens::kInclude) const override;
  std::string token_bytes(TokenId id, TokenPlace place = TokenPlace::kFollowing) const override;
  int64_t vocab_size() const override { return kVocabSize; }
  std::optional<TokenId> bos_id() const override { return std::nullopt; }
  std::optional<TokenId> eos_id() const override { return std::nullopt; }
  /// A one-byte string's id.
  std::optional<TokenId> token_to_id(std::string_view token) const override;
  /// The one-byte string of `id`.
  std::string id_to_token(TokenId id) const override;
  std::vector<SpecialToken> special_tokens() const override { return {}; }
  /// Any position: bytes are encoded one by one.
  size_t piece_boundary(std::string_view text, size_t limit) const override;
  std::string description() const override;
};

}  // namespace tandem
