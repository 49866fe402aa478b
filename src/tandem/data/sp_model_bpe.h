#pragma once
// A SentencePiece BPE model file (tokenizer.model) read as the SentencePiece-style BPE of
// tokenizer.json, for encoding at that reader's speed (Note [SentencePiece model as BPE]). No
// libsentencepiece here: the model's protobuf is read from its bytes.

#include <memory>
#include <string>

#include "tandem/data/sp_bpe_tokenizer.h"
#include "tandem/data/sp_model_proto.h"

namespace tandem {

/// The SentencePiece-style BPE tokenizer that gives `model`'s ids for a text holding none of its
/// user-defined pieces; null for a model it cannot stand for (not BPE, a normalization other than
/// identity, whitespace collapsed, not escaped or as a suffix, no byte fallback).
std::unique_ptr<SpBpeTokenizer> sp_bpe_for_model(const SpModelProto& model, const std::string& source);

}  // namespace tandem
