#include "tandem/data/tokenizer.h"

namespace tandem {

namespace {

// Bytes a well-formed sequence starting with `lead` has; 0 for a byte no sequence starts with.
int utf8_sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether `b` may follow `lead` as the second byte (the ranges that exclude overlong forms,
// surrogates and code points above U+10FFFF).
bool valid_second_byte(unsigned char lead, unsigned char b) {
  if (lead == 0xE0) return b >= 0xA0 && b <= 0xBF;
  if (lead == 0xED) return b >= 0x80 && b <= 0x9F;
  if (lead == 0xF0) return b >= 0x90 && b <= 0xBF;
  if (lead == 0xF4) return b >= 0x80 && b <= 0x8F;
  return b >= 0x80 && b <= 0xBF;
}

}  // namespace

int utf8_scan(std::string_view s, size_t i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  const int n = utf8_sequence_length(lead);
  if (n == 0) return -1;
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -k;
    const auto b = static_cast<unsigned char>(s[i + k]);
    const bool ok = k == 1 ? valid_second_byte(lead, b) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return -k;
  }
  return n;
}

const char* tokenizer_kind_name(TokenizerKind kind) {
  switch (kind) {
    case TokenizerKind::kByteLevelBpe:
      return "byte-level BPE";
    case TokenizerKind::kSentencePieceBpe:
      return "SentencePiece-style BPE";
    case TokenizerKind::kSentencePiece:
      return "SentencePiece";
    case TokenizerKind::kByte:
      return "byte";
  }
  return "?";
}

size_t utf8_complete_length(std::string_view bytes) {
  // Only the last three bytes can belong to an unfinished character.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const auto b = static_cast<unsigned char>(bytes[i]);
    if (b >= 0x80 && b <= 0xBF) continue;  // a continuation byte: look further back
    const int len = utf8_sequence_length(b);
    // A lead byte whose sequence is still short and so far well formed: hold it back.
    if (len > static_cast<int>(back) && utf8_scan(bytes, i) == -static_cast<int>(back)) return i;
    return n;
  }
  return n;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const int n = utf8_scan(bytes, i);
    if (n > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

}  // namespace tandem
