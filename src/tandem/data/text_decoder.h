#pragma once
// tokenizer.json's decoder for tokens that are text rather than bytes (SentencePiece-style BPE,
// Note [SentencePiece-style BPE]): Replace, ByteFallback, Fuse, Strip, Metaspace and a Sequence of
// them, each run on the list of token strings as `tokenizers` runs it.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/data/tokenizer_json.h"

namespace tandem::detail {

/// Where Metaspace puts its replacement before a piece: always, only before the text's first
/// piece, never.
enum class PrependScheme { kAlways, kFirst, kNever };

/// Metaspace's "prepend_scheme" (or, in older files, "add_prefix_space": true is kAlways).
PrependScheme parse_prepend_scheme(const json& metaspace, const std::string& source);

/// A decoder chain; immutable, so shared by all threads.
class TextDecoder {
 public:
  /// Reads tokenizer.json's "decoder" (null: tokens joined by spaces, as `tokenizers` does);
  /// UserError naming a decoder tandem does not read.
  static TextDecoder parse(const json& j, const std::string& source);

  /// The text of `tokens` (their stored forms), exactly as `tokenizers` decodes them.
  std::string decode(std::vector<std::string> tokens) const;

  /// The bytes one token adds to a decoded text, for streaming: a <0xXX> token is its byte (which
  /// may end inside a character); `first`: as the first token of the text (Strip after Fuse and
  /// Metaspace treat it apart). A Strip of the text's end is not applied.
  std::string token_text(std::string_view token, bool first) const;

  struct Step;  // text_decoder.cpp

 private:
  std::vector<std::shared_ptr<const Step>> steps_;
  bool join_with_spaces_ = false;  // no decoder at all
};

/// The byte a "<0xXX>" token stands for, as ByteFallback reads it; -1 for other tokens.
int byte_token_value(std::string_view token);

}  // namespace tandem::detail
