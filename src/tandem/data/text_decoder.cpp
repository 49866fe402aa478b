#include "tandem/data/text_decoder.h"

#include <unicode/utf8.h>

#include "tandem/core/error.h"
#include "tandem/data/text_normalizer.h"

namespace tandem::detail {

struct TextDecoder::Step {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  TextReplace replace;         // kReplace
  UChar32 content = ' ';       // kStrip: the character stripped
  size_t start = 0, stop = 0;  // kStrip: at most this many from each end
  std::string replacement;     // kMetaspace
  PrependScheme scheme = PrependScheme::kAlways;

  void run(std::vector<std::string>& tokens) const;
};

namespace {

constexpr const char* kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::vector<UChar32> code_points(std::string_view s) {
  std::vector<UChar32> out;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  for (int32_t i = 0, n = static_cast<int32_t>(s.size()); i < n;) {
    UChar32 c;
    U8_NEXT(p, i, n, c);
    out.push_back(c);
  }
  return out;
}

// tokenizers' Strip decoder on one token: up to `start` leading and `stop` trailing `content`s
// (other bytes, even a lone byte of a character, are kept as they are).
std::string strip_token(std::string_view token, UChar32 content, size_t start, size_t stop) {
  const auto* p = reinterpret_cast<const uint8_t*>(token.data());
  int32_t begin = 0, end = static_cast<int32_t>(token.size());
  for (size_t k = 0; k < start && begin < end; ++k) {
    int32_t next = begin;
    UChar32 c;
    U8_NEXT(p, next, end, c);
    if (c != content) break;
    begin = next;
  }
  for (size_t k = 0; k < stop && end > begin; ++k) {
    int32_t prev = end;
    UChar32 c;
    U8_PREV(p, begin, prev, c);
    if (c != content) break;
    end = prev;
  }
  return std::string(token.substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin)));
}

// Metaspace's decoder on one token: `replacement` becomes a space, or nothing in the first token.
std::string metaspace_token(std::string_view token, std::string_view replacement, bool drop) {
  std::string out;
  for (size_t at = 0; at < token.size();) {
    if (token.compare(at, replacement.size(), replacement) == 0) {
      if (!drop) out.push_back(' ');
      at += replacement.size();
    } else {
      out.push_back(token[at++]);
    }
  }
  return out;
}

// ByteFallback: runs of <0xXX> tokens become their bytes when those are UTF-8, else one U+FFFD
// per token.
void byte_fallback(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string run;
  size_t run_tokens = 0;
  auto flush = [&] {
    if (run_tokens == 0) return;
    if (utf8_lossy(run) == run) {
      out.push_back(run);
    } else {
      for (size_t i = 0; i < run_tokens; ++i) out.emplace_back(kReplacementCharacter);
    }
    run.clear(), run_tokens = 0;
  };
  for (auto& t : tokens) {
    const int byte = byte_token_value(t);
    if (byte >= 0) {
      run.push_back(static_cast<char>(byte)), ++run_tokens;
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  tokens = std::move(out);
}

void parse_steps(const json& j, const std::string& source, std::vector<std::shared_ptr<const TextDecoder::Step>>& out) {
  using Step = TextDecoder::Step;
  const std::string type = type_of(j);
  if (type == "Sequence") {
    for (const auto& d : member(j, "decoders", source + "'s decoder")) parse_steps(d, source, out);
    return;
  }
  auto step = std::make_shared<Step>();
  if (type == "Replace") {
    step->kind = Step::Kind::kReplace;
    step->replace = TextReplace::parse(j, source + "'s Replace decoder");
  } else if (type == "ByteFallback") {
    step->kind = Step::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step->kind = Step::Kind::kFuse;
  } else if (type == "Strip") {
    step->kind = Step::Kind::kStrip;
    const auto content = code_points(member(j, "content", source + "'s Strip decoder").get<std::string>());
    TANDEM_CHECK(content.size() == 1, source, ": the Strip decoder's content must be one character");
    step->content = content[0];
    step->start = j.value("start", size_t{0}), step->stop = j.value("stop", size_t{0});
  } else if (type == "Metaspace") {
    step->kind = Step::Kind::kMetaspace;
    step->replacement = member(j, "replacement", source + "'s Metaspace decoder").get<std::string>();
    step->scheme = parse_prepend_scheme(j, source);
  } else {
    TANDEM_FAIL(source, ": decoder '", type,
                "' is not read by tandem for a SentencePiece-style BPE (it reads Replace, ByteFallback, Fuse, Strip, "
                "Metaspace and a Sequence of them); give the model's tokenizer.model instead");
  }
  out.push_back(std::move(step));
}

}  // namespace

PrependScheme parse_prepend_scheme(const json& j, const std::string& source) {
  if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
    const auto s = j["prepend_scheme"].get<std::string>();
    if (s == "always") return PrependScheme::kAlways;
    if (s == "first") return PrependScheme::kFirst;
    if (s == "never") return PrependScheme::kNever;
    TANDEM_FAIL(source, ": Metaspace prepend_scheme '", s, "' is unknown (always, first, never)");
  }
  return j.value("add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
}

int byte_token_value(std::string_view t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  // Rust's u8::from_str_radix, which ByteFallback calls, takes an optional '+' before the digits.
  if (t[3] == '+') return hex_digit(t[4]);
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

void TextDecoder::Step::run(std::vector<std::string>& tokens) const {
  switch (kind) {
    case Kind::kReplace:
      for (auto& t : tokens) t = replace.apply(t);
      break;
    case Kind::kByteFallback:
      byte_fallback(tokens);
      break;
    case Kind::kFuse: {
      std::string all;
      for (const auto& t : tokens) all += t;
      tokens.assign(1, std::move(all));
      break;
    }
    case Kind::kStrip:
      for (auto& t : tokens) t = strip_token(t, content, start, stop);
      break;
    case Kind::kMetaspace:
      for (size_t i = 0; i < tokens.size(); ++i)
        tokens[i] = metaspace_token(tokens[i], replacement, i == 0 && scheme != PrependScheme::kNever);
      break;
  }
}

TextDecoder TextDecoder::parse(const json& j, const std::string& source) {
  TextDecoder d;
  if (j.is_null()) {
    d.join_with_spaces_ = true;
    return d;
  }
  parse_steps(j, source, d.steps_);
  return d;
}

std::string TextDecoder::decode(std::vector<std::string> tokens) const {
  std::string out;
  if (join_with_spaces_) {
    for (size_t i = 0; i < tokens.size(); ++i) out.append(i ? " " : "").append(tokens[i]);
    return out;
  }
  for (const auto& s : steps_) s->run(tokens);
  for (const auto& t : tokens) out += t;
  return out;
}

std::string TextDecoder::token_text(std::string_view token, bool first) const {
  if (join_with_spaces_) return (first ? "" : " ") + std::string(token);
  std::string t(token);
  bool fused = false;
  for (const auto& s : steps_) {
    switch (s->kind) {
      case Step::Kind::kReplace:
        t = s->replace.apply(t);
        break;
      case Step::Kind::kByteFallback:
        if (const int byte = byte_token_value(t); byte >= 0) t.assign(1, static_cast<char>(byte));
        break;
      case Step::Kind::kFuse:
        fused = true;
        break;
      case Step::Kind::kStrip:
        if (!fused || first) t = strip_token(t, s->content, s->start, fused ? 0 : s->stop);
        break;
      case Step::Kind::kMetaspace:
        t = metaspace_token(t, s->replacement, first && s->scheme != PrependScheme::kNever);
        break;
    }
  }
  return t;
}

}  // namespace tandem::detail
