#pragma once
// Hugging Face tokenizer.json with a SentencePiece-style BPE model, as transformers converts
// Llama 2, Mistral and Gemma (Note [SentencePiece-style BPE]): BPE over Unicode characters with
// spaces written as U+2581 (by a Prepend/Replace normalizer or a Metaspace pre-tokenizer), a
// character outside the vocabulary spelled as its <0xXX> byte tokens (byte_fallback), and the
// Replace/ByteFallback/Fuse/Strip decoder.

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "tandem/data/tokenizer.h"

namespace tandem {

/// A SentencePiece-style BPE tokenizer read from tokenizer.json.
class SpBpeTokenizer final : public Tokenizer {
 public:
  /// Reads `path`; UserError naming the file, the part tandem does not read and the fix.
  static std::unique_ptr<SpBpeTokenizer> from_file(const std::string& path, const SpecialTokenNames& names = {});
  /// Parses tokenizer.json text; `source` names it in errors.
  static std::unique_ptr<SpBpeTokenizer> from_json(const std::string& json_text, const std::string& source,
                                                   const SpecialTokenNames& names = {});
  /// Reads a parsed tokenizer.json.
  static std::unique_ptr<SpBpeTokenizer> from_parsed(const nlohmann::json& tokenizer, const std::string& source,
                                                     const SpecialTokenNames& names = {});
  ~SpBpeTokenizer() override;

  TokenizerKind kind() const override { return TokenizerKind::kSentencePieceBpe; }
  std::vector<TokenId> encode(std::string_view text, SpecialTokens special = SpecialTokens::kOmit) const override;
  /// As `tokenizers` decodes (its decoder chain, e.g. ByteFallback's U+FFFD per stray byte token).
  std::string decode(const std::vector<TokenId>& ids, SpecialTokens special = SpecialTokens::kInclude) const override;
  /// "▁foo" is " foo" and "<0x0A>" the byte 0x0A; kFirst: with the decoder's leading Strip applied.
  std::string token_bytes(TokenId id, TokenPlace place = TokenPlace::kFollowing) const override;
  int64_t vocab_size() const override;
  std::optional<TokenId> bos_id() const override;
  std::optional<TokenId> eos_id() const override;
  std::optional<TokenId> token_to_id(std::string_view token) const override;
  std::string id_to_token(TokenId id) const override;
  std::vector<SpecialToken> special_tokens() const override;
  /// Never: with no pre-tokenizer the whole text is one word (Note [Document pieces]).
  size_t piece_boundary(std::string_view, size_t) const override { return 0; }
  std::string description() const override;

  struct Model;  // the parsed file (sp_bpe_tokenizer.cpp)

 private:
  explicit SpBpeTokenizer(std::unique_ptr<Model> model);
  std::unique_ptr<Model> m_;
};

}  // namespace tandem
