#pragma once
// A SentencePiece BPE model file (tokenizer.model) read as the SentencePiece-style BPE of
// tokenizer.json, for encoding at that reader's speed (Note [SentencePiece model as BPE]). No
// libsentencepiece here: the model's protobuf is read from its bytes.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/data/sp_bpe_tokenizer.h"

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
  bool has_charsmap = false, has_rules = false;  ///< a compiled normalization or rules of its own
  bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
};

/// Reads the fields above from a serialized ModelProto; UserError naming `source` when the bytes
/// are not one.
SpModelProto parse_sp_model_proto(std::string_view bytes, const std::string& source);

/// The SentencePiece-style BPE tokenizer that gives `model`'s ids for a text holding none of its
/// user-defined pieces; null for a model it cannot stand for (not BPE, a normalization other than
/// identity, whitespace collapsed, not escaped or as a suffix, no byte fallback).
std::unique_ptr<SpBpeTokenizer> sp_bpe_for_model(const SpModelProto& model, const std::string& source);

}  // namespace tandem
