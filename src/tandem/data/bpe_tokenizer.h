#pragma once
// Hugging Face tokenizer.json with a byte-level BPE model, as GPT-2, Llama 3 and Qwen ship it
// (Note [Byte-level BPE]): added tokens split out first, the normalizer (Unicode normal forms,
// Prepend, Replace, Strip), the pre-tokenizer (Split by a regex or a string, ByteLevel, a
// Sequence of those) run with ICU's regex engine on the file's own patterns, the BPE merges by
// rank, the post-processor's template, the ByteLevel decoder.

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "tandem/data/tokenizer.h"

namespace tandem {

/// A byte-level BPE tokenizer read from tokenizer.json.
class BpeTokenizer final : public Tokenizer {
 public:
  /// Reads `path`; UserError naming the file, the part tandem does not read and the fix.
  static std::unique_ptr<BpeTokenizer> from_file(const std::string& path, const SpecialTokenNames& names = {});
  /// Parses tokenizer.json text; `source` names it in errors.
  static std::unique_ptr<BpeTokenizer> from_json(const std::string& json_text, const std::string& source,
                                                 const SpecialTokenNames& names = {});
  /// Reads a parsed tokenizer.json.
  static std::unique_ptr<BpeTokenizer> from_parsed(const nlohmann::json& tokenizer, const std::string& source,
                                                   const SpecialTokenNames& names = {});
  ~BpeTokenizer() override;

  TokenizerKind kind() const override { return TokenizerKind::kByteLevelBpe; }
  std::vector<TokenId> encode(std::string_view text, SpecialTokens special = SpecialTokens::kOmit) const override;
  std::string decode(const std::vector<TokenId>& ids, SpecialTokens special = SpecialTokens::kInclude) const override;
  std::string token_bytes(TokenId id, TokenPlace place = TokenPlace::kFollowing) const override;
  int64_t vocab_size() const override;
  std::optional<TokenId> bos_id() const override;
  std::optional<TokenId> eos_id() const override;
  std::optional<TokenId> token_to_id(std::string_view token) const override;
  std::string id_to_token(TokenId id) const override;
  std::vector<SpecialToken> special_tokens() const override;
  size_t piece_boundary(std::string_view text, size_t limit) const override;
  std::string description() const override;

  struct Model;  // the parsed file (bpe_tokenizer.cpp)

 private:
  explicit BpeTokenizer(std::unique_ptr<Model> model);
  std::unique_ptr<Model> m_;
};

}  // namespace tandem
