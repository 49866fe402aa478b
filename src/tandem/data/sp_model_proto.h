#pragma once
// The parts of a serialized SentencePiece ModelProto (tokenizer.model) that decide how a text is
// encoded, read from its protobuf bytes (no protobuf or libsentencepiece here).

#include <string>
#include <string_view>
#include <vector>

namespace tandem {

/// What of a serialized SentencePiece ModelProto decides how a text is encoded.
struct SpModelProto {
  /// SentencePiece's piece types.
  enum Type : int { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };
  struct Piece {
    std::string piece;
    float score = 0;
    int type = kNormal;
  };
  std::vector<Piece> pieces;
  int model_type = 1;  ///< 1 unigram, 2 BPE, 3 word, 4 char
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  std::string normalizer_name;
  std::string charsmap;  ///< the compiled normalization (Note [SentencePiece normalization]); empty: none
  std::string rules;     ///< normalization rules of its own (a TSV); empty: none
  bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
};

/// Reads the fields above from a serialized ModelProto; UserError naming `source` when the bytes
/// are not one.
SpModelProto parse_sp_model_proto(std::string_view bytes, const std::string& source);

/// The ids of the pieces <0x00> ... <0xFF> by byte where the model falls back to bytes; empty where
/// it does not. UserError naming `source` when one of them is missing.
std::vector<int> sp_byte_ids(const SpModelProto& model, const std::string& source);

}  // namespace tandem
