#pragma once
// tokenizer.json's patterns (a string or an Oniguruma regex, run by ICU: Note [Byte-level BPE]) and
// the Split pre-tokenizer step that cuts a text at them, with `tokenizers`' split behaviours.

#include <unicode/regex.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/data/tokenizer_json.h"

namespace tandem::detail {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

/// One step of a pre-tokenizer, applied to every piece the steps before it left.
struct SplitStep {
  std::unique_ptr<icu::RegexPattern> regex;  // null: split on `literal` (none when empty)
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool prefix_space = false;  // ByteLevel's add_prefix_space: a space before a piece that lacks one
};

/// A [begin, end) byte range of a text.
using ByteRange = std::pair<size_t, size_t>;

/// `pattern` compiled by ICU; UserError naming `source` when it does not compile.
std::unique_ptr<icu::RegexPattern> compile_regex(const std::string& pattern, const std::string& source);

/// A matcher for `regex` (null for null): ICU matchers hold match state, so each call has its own.
std::unique_ptr<icu::RegexMatcher> new_matcher(const icu::RegexPattern* regex);

/// The non-overlapping matches, left to right, of `matcher` (when not null) or else of `literal`.
std::vector<ByteRange> find_matches(std::string_view text, icu::RegexMatcher* matcher, std::string_view literal);

/// The pieces `step` cuts `text` into (empty ones dropped); `matcher` is step.regex's.
std::vector<ByteRange> split_pieces(std::string_view text, const SplitStep& step, icu::RegexMatcher* matcher);

/// A {"type": "Split", "pattern": {"Regex"|"String": ...}, "behavior", "invert"} step.
SplitStep parse_split(const json& j, const std::string& source);

}  // namespace tandem::detail
