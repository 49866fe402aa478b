#include "tandem/data/sp_unigram.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
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
// Note [SentencePiece unigram]
// libsentencepiece 0.1.97 (Debian's) encodes a unigram model 3 to 4.5 times slower than the
// `sentencepiece` package 0.2.3, and sums path scores in float, which over a long text loses the
// difference between close segmentations (0.04 at a total near -3e6 on the parity tests' 1 MB mix),
// so its ids there differ from the package's. The package's best segmentation, rebuilt here: over
// the normalized text, at each character boundary reached, every piece starting there (a byte trie
// of the normal and user-defined pieces; unused, control and byte pieces never match) extends the
// best path to its end, a user-defined piece scoring its length times the highest normal score
// (which starts at FLT_MIN, so about -0.1: it beats its own splits); a character that no piece of
// its own length covers gets the unknown piece, scoring the lowest normal score minus 10. Scores add
// up in double, as the package 0.2.3's do. A later candidate replaces a path only when strictly
// better, so a tie keeps the path found first: the one whose last piece starts earlier (the longer
// last piece). Going back from the end, consecutive unknown characters become one unknown piece,
// which byte_fallback spells as the pieces of its bytes. A malformed character in the input becomes
// U+FFFD, one byte at a time, as SentencePiece's UTF-8 decoding has it. tests/python/
// test_tokenizers_parity.py holds the ids equal to the package's for three unigram models (NFKC
// with collapsed whitespace; case folding with byte fallback and no dummy prefix; identity with
// spaces kept) on the parity texts and a 1 MB mix with and without a user-defined piece.

