#pragma once
// tokenizer.json's normalizer, run on the text between added tokens before pre-tokenizing:
// Unicode normal forms (NFC, NFD, NFKC, NFKD, by ICU), Prepend, Replace (a string or a regex),
// Strip, and a Sequence of them, each as `tokenizers` applies it.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/data/text_split.h"

namespace tandem::detail {

/// A Replace step (of a normalizer or a decoder): every non-overlapping match of a string or a
/// regex, left to right, becomes `content`.
struct TextReplace {
  std::shared_ptr<const icu::RegexPattern> regex;  // null: the pattern is `literal`
  std::string literal;
  std::string content;

  /// {"type": "Replace", "pattern": {"String"|"Regex": ...}, "content": ...}; `what` names it in errors.
  static TextReplace parse(const json& j, const std::string& what);
  std::string apply(std::string_view text) const;
};

/// A normalizer; immutable, so shared by all threads.
class TextNormalizer {
 public:
  /// Reads tokenizer.json's "normalizer" (null: none); UserError naming a kind tandem does not read.
  static TextNormalizer parse(const json& j, const std::string& source);

  bool empty() const { return steps_.empty(); }

  /// The normalized text: a view of `text` when no step changes it, else of `storage`.
  std::string_view apply(std::string_view text, std::string& storage) const;

  struct Step;  // text_normalizer.cpp

 private:
  std::vector<std::shared_ptr<const Step>> steps_;
};

}  // namespace tandem::detail
