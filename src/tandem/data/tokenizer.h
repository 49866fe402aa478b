#pragma once
// Text to token ids and back. One small interface over the kinds tandem reads: Hugging Face
// byte-level BPE and SentencePiece-style BPE (tokenizer.json), SentencePiece (tokenizer.model) and
// tandem's byte models.
// open_tokenizer (tokenizer_files.h) picks one for a file or a model folder.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

/// A token id. Every vocabulary tandem reads fits in 31 bits.
using TokenId = int32_t;

/// Whether encode() adds the tokens the tokenizer's template puts around a text (BOS, ...) and
/// whether decode() renders special tokens as their text.
enum class SpecialTokens {
  kOmit,     ///< encode: the text's own tokens only; decode: special tokens left out
  kInclude,  ///< encode: as the post-processor's template says; decode: special tokens as text
};

/// Where a token stands in a decoded text: kFirst for the first token that is not a special
/// (control) token, whose leading space SentencePiece drops; kFollowing for the rest.
enum class TokenPlace { kFirst, kFollowing };

/// A special (control) token: its id and its text.
struct SpecialToken {
  TokenId id = 0;
  std::string text;
};

/// Names of the BOS and EOS tokens that override a tokenizer's own (tokenizer_config.json's
/// bos_token and eos_token, or `tandem tokenize --eos`); unset keeps the tokenizer's choice.
struct SpecialTokenNames {
  std::optional<std::string> bos, eos;
};

/// The tokenizer families tandem reads.
enum class TokenizerKind { kByteLevelBpe, kSentencePieceBpe, kSentencePiece, kByte };

/// "byte-level BPE", "SentencePiece-style BPE", "SentencePiece", "byte".
const char* tokenizer_kind_name(TokenizerKind kind);

/// Text to ids and back. Implementations are immutable after construction, so every method may be
/// called from many threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual TokenizerKind kind() const = 0;

  /// The ids of `text` (UTF-8). Special tokens written in the text (e.g. "<|eot_id|>") become their
  /// ids; `special` says whether the template's tokens (BOS) are added around the text.
  virtual std::vector<TokenId> encode(std::string_view text, SpecialTokens special = SpecialTokens::kOmit) const = 0;

  /// The text of `ids` (valid UTF-8: malformed byte sequences become U+FFFD); unknown ids are
  /// skipped.
  virtual std::string decode(const std::vector<TokenId>& ids,
                             SpecialTokens special = SpecialTokens::kInclude) const = 0;

  /// The bytes token `id` adds to a decoded text at `place`, for streaming output: concatenated over
  /// a sequence they equal decode(ids) for well-formed text. A token may end inside a UTF-8
  /// character; utf8_complete_length() says how much of a buffer can be shown.
  virtual std::string token_bytes(TokenId id, TokenPlace place = TokenPlace::kFollowing) const = 0;

  /// One more than the largest id (the rows an embedding needs).
  virtual int64_t vocab_size() const = 0;

  /// Beginning- and end-of-text tokens, when the tokenizer (or its folder's config) has them.
  virtual std::optional<TokenId> bos_id() const = 0;
  virtual std::optional<TokenId> eos_id() const = 0;

  /// The id of a vocabulary entry written as the tokenizer stores it ("Ġthe", "▁the", "<s>").
  virtual std::optional<TokenId> token_to_id(std::string_view token) const = 0;

  /// The stored form of `id`; "" for an id outside the vocabulary.
  virtual std::string id_to_token(TokenId id) const = 0;

  /// The special (control) tokens, by ascending id.
  virtual std::vector<SpecialToken> special_tokens() const = 0;

  /// Where a long text may be cut so that encoding the parts apart gives the ids of encoding it
  /// whole: a position in (0, limit], or 0 when the tokenizer knows none. See Note [Document pieces].
  virtual size_t piece_boundary(std::string_view text, size_t limit) const = 0;

  /// One line: kind, vocabulary size, BOS and EOS, source file.
  virtual std::string description() const = 0;
};

/// The length of the longest prefix of `bytes` that does not end inside a UTF-8 character (what a
/// streaming decoder can print now).
size_t utf8_complete_length(std::string_view bytes);

/// The length of the well-formed UTF-8 sequence at s[i], or -(length of its maximal malformed part):
/// a stray continuation byte, a cut, overlong or surrogate sequence, a code point past U+10FFFF.
int utf8_scan(std::string_view s, size_t i);

/// `bytes` with every malformed UTF-8 sequence replaced by U+FFFD (one per maximal malformed part).
std::string utf8_lossy(std::string_view bytes);

}  // namespace tandem
