#pragma once
// A SentencePiece char model file (tokenizer.model, model_type char) encoded without
// libsentencepiece (Note [SentencePiece char model]): the model's normalization, then one piece a
// character.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tandem/data/sp_model_proto.h"
#include "tandem/data/sp_normalizer.h"

namespace tandem {

/// Encodes a text holding none of the model's user-defined pieces as the `sentencepiece` package
/// 0.2.3 does with a char model.
class SpChar {
 public:
  std::vector<int> encode(std::string_view text) const;

 private:
  friend std::unique_ptr<SpChar> sp_char_for_model(const SpModelProto&, const std::string&);
  SpChar(const SpModelProto& model, const std::string& source);

  SpNormalizer normalizer_;
  int ascii_[128];                        // the id of each ASCII character's piece, -1: none
  std::unordered_map<uint32_t, int> id_;  // the other characters' pieces, by their UTF-8 bytes
  int unk_ = -1;
  std::vector<int> byte_ids_;  // <0x00>..<0xFF> with byte_fallback; empty without
};

/// The char encoder of `model`; null for a model that is not char or puts whitespace after pieces.
std::unique_ptr<SpChar> sp_char_for_model(const SpModelProto& model, const std::string& source);

}  // namespace tandem
