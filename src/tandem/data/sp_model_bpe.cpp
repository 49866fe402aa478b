#include "tandem/data/sp_model_bpe.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <unordered_map>

#include "tandem/core/error.h"

namespace tandem {

// Note [SentencePiece model as BPE]
// libsentencepiece (Debian's 0.1.97) encodes a BPE model two to four times slower than the
// SentencePiece-style BPE reader of tokenizer.json (sp_bpe_tokenizer.h), which already gives the
// ids `tokenizers` gives for the tokenizer.json transformers converts such a model to. So a BPE
// model whose text passes unchanged but for whitespace (normalization "identity", spaces kept and
// escaped as U+2581, a dummy prefix or none) and whose unseen characters become bytes
// (byte_fallback) is encoded by that reader over the converted form of the model:
// - the vocabulary is the pieces by id; the merges are every split of a piece into two pieces of the
//   vocabulary, ranked by the merged piece's score (higher first), then by the two halves' ids,
//   which is the order SentencePiece's BPE applies them in;
// - the normalizer is Prepend("▁") (with the dummy prefix) and Replace(" ", "▁"), no pre-tokenizer;
//   the model BPE with byte_fallback and fuse_unk, unk_token the unknown piece.
// User-defined pieces are matched in the text by SentencePiece; a text that holds one is left to the
// library (the prefix it adds around them differs from tokenizers' split at added tokens). Control
// pieces (<s>, </s>) are never matched in a text, by either. Decoding and everything else stay the
// library's; tests/python/test_tokenizers_parity.py holds the ids equal to the sentencepiece package's.

namespace {

// Protobuf's wire format: a tag (field << 3 | wire type) then the value.
class WireReader {
 public:
  WireReader(std::string_view bytes, const std::string& source) : p_(bytes), source_(source) {}
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      TANDEM_CHECK(i_ < p_.size(), source_, " is not a SentencePiece model (it ends inside a number)");
      const auto b = static_cast<uint8_t>(p_[i_++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (b < 0x80) return v;
    }
    TANDEM_FAIL(source_, " is not a SentencePiece model (a number of more than 64 bits)");
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    TANDEM_CHECK(n <= p_.size() - i_, source_, " is not a SentencePiece model (a field runs past its end)");
    const auto out = p_.substr(i_, n);
    i_ += n;
    return out;
  }
  float fixed32() {
    TANDEM_CHECK(p_.size() - i_ >= 4, source_, " is not a SentencePiece model (it ends inside a number)");
    float f;
    std::memcpy(&f, p_.data() + i_, 4);
    i_ += 4;
    return f;
  }
  // Calls read(field, wire) for each field of the message in turn; read takes the field's value
  // and returns true, or returns false and the value is skipped.
  template <class Read>
  void each_field(Read read) {
    while (i_ < p_.size()) {
      int wire = 0;
      const int field = next(wire);
      if (!read(field, wire)) skip(wire);
    }
  }

 private:
  // Reads the next field's tag; `wire` its type.
  int next(int& wire) {
    const uint64_t tag = varint();
    wire = static_cast<int>(tag & 7);
    return static_cast<int>(tag >> 3);
  }
  void skip(int wire) {
    if (wire == 0)
      varint();
    else if (wire == 1)
      i_ = std::min(p_.size(), i_ + 8);
    else if (wire == 2)
      bytes();
    else if (wire == 5)
      fixed32();
    else
      TANDEM_FAIL(source_, " is not a SentencePiece model (a field of wire type ", wire, ")");
  }

