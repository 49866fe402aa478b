#include "tandem/data/text_split.h"

#include <unicode/utext.h>

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem::detail {

namespace {

struct Span {
  size_t begin, end;
  bool match;
};

// The matches of `step` in `text` and the text between them, covering it.
std::vector<Span> find_spans(std::string_view text, const SplitStep& step, icu::RegexMatcher* matcher) {
  std::vector<Span> spans;
  size_t prev = 0;
  for (const auto& [a, b] : find_matches(text, matcher, step.literal)) {
    if (prev < a) spans.push_back({prev, a, false});
    spans.push_back({a, b, true});
    prev = b;
  }
  if (prev < text.size()) spans.push_back({prev, text.size(), false});
  if (step.invert)
    for (auto& s : spans) s.match = !s.match;
  return spans;
}

// The pieces `spans` leave under `behavior` (empty ones dropped).
std::vector<ByteRange> apply_behavior(const std::vector<Span>& spans, SplitBehavior behavior) {
  std::vector<ByteRange> out;
  bool prev_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& s : spans)
        if (!s.match) out.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kIsolated:
      for (const auto& s : spans) out.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kContiguous:  // adjacent spans of one kind merge (after an invert, the non-matches too)
      for (const auto& s : spans) {
        if (s.match == prev_match && !out.empty())
          out.back().second = s.end;
        else
          out.emplace_back(s.begin, s.end);
        prev_match = s.match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& s : spans) {
        if (s.match && !prev_match && !out.empty())
          out.back().second = s.end;
        else
          out.emplace_back(s.begin, s.end);
        prev_match = s.match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev_match && !out.empty())
          out.back().first = it->begin;
        else
          out.emplace_back(it->begin, it->end);
        prev_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const auto& p) { return p.first == p.second; }), out.end());
  return out;
}

SplitBehavior parse_behavior(const std::string& name, const std::string& source) {
  static const std::pair<const char*, SplitBehavior> kNames[] = {
      {"Removed", SplitBehavior::kRemoved},
      {"Isolated", SplitBehavior::kIsolated},
      {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
      {"MergedWithNext", SplitBehavior::kMergedWithNext},
      {"Contiguous", SplitBehavior::kContiguous}};
  for (const auto& [n, b] : kNames)
    if (name == n) return b;
  TANDEM_FAIL(source, ": Split behavior '", name, "' is unknown (Removed, Isolated, MergedWithPrevious, ",
              "MergedWithNext, Contiguous)");
}

}  // namespace

std::unique_ptr<icu::RegexPattern> compile_regex(const std::string& pattern, const std::string& source) {
  UParseError where{};
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeString text = icu::UnicodeString::fromUTF8(pattern);
  std::unique_ptr<icu::RegexPattern> re(icu::RegexPattern::compile(text, 0, where, status));
  TANDEM_CHECK(U_SUCCESS(status), source, ": the regex '", pattern, "' does not compile with ICU (",
               u_errorName(status), " at offset ", where.offset,
               "); tandem runs tokenizer.json's patterns with ICU's regex engine");
  return re;
}

std::unique_ptr<icu::RegexMatcher> new_matcher(const icu::RegexPattern* regex) {
  if (!regex) return nullptr;
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> m(regex->matcher(status));
  TANDEM_ASSERT(U_SUCCESS(status), "ICU matcher: ", u_errorName(status));
  return m;
}

std::vector<ByteRange> find_matches(std::string_view text, icu::RegexMatcher* matcher, std::string_view literal) {
  std::vector<ByteRange> out;
  if (matcher) {
    UErrorCode status = U_ZERO_ERROR;
    UText ut = UTEXT_INITIALIZER;
    utext_openUTF8(&ut, text.data(), static_cast<int64_t>(text.size()), &status);
    matcher->reset(&ut);
    while (matcher->find(status) && U_SUCCESS(status))
      out.emplace_back(static_cast<size_t>(matcher->start64(status)), static_cast<size_t>(matcher->end64(status)));
    utext_close(&ut);
    TANDEM_ASSERT(U_SUCCESS(status), "ICU regex: ", u_errorName(status));
  } else if (!literal.empty()) {
    for (size_t at = text.find(literal); at != std::string_view::npos; at = text.find(literal, at + literal.size()))
      out.emplace_back(at, at + literal.size());
  }
  return out;
}

std::vector<ByteRange> split_pieces(std::string_view text, const SplitStep& step, icu::RegexMatcher* matcher) {
  return apply_behavior(find_spans(text, step, matcher), step.behavior);
}

SplitStep parse_split(const json& j, const std::string& source) {
  SplitStep step;
  const json& pattern = member(j, "pattern", source + "'s Split pre-tokenizer");
  if (pattern.contains("Regex"))
    step.regex = compile_regex(pattern["Regex"].get<std::string>(), source);
  else
    step.literal = member(pattern, "String", source + "'s Split pattern").get<std::string>();
  step.behavior = parse_behavior(member(j, "behavior", source + "'s Split").get<std::string>(), source);
  step.invert = j.value("invert", false);
  return step;
}

}  // namespace tandem::detail
