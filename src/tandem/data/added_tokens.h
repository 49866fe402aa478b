#pragma once
// tokenizer.json's added tokens (special tokens such as "<s>", "<|eot_id|>", and user-defined
// pieces), split out of a text before the model sees it, as `tokenizers` does: first those with
// normalized=false on the raw text, then, after the normalizer ran on what is left, those with
// normalized=true; leftmost-longest, with single_word, lstrip and rstrip.

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tandem/data/string_matcher.h"
#include "tandem/data/tokenizer_json.h"

namespace tandem::detail {

/// One entry of "added_tokens".
struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = true;
};

/// The text after the tokenizer's normalizer; may return a view of `text` or of `storage`.
using NormalizeText = std::function<std::string_view(std::string_view text, std::string& storage)>;

/// The added tokens of a tokenizer.json and their matchers.
struct AddedTokens {
  std::vector<AddedToken> tokens;
  std::unordered_map<std::string, TokenId> ids;  // content -> id
  StringMatcher raw, normalized;

  /// Reads "added_tokens" (null: none); normalized tokens are matched in their normalized form.
  static AddedTokens parse(const json& list, const std::string& source, const NormalizeText& normalize);

  std::optional<TokenId> find(std::string_view content) const;
  /// The special ones, by id (Tokenizer::special_tokens of a tokenizer.json).
  std::vector<SpecialToken> special() const;

  /// Splits `text` at the added tokens, normalizing the text between them: on_piece gets each
  /// normalized piece and whether it starts the text, on_token each added token's id, in text order.
  void split(std::string_view text, const NormalizeText& normalize,
             const std::function<void(std::string_view, bool)>& on_piece,
             const std::function<void(TokenId)>& on_token) const;
};

}  // namespace tandem::detail
