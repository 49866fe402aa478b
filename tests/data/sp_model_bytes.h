#pragma once
// SentencePiece model files written in the tests, field by field in protobuf's wire format as the
// library writes a ModelProto: a small BPE-like vocabulary whose model type, byte fallback and
// normalizer the tests choose.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace tandem::test {

inline const std::string kSp = "\xE2\x96\x81";  // '▁' (U+2581)

// Protobuf's wire format, as the library writes a ModelProto.
inline std::string varint(uint64_t v) {
  std::string out;
  do {
    const auto b = static_cast<uint8_t>(v & 0x7F);
    v >>= 7;
    out.push_back(static_cast<char>(v ? b | 0x80 : b));
  } while (v);
  return out;
}
inline std::string field(int number, const std::string& bytes) {
  return varint(uint64_t(number) << 3 | 2) + varint(bytes.size()) + bytes;
}
inline std::string flag(int number, uint64_t v) { return varint(uint64_t(number) << 3) + varint(v); }
inline std::string piece(const std::string& text, float score, int type) {
  std::string f(4, '\0');
  std::memcpy(f.data(), &score, 4);
  return field(1, field(1, text) + varint(2 << 3 | 5) + f + flag(3, uint64_t(type)));
}

struct ModelBytes {
  int model_type = 2;
  bool byte_fallback = true, add_dummy_prefix = true, remove_extra_whitespaces = false;
  std::string normalizer = "identity";
  std::vector<std::pair<std::string, float>> extra;  // normal pieces after <sep>, with their scores
  std::string build() const {
    // <unk> <s> </s>, the 256 byte pieces, then a, b, ▁, ▁a, ab, ▁ab (scores: later merges lower).
    std::string out = piece("<unk>", 0, 2) + piece("<s>", 0, 3) + piece("</s>", 0, 3);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      out += piece(name, 0, 6);
    }
    out += piece("a", -10, 1) + piece("b", -11, 1) + piece(kSp, -12, 1) + piece(kSp + "a", -1, 1) + piece("ab", -2, 1) +
           piece(kSp + "ab", -3, 1) + piece("<sep>", 0, 4);
    for (const auto& [text, score] : extra) out += piece(text, score, 1);
    out += field(2, flag(3, uint64_t(model_type)) + flag(35, byte_fallback) + flag(24, 0));
    out += field(3, field(1, normalizer) + flag(3, add_dummy_prefix) + flag(4, remove_extra_whitespaces) + flag(5, 1));
    return out;
  }
};

}  // namespace tandem::test
