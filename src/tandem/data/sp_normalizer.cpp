#include "tandem/data/sp_normalizer.h"

#include <cstring>
#include <optional>

#include "tandem/core/error.h"
#include "tandem/data/tokenizer.h"

namespace tandem {

// Note [SentencePiece normalization]
// A model's normalizer_spec holds its normalization compiled (precompiled_charsmap): four bytes
// giving the size of a double-array trie (darts-clone's layout, 32-bit units), the trie, then
// NUL-terminated replacement strings. Walking the trie over the input's bytes gives every mapped
// prefix with the offset of its replacement; the longest one applies (NFKC's compositions, case
// folds of nmt_nfkc_cf), else the character stays. A unit's fields: bit 8 "has a leaf" (the value
// sits in the unit reached by label 0), bits 0-7 and 31 the label, the rest the offset to the
// children (shifted by 8 when bit 9 is set); a value unit holds it in bits 0-30. Whitespace then
// follows the spec's three switches; a text of whitespace alone normalizes to nothing. A user-defined
// piece is matched before the map, the longest first, and passes unchanged.
//
namespace {

constexpr char kSpaceSymbol[] = "\xE2\x96\x81";  // U+2581
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

uint32_t unit_offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }
uint32_t unit_label(uint32_t u) { return u & ((1u << 31) | 0xFFu); }
bool unit_has_leaf(uint32_t u) { return ((u >> 8) & 1u) != 0; }
uint32_t unit_value(uint32_t u) { return u & ((1u << 31) - 1); }

}  // namespace

SpNormalizer::SpNormalizer(const SpModelProto& m, const std::string& source)
    : add_dummy_prefix_(m.add_dummy_prefix),
      remove_extra_whitespaces_(m.remove_extra_whitespaces),
      escape_whitespaces_(m.escape_whitespaces) {
  for (const auto& p : m.pieces)
    if (p.type == SpModelProto::kUserDefined && !p.piece.empty()) {
      user_pieces_.add(p.piece, 0);
    }
  const std::string& blob = m.charsmap;
  if (blob.empty()) return;  // identity
  uint32_t trie_bytes = 0;
  TANDEM_CHECK(blob.size() >= 4, source, ": the compiled normalization is cut short; the model file is damaged");
  std::memcpy(&trie_bytes, blob.data(), 4);
  TANDEM_CHECK(trie_bytes % 4 == 0 && trie_bytes >= 4 && trie_bytes <= blob.size() - 4, source,
               ": the compiled normalization's trie does not fit in it; the model file is damaged");
  units_.resize(trie_bytes / 4);
  std::memcpy(units_.data(), blob.data() + 4, trie_bytes);
  replacements_ = blob.substr(4 + trie_bytes);
  replacements_.push_back('\0');  // every offset ends at a NUL even if the last one lacks it
}

std::pair<std::string_view, size_t> SpNormalizer::prefix(std::string_view text) const {
  size_t matched = 0;
  uint32_t value = 0;
  if (!units_.empty()) {
    uint32_t pos = unit_offset(units_[0]);
    for (size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<uint8_t>(text[i]);
      if (c == 0) break;
      pos ^= c;
      if (pos >= units_.size()) break;
      const uint32_t u = units_[pos];
      if (unit_label(u) != c) break;
      pos ^= unit_offset(u);
      if (pos >= units_.size()) break;
      if (unit_has_leaf(u)) {
        matched = i + 1;
        value = unit_value(units_[pos]);
      }
    }
  }
  if (matched > 0 && value < replacements_.size()) return {std::string_view(replacements_.c_str() + value), matched};
  const int n = utf8_scan(text, 0);  // a malformed character: U+FFFD for its first byte
  if (n <= 0) return {std::string_view(kReplacement, 3), 1};
  return {text.substr(0, static_cast<size_t>(n)), static_cast<size_t>(n)};
}

std::string SpNormalizer::normalize(std::string_view text) const {
  // The piece at `at`: a user-defined piece starting there, as written (the next one is sought once
  // and again only when passed), else the map's.
  std::optional<StringMatcher::Match> user;
  bool sought = false;
  const auto piece_at = [&](size_t at) -> std::pair<std::string_view, size_t> {
    if (!user_pieces_.empty() && (!sought || (user && user->start < at))) {
      user = user_pieces_.find(text, at);
      sought = true;
    }
    if (user && user->start == at) return {text.substr(at, user->end - at), user->end - at};
    return prefix(text.substr(at));
  };
  std::string out;
  size_t at = 0;
  if (remove_extra_whitespaces_) {  // leading whitespace
    while (at < text.size()) {
      const auto [s, n] = piece_at(at);
      if (s != " ") break;
      at += n;
    }
  }
  if (at == text.size()) return out;
  out.reserve(text.size() + text.size() / 4 + 3);
  if (add_dummy_prefix_) out += escape_whitespaces_ ? kSpaceSymbol : " ";
  bool previous_space = remove_extra_whitespaces_;
  while (at < text.size()) {
    auto [s, n] = piece_at(at);
    at += n;
    if (previous_space)
      while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    if (s.empty()) continue;
    for (const char c : s) {
      if (c == ' ' && escape_whitespaces_)
        out += kSpaceSymbol;
      else
        out.push_back(c);
    }
    previous_space = remove_extra_whitespaces_ && s.back() == ' ';
  }
  if (remove_extra_whitespaces_) {  // trailing whitespace
    const std::string_view space = escape_whitespaces_ ? kSpaceSymbol : " ";
    while (out.size() >= space.size() && out.compare(out.size() - space.size(), space.size(), space) == 0)
      out.resize(out.size() - space.size());
  }
  return out;
}

}  // namespace tandem
