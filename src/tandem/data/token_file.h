#pragma once
// Token sources: memory-mapped token files (nanoGPT raw uint16; llm.c with a 1024-byte header),
// byte-level text, and in-memory corpora. All read as int64 token ids.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/core/config.h"  // TokenFormat (data.format)

namespace tandem {

/// A read-only view of token ids, owning (a share of) its storage.
class TokenBuffer {
 public:
  TokenBuffer() = default;

  /// Opens a file; validates the llm.c header (magic, version, token count against the file size)
  /// or the raw file size. Throws UserError with cause and fix on any mismatch.
  static TokenBuffer open(const std::string& path, TokenFormat format = TokenFormat::kAuto);

  /// Wraps tokens held in memory (the synthetic corpus, byte-tokenised text).
  static TokenBuffer from_tokens(std::vector<uint16_t> tokens, std::string description);

  int64_t size() const { return size_; }
  int64_t at(int64_t i) const;
  /// Copies tokens [begin, begin+n) into out as int64.
  void read(int64_t begin, int64_t n, int64_t* out) const;
  /// A sub-range sharing the storage.
  TokenBuffer slice(int64_t begin, int64_t end) const;
  /// Largest token id (scans the buffer).
  int64_t max_token() const;
  /// One line: format, token count, source.
  const std::string& description() const { return description_; }
  int bytes_per_token() const { return bytes_per_token_; }

 private:
  struct Storage;
  std::shared_ptr<Storage> storage_;
  const unsigned char* data_ = nullptr;  // first token of this view
  int bytes_per_token_ = 2;
  int64_t size_ = 0;
  std::string description_;
};

/// Byte-level tokenizer: one token per byte (vocabulary 256).
std::vector<uint16_t> byte_tokenize(const std::string& text);
std::string byte_detokenize(const std::vector<int64_t>& tokens);

/// llm.c header constants.
inline constexpr int32_t kLlmcMagicU16 = 20240520;
inline constexpr int32_t kLlmcMagicU32 = 20240801;
inline constexpr int32_t kLlmcVersionU16 = 1;
inline constexpr int32_t kLlmcVersionU32 = 7;
inline constexpr int64_t kLlmcHeaderBytes = 1024;

}  // namespace tandem