  std::string_view p_;
  size_t i_ = 0;
  const std::string& source_;
};

SpModelProto::Piece parse_piece(std::string_view bytes, const std::string& source) {
  SpModelProto::Piece piece;
  WireReader r(bytes, source);
  r.each_field([&](int field, int wire) {
    if (field == 1 && wire == 2)
      piece.piece = std::string(r.bytes());
    else if (field == 2 && wire == 5)
      piece.score = r.fixed32();
    else if (field == 3 && wire == 0)
      piece.type = static_cast<int>(r.varint());
    else
      return false;
    return true;
  });
  return piece;
}

void parse_trainer_spec(std::string_view bytes, const std::string& source, SpModelProto& m) {
  WireReader r(bytes, source);
  r.each_field([&](int field, int wire) {
    if (wire != 0 || (field != 3 && field != 24 && field != 35)) return false;
    const auto v = r.varint();
    if (field == 3) m.model_type = static_cast<int>(v);
    if (field == 24) m.treat_whitespace_as_suffix = v != 0;
    if (field == 35) m.byte_fallback = v != 0;
    return true;
  });
}

void parse_normalizer_spec(std::string_view bytes, const std::string& source, SpModelProto& m) {
  WireReader r(bytes, source);
  r.each_field([&](int field, int wire) {
    if (field == 1 && wire == 2)
      m.normalizer_name = std::string(r.bytes());
    else if ((field == 2 || field == 6) && wire == 2)
      (field == 2 ? m.has_charsmap : m.has_rules) = !r.bytes().empty();
    else if (wire == 0 && field >= 3 && field <= 5)
      (field == 3   ? m.add_dummy_prefix
       : field == 4 ? m.remove_extra_whitespaces
                    : m.escape_whitespaces) = r.varint() != 0;
    else
      return false;
    return true;
  });
}

}  // namespace

SpModelProto parse_sp_model_proto(std::string_view bytes, const std::string& source) {
  SpModelProto m;
  WireReader r(bytes, source);
  r.each_field([&](int field, int wire) {
    if (wire != 2 || field < 1 || field > 3) return false;
    const std::string_view value = r.bytes();
    if (field == 1) m.pieces.push_back(parse_piece(value, source));
    if (field == 2) parse_trainer_spec(value, source, m);
    if (field == 3) parse_normalizer_spec(value, source, m);
    return true;
  });
  return m;
}

std::unique_ptr<SpBpeTokenizer> sp_bpe_for_model(const SpModelProto& m, const std::string& source) {
  const bool identity = m.normalizer_name == "identity" && !m.has_charsmap && !m.has_rules;
  if (m.model_type != 2 || !identity || m.remove_extra_whitespaces || !m.escape_whitespaces ||
      m.treat_whitespace_as_suffix || !m.byte_fallback)
    return nullptr;
  using json = nlohmann::json;
  std::unordered_map<std::string, int> id_of;
  json vocab = json::object();
  std::string unk;
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    if (!id_of.emplace(p.piece, static_cast<int>(i)).second) return nullptr;  // a repeated piece: not a BPE vocabulary
    vocab[p.piece] = i;
    if (p.type == SpModelProto::kUnknown) unk = p.piece;
  }
  // Every split of a normal piece into two pieces, by the merged piece's score, then the halves' ids.
  std::vector<std::tuple<float, int, int, int>> splits;  // -score, left id, right id, merged id
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    if (p.type != SpModelProto::kNormal) continue;
    for (size_t cut = 1; cut < p.piece.size(); ++cut) {
      if ((static_cast<uint8_t>(p.piece[cut]) & 0xC0) == 0x80) continue;  // inside a character
      const auto l = id_of.find(p.piece.substr(0, cut)), r = id_of.find(p.piece.substr(cut));
      if (l != id_of.end() && r != id_of.end()) splits.emplace_back(-p.score, l->second, r->second, int(i));
    }
  }
  std::stable_sort(splits.begin(), splits.end());
  json merges = json::array();
  for (const auto& [score, l, r, merged] : splits)
    merges.push_back({m.pieces[size_t(l)].piece, m.pieces[size_t(r)].piece});
  json normalizers = json::array();
  if (m.add_dummy_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}});
  normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}});
  const json tokenizer = {{"version", "1.0"},
                          {"added_tokens", json::array()},
                          {"normalizer", {{"type", "Sequence"}, {"normalizers", normalizers}}},
                          {"pre_tokenizer", nullptr},
                          {"post_processor", nullptr},
                          {"decoder", nullptr},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", unk.empty() ? json(nullptr) : json(unk)},
                            {"fuse_unk", true},
                            {"byte_fallback", true},
                            {"vocab", vocab},
                            {"merges", merges}}}};
  return SpBpeTokenizer::from_parsed(tokenizer, source);
}

}  // namespace tandem
