#include "tandem/data/sp_char.h"

#include <algorithm>

namespace tandem {

// Note [SentencePiece char model]
// A char model's segmentation is its normalized text's characters: each one is its piece (a normal
// or user-defined piece of that one character), else unknown. As the `sentencepiece` package gives
// them, consecutive unknown characters are one unknown piece, which byte_fallback spells as the
// pieces of its bytes (a character's bytes, character after character: the same ids). The
// normalization (Note [SentencePiece normalization]) has already made malformed UTF-8 into U+FFFD,
// so a character's length is its first byte's. A text holding a user-defined piece of several
// characters is left to the library (SentencePieceTokenizer::encode), as for BPE models.
// tests/python/test_tokenizers_parity.py holds the ids equal to the package's on the parity texts and
// a 1 MB mix.

namespace {

// A character of up to 4 bytes as one key (its first byte decides its length, so keys do not collide).
uint32_t char_key(std::string_view c) {
  uint32_t k = 0;
  for (const char b : c) k = (k << 8) | static_cast<uint8_t>(b);
  return k;
}

}  // namespace

SpChar::SpChar(const SpModelProto& m, const std::string& source) : normalizer_(m, source) {
  std::fill(std::begin(ascii_), std::end(ascii_), -1);
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    const int id = static_cast<int>(i);
    if (p.type == SpModelProto::kUnknown && unk_ < 0) unk_ = id;
    if (p.type != SpModelProto::kNormal && p.type != SpModelProto::kUserDefined) continue;
    if (p.piece.empty() || p.piece.size() != sp_char_length(static_cast<uint8_t>(p.piece[0]))) continue;
    const auto lead = static_cast<uint8_t>(p.piece[0]);
    if (lead < 0x80) {
      if (ascii_[lead] < 0) ascii_[lead] = id;
    } else {
      id_.emplace(char_key(p.piece), id);
    }
  }
  byte_ids_ = sp_byte_ids(m, source);
}

std::vector<int> SpChar::encode(std::string_view text) const {
  const std::string normalized = normalizer_.normalize(text);
  std::vector<int> ids;
  ids.reserve(normalized.size());
  bool after_unknown = false;
  for (size_t at = 0; at < normalized.size();) {
    const auto lead = static_cast<uint8_t>(normalized[at]);
    const size_t n = std::min(sp_char_length(lead), normalized.size() - at);
    const std::string_view c(normalized.data() + at, n);
    int id = -1;
    if (lead < 0x80) {
      id = ascii_[lead];
    } else if (const auto it = id_.find(char_key(c)); it != id_.end()) {
      id = it->second;
    }
    at += n;
    if (id >= 0) {
      ids.push_back(id);
      after_unknown = false;
    } else if (!byte_ids_.empty()) {
      for (const char b : c) ids.push_back(byte_ids_[static_cast<uint8_t>(b)]);
    } else if (!after_unknown && unk_ >= 0) {
      ids.push_back(unk_);
      after_unknown = true;
    }
  }
  return ids;
}

std::unique_ptr<SpChar> sp_char_for_model(const SpModelProto& m, const std::string& source) {
  if (m.model_type != 4 || m.treat_whitespace_as_suffix) return nullptr;
  return std::unique_ptr<SpChar>(new SpChar(m, source));
}

}  // namespace tandem