namespace {

constexpr char kSpaceSymbol[] = "\xE2\x96\x81";  // U+2581
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
constexpr float kUnknownPenalty = 10.0f;

// The bytes a character takes by its first byte, as SentencePiece steps through a normalized text
// (a stray continuation byte 1, F8-FF 4).
size_t char_length(uint8_t c) { return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

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

SpUnigram::SpUnigram(const SpModelProto& m, const std::string& source) : normalizer_(m, source) {
  // As libsentencepiece: the highest score starts at FLT_MIN (the least positive float), so with the
  // usual negative scores a user-defined piece scores about -0.1 and beats any split of itself.
  float min_score = std::numeric_limits<float>::max(), max_score = std::numeric_limits<float>::min();
  for (const auto& p : m.pieces)
    if (p.type == SpModelProto::kNormal)
      min_score = std::min(min_score, p.score), max_score = std::max(max_score, p.score);
  score_.assign(m.pieces.size(), 0.0f);
  std::vector<std::pair<std::string, int32_t>> matched;
  for (size_t id = 0; id < m.pieces.size(); ++id) {
    const auto& p = m.pieces[id];
    if (p.type == SpModelProto::kUnknown && unk_ < 0) unk_ = static_cast<int>(id);
    if ((p.type != SpModelProto::kNormal && p.type != SpModelProto::kUserDefined) || p.piece.empty()) continue;
    // A user-defined piece outscores every split of its bytes, as in libsentencepiece.
    score_[id] = p.type == SpModelProto::kNormal ? double(p.score) : double(p.piece.size()) * max_score - 0.1;
    matched.emplace_back(p.piece, static_cast<int32_t>(id));
  }
  TANDEM_CHECK(unk_ >= 0, source, " is a unigram model without an unknown piece; the model file is damaged");
  unk_score_ = min_score - kUnknownPenalty;
  build_trie(matched);
  if (!m.byte_fallback) return;
  byte_ids_.assign(256, -1);
  for (size_t id = 0; id < m.pieces.size(); ++id) {
    const auto& p = m.pieces[id];
    unsigned byte = 0;
    if (p.type == SpModelProto::kByte && p.piece.size() == 6 && std::sscanf(p.piece.c_str(), "<0x%2X>", &byte) == 1 &&
        byte < 256)
      byte_ids_[byte] = static_cast<int>(id);
  }
  for (const int id : byte_ids_)
    TANDEM_CHECK(id >= 0, source, " falls back to bytes but lacks a byte piece; the model file is damaged");
}

// The trie built with a map per node, then laid out flat: node v's edges in byte order at
// [first_[v], first_[v + 1]), the root's also as a table by byte.
void SpUnigram::build_trie(const std::vector<std::pair<std::string, int32_t>>& pieces) {
  struct Node {
    std::map<uint8_t, int32_t> next;
    int32_t piece = -1;
  };
  std::vector<Node> nodes(1);
  for (const auto& [piece, id] : pieces) {
    int32_t v = 0;
    for (const char c : piece) {
      const auto b = static_cast<uint8_t>(c);
      const auto it = nodes[static_cast<size_t>(v)].next.find(b);
      if (it != nodes[static_cast<size_t>(v)].next.end()) {
        v = it->second;
        continue;
      }
      const auto fresh = static_cast<int32_t>(nodes.size());
      nodes[static_cast<size_t>(v)].next.emplace(b, fresh);
      nodes.emplace_back();
      v = fresh;
    }
    if (nodes[static_cast<size_t>(v)].piece < 0) nodes[static_cast<size_t>(v)].piece = id;  // the first of equals
  }
  first_.clear(), byte_.clear(), to_.clear(), piece_.clear();
  for (const auto& node : nodes) {
    first_.push_back(static_cast<int32_t>(byte_.size()));
    piece_.push_back(node.piece);
    for (const auto& [b, to] : node.next) byte_.push_back(b), to_.push_back(to);
  }
  first_.push_back(static_cast<int32_t>(byte_.size()));
  std::fill(std::begin(root_), std::end(root_), -1);
  for (const auto& [b, to] : nodes[0].next) root_[b] = to;
}

// The best path to every character boundary of `text`: best[end] the last piece's start and id.
void SpUnigram::best_paths(std::string_view text, BestPath* best) const {
  const size_t n = text.size();
  best[0].start = 0;
  for (size_t at = 0; at < n;) {
    // Every character start is reached (by the unknown piece at least).
    const size_t len = std::min(char_length(static_cast<uint8_t>(text[at])), n - at);
    const double here = best[at].score;
    bool single = false;
    for (size_t end = at + 1, node = size_t(root_[static_cast<uint8_t>(text[at])]); node != size_t(-1); ++end) {
      const int32_t id = piece_[node];
      if (id >= 0) {
        BestPath& b = best[end];
        const double candidate = here + score_[static_cast<size_t>(id)];
        if (b.start < 0 || candidate > b.score) b = {candidate, static_cast<int32_t>(at), id};
        single = single || end - at == len;
      }
      if (end == n) break;
      const auto byte = static_cast<uint8_t>(text[end]);  // the child by this byte, if any
      size_t next = size_t(-1);
      for (auto e = static_cast<size_t>(first_[node]), last = static_cast<size_t>(first_[node + 1]); e < last; ++e) {
        if (byte_[e] < byte) continue;
        if (byte_[e] == byte) next = static_cast<size_t>(to_[e]);
        break;
      }
      node = next;
    }
    if (!single) {
      BestPath& b = best[at + len];
      const double candidate = here + unk_score_;
      if (b.start < 0 || candidate > b.score) b = {candidate, static_cast<int32_t>(at), unk_};
    }
    at += len;
  }
}

std::vector<int> SpUnigram::encode_normalized(std::string_view text) const {
  const size_t n = text.size();
  TANDEM_CHECK(n < size_t{1} << 31, "a text of ", n,
               " bytes is beyond the unigram encoder's 2 GiB; encode it in pieces");
  // A thread's buffer is reused (a fresh one page-faults its way through every call) up to 4 M
  // characters (64 MiB); a longer text gets one of its own, freed after.
  constexpr size_t kReused = size_t{1} << 22;
  thread_local std::vector<BestPath> reused;
  std::vector<BestPath> own;
  std::vector<BestPath>& buffer = n < kReused ? reused : own;
  buffer.assign(n + 1, BestPath{});
  BestPath* const best = buffer.data();  // one lookup of the thread's vector, not one per use
  best_paths(text, best);
  // Back from the end: ids in reverse, consecutive unknown characters one unknown piece (or their
  // bytes with byte_fallback).
  std::vector<int> ids;
  ids.reserve(n / 3 + 1);
  bool after_unknown = false;
  for (size_t end = n; end > 0;) {
    const BestPath& b = best[end];
    TANDEM_ASSERT(b.start >= 0, "a unigram segmentation that does not reach the text's end");
    const auto start = static_cast<size_t>(b.start);
    if (b.id != unk_) {
      ids.push_back(b.id);
    } else if (!byte_ids_.empty()) {
      for (size_t i = end; i > start; --i) ids.push_back(byte_ids_[static_cast<uint8_t>(text[i - 1])]);
    } else if (!after_unknown) {
      ids.push_back(unk_);
    }
    after_unknown = b.id == unk_;
    end = start;
  }
  std::reverse(ids.begin(), ids.end());
  return ids;
}

std::vector<int> SpUnigram::encode(std::string_view text) const {
  return encode_normalized(normalizer_.normalize(text));
}

std::unique_ptr<SpUnigram> sp_unigram_for_model(const SpModelProto& m, const std::string& source) {
  if (m.model_type != 1 || m.treat_whitespace_as_suffix) return nullptr;
  return std::unique_ptr<SpUnigram>(new SpUnigram(m, source));
}

}  // namespace tandem
