#include "tandem/data/sp_model_proto.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "tandem/core/error.h"

namespace tandem {

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
      (field == 2 ? m.charsmap : m.rules) = std::string(r.bytes());
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

std::vector<int> sp_byte_ids(const SpModelProto& m, const std::string& source) {
  if (!m.byte_fallback) return {};
  std::vector<int> ids(256, -1);
  for (size_t id = 0; id < m.pieces.size(); ++id) {
    const auto& p = m.pieces[id];
    unsigned byte = 0;
    if (p.type == SpModelProto::kByte && p.piece.size() == 6 && std::sscanf(p.piece.c_str(), "<0x%2X>", &byte) == 1 &&
        byte < 256)
      ids[byte] = static_cast<int>(id);
  }
  for (const int id : ids)
    TANDEM_CHECK(id >= 0, source, " falls back to bytes but lacks a byte piece; the model file is damaged");
  return ids;
}

}  // namespace tandem
