#pragma once
// SentencePiece models (tokenizer.model: Llama 2, Mistral, Gemma, T5 ...): read through the library
// itself (Debian's libsentencepiece-dev), encoded by tandem's own encoders of unigram, BPE and char
// models where they stand for the model (sp_unigram.h, sp_model_bpe.h, sp_char.h); a build without
// the library refuses them with the fix.

#include <memory>
#include <string>

#include "tandem/data/sp_char.h"
#include "tandem/data/sp_model_bpe.h"
#include "tandem/data/sp_unigram.h"
#include "tandem/data/string_matcher.h"
#include "tandem/data/tokenizer.h"

namespace tandem {

/// What encode(text, SpecialTokens::kInclude) adds around a text (tokenizer_config.json's
/// add_bos_token and add_eos_token; SentencePiece itself adds neither).
struct SentencePieceTemplate {
  bool add_bos = true;
  bool add_eos = false;
};

/// A SentencePiece model (unigram, BPE, char or word) read from tokenizer.model.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  /// Loads `path`; UserError naming the file and the fix when it is not a SentencePiece model.
  static std::unique_ptr<SentencePieceTokenizer> from_file(const std::string& path, const SpecialTokenNames& names = {},
                                                           const SentencePieceTemplate& tmpl = {});
  ~SentencePieceTokenizer() override;

  /// Whether this build reads SentencePiece models (it was compiled with libsentencepiece-dev).
  static bool available();

  TokenizerKind kind() const override { return TokenizerKind::kSentencePiece; }
  std::vector<TokenId> encode(std::string_view text, SpecialTokens special = SpecialTokens::kOmit) const override;
  /// SentencePiece never renders control tokens (BOS, EOS), whatever `special` says.
  std::string decode(const std::vector<TokenId>& ids, SpecialTokens special = SpecialTokens::kInclude) const override;
  /// kFirst: as the first non-control token of a text (its leading space dropped, as decode does).
  std::string token_bytes(TokenId id, TokenPlace place = TokenPlace::kFollowing) const override;
  int64_t vocab_size() const override;
  std::optional<TokenId> bos_id() const override { return bos_; }
  std::optional<TokenId> eos_id() const override { return eos_; }
  std::optional<TokenId> token_to_id(std::string_view token) const override;
  std::string id_to_token(TokenId id) const override;
  /// The control tokens (BOS, EOS, padding ...).
  std::vector<SpecialToken> special_tokens() const override;
  /// Never: SentencePiece's dummy prefix would start every piece (Note [Document pieces]).
  size_t piece_boundary(std::string_view, size_t) const override { return 0; }
  std::string description() const override;

 private:
  struct Processor;  // the library's SentencePieceProcessor
  SentencePieceTokenizer(std::unique_ptr<Processor> processor, std::string path, const SentencePieceTemplate& tmpl);
  void choose_bos_eos(const SpecialTokenNames& names);

  std::unique_ptr<Processor> sp_;
  /// A BPE model read as SentencePiece-style BPE (Note [SentencePiece model as BPE]) and a char
  /// model's encoder (Note [SentencePiece char model]): each encodes a text holding none of
  /// `user_pieces_`; null for other models.
  std::unique_ptr<SpModelBpe> bpe_;
  std::unique_ptr<SpChar> char_;
  std::unique_ptr<SpUnigram> unigram_;  // Note [SentencePiece unigram]: encodes every text; null: not unigram
  StringMatcher user_pieces_;  // the model's user-defined pieces: one pass over a text finds any
  std::string path_;
  SentencePieceTemplate template_;
  std::optional<TokenId> bos_, eos_;
  bool drops_first_space_ = false;  // decode drops the leading space of a text's first piece
};

}  // namespace tandem
