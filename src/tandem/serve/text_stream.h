#pragma once
// Generated tokens to the text a client may be shown as it comes: whole UTF-8 characters only, and
// nothing that could still turn out to be the start of a stop string.
//
// Note [Streaming text]
// Stop strings are found in the decoded text, not in token ids: a stop string may be split across
// tokens, or be part of one. The stream keeps back the longest tail of the text that is a prefix of
// some stop string (and a character cut in the middle); when a stop string completes, the text
// before it is released and the stream stops, the stop string itself never shown. So pieces never
// split a character or show the start of a stop string that then completes, and joined they equal
// the decoded text up to the first stop string. Special tokens (EOS, a chat layout's markers) are
// not text and show as nothing, as transformers' decode(skip_special_tokens=True) and OpenAI-style
// servers show them; bytes that form no character (a model can sample any byte token) show as
// U+FFFD, so every piece is well-formed UTF-8 for a JSON body or a terminal.

#include <string>
#include <unordered_set>
#include <vector>

#include "tandem/data/tokenizer.h"

namespace tandem {

/// One request's detokenizer and stop-string matcher (Note [Streaming text]).
class TextStream {
 public:
  /// `tokenizer` must outlive the stream; empty stop strings are ignored.
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops);

  /// Adds the next generated token; returns the text that can be shown now (may be empty), always
  /// well-formed UTF-8 (malformed bytes as U+FFFD); a special token adds nothing. After a
  /// stop string completes it returns what preceded it, stopped() turns true and later pushes return
  /// "".
  std::string push(TokenId token);
  /// The text still held back at the end of generation (a partial stop-string match; a cut
  /// character as U+FFFD); "" once stopped.
  std::string flush();
  /// Whether a stop string completed.
  bool stopped() const { return stopped_; }

 private:
  const Tokenizer& tokenizer_;
  std::vector<std::string> stops_;
  std::unordered_set<TokenId> special_;  // the tokenizer's control tokens: never shown
  std::string pending_;                  // decoded bytes not yet shown
  bool stopped_ = false;
};

}  // namespace tandem
