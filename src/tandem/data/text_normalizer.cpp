#include "tandem/data/text_normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem::detail {

TextReplace TextReplace::parse(const json& j, const std::string& what) {
  TextReplace r;
  const json& pattern = member(j, "pattern", what);
  if (pattern.contains("Regex"))
    r.regex = compile_regex(pattern["Regex"].get<std::string>(), what);
  else
    r.literal = member(pattern, "String", what + "'s pattern").get<std::string>();
  r.content = member(j, "content", what).get<std::string>();
  return r;
}

std::string TextReplace::apply(std::string_view text) const {
  const auto matcher = new_matcher(regex.get());
  std::string out;
  size_t done = 0;
  for (const auto& [a, b] : find_matches(text, matcher.get(), literal)) {
    out.append(text.substr(done, a - done)).append(content);
    done = b;
  }
  return out.append(text.substr(done));
}

struct TextNormalizer::Step {
  enum class Kind { kNormalForm, kPrepend, kReplace, kStrip } kind;
  const icu::Normalizer2* form = nullptr;  // kNormalForm
  std::string prepend;                     // kPrepend
  TextReplace replace;                     // kReplace
  bool strip_left = false, strip_right = false;

  void apply(std::string& text) const;
};

namespace {

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

void normal_form(const icu::Normalizer2& form, std::string& text) {
  if (is_ascii(text)) return;  // ASCII is in every normal form
  UErrorCode status = U_ZERO_ERROR;
  if (form.isNormalizedUTF8(text, status) && U_SUCCESS(status)) return;
  status = U_ZERO_ERROR;
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  form.normalizeUTF8(0, text, sink, nullptr, status);
  TANDEM_ASSERT(U_SUCCESS(status), "ICU normalizer: ", u_errorName(status));
  text = std::move(out);
}

// Removes White_Space characters from the ends (tokenizers' Strip normalizer).
void strip(std::string& text, bool left, bool right) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  auto begin = int32_t{0}, end = static_cast<int32_t>(text.size());
  while (left && begin < end) {
    int32_t next = begin;
    UChar32 c;
    U8_NEXT(s, next, end, c);
    if (c < 0 || !u_isUWhiteSpace(c)) break;
    begin = next;
  }
  while (right && end > begin) {
    int32_t prev = end;
    UChar32 c;
    U8_PREV(s, begin, prev, c);
    if (c < 0 || !u_isUWhiteSpace(c)) break;
    end = prev;
  }
  text = text.substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
}

const icu::Normalizer2* normal_form_named(const std::string& type) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                              : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                              : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                              : type == "NFKD" ? icu::Normalizer2::getNFKDInstance(status)
                                               : nullptr;
  TANDEM_ASSERT(U_SUCCESS(status), "ICU normalizer: ", u_errorName(status));
  return n;
}

void parse_steps(const json& j, const std::string& source,
                 std::vector<std::shared_ptr<const TextNormalizer::Step>>& out) {
  using Step = TextNormalizer::Step;
  if (j.is_null()) return;
  const std::string type = type_of(j);
  if (type == "Sequence") {
    for (const auto& n : member(j, "normalizers", source + "'s normalizer")) parse_steps(n, source, out);
    return;
  }
  if (type == "Precompiled") {  // SentencePiece's character map; an empty one changes nothing
    const bool empty = !j.contains("precompiled_charsmap") || j["precompiled_charsmap"].is_null() ||
                       j["precompiled_charsmap"].get<std::string>().empty();
    TANDEM_CHECK(empty, source, ": normalizer 'Precompiled' (a SentencePiece character map) is not read by tandem; ",
                 "give the model's tokenizer.model instead (tandem reads it with SentencePiece)");
    return;
  }
  auto step = std::make_shared<Step>();
  if (const auto* form = normal_form_named(type)) {
    step->kind = Step::Kind::kNormalForm, step->form = form;
  } else if (type == "Prepend") {
    step->kind = Step::Kind::kPrepend;
    step->prepend = member(j, "prepend", source + "'s Prepend normalizer").get<std::string>();
  } else if (type == "Replace") {
    step->kind = Step::Kind::kReplace;
    step->replace = TextReplace::parse(j, source + "'s Replace normalizer");
  } else if (type == "Strip") {
    step->kind = Step::Kind::kStrip;
    step->strip_left = j.value("strip_left", true), step->strip_right = j.value("strip_right", true);
  } else {
    TANDEM_FAIL(source, ": normalizer '", type,
                "' is not read by tandem (it reads none, NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip and a "
                "Sequence of them); for a SentencePiece-style tokenizer give its tokenizer.model instead");
  }
  out.push_back(std::move(step));
}

}  // namespace

void TextNormalizer::Step::apply(std::string& text) const {
  switch (kind) {
    case Kind::kNormalForm:
      normal_form(*form, text);
      break;
    case Kind::kPrepend:
      if (!text.empty()) text.insert(0, prepend);
      break;
    case Kind::kReplace:
      text = replace.apply(text);
      break;
    case Kind::kStrip:
      strip(text, strip_left, strip_right);
      break;
  }
}

TextNormalizer TextNormalizer::parse(const json& j, const std::string& source) {
  TextNormalizer n;
  parse_steps(j, source, n.steps_);
  return n;
}

std::string_view TextNormalizer::apply(std::string_view text, std::string& storage) const {
  if (steps_.empty()) return text;
  if (is_ascii(text) &&
      std::all_of(steps_.begin(), steps_.end(), [](const auto& s) { return s->kind == Step::Kind::kNormalForm; }))
    return text;
  storage.assign(text);
  for (const auto& s : steps_) s->apply(storage);
  return storage;
}

}  // namespace tandem::detail
