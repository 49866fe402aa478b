#pragma once
// A SentencePiece model's normalization (Note [SentencePiece normalization]), which every encoder
// of tandem's for tokenizer.model files applies before its segmentation: unigram (sp_unigram.h),
// BPE (sp_model_bpe.h) and char (sp_char.h) models.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/data/sp_model_proto.h"
#include "tandem/data/string_matcher.h"

namespace tandem {

/// The bytes a character takes by its first byte, as SentencePiece steps through a normalized text
/// (a stray continuation byte 1, F8-FF 4).
inline size_t sp_char_length(uint8_t c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

/// The normalization of a SentencePiece model: its compiled character map (a double-array trie
/// from input bytes to replacements, longest match first), then whitespace: leading and repeated
/// spaces dropped and trailing ones removed (remove_extra_whitespaces), a space put in front
/// (add_dummy_prefix) and spaces written as U+2581 (escape_whitespaces).
class SpNormalizer {
 public:
  /// UserError naming `source` when the character map is malformed.
  SpNormalizer(const SpModelProto& model, const std::string& source);
  std::string normalize(std::string_view text) const;

 private:
  /// The replacement of the longest mapped prefix of `text` and the bytes it consumes; without a
  /// mapped prefix, the first character itself (U+FFFD and one byte for a malformed one).
  std::pair<std::string_view, size_t> prefix(std::string_view text) const;

  std::vector<uint32_t> units_;  // the trie's double array
  std::string replacements_;     // NUL-terminated replacements, indexed by the trie's values
  StringMatcher user_pieces_;    // the model's user-defined pieces, never normalized
  bool add_dummy_prefix_, remove_extra_whitespaces_, escape_whitespaces_;
};

}  // namespace tandem
