#pragma once
// A SentencePiece BPE model file (tokenizer.model) encoded by the SentencePiece-style BPE reader of
// tokenizer.json, at that reader's speed (Note [SentencePiece model as BPE]). No libsentencepiece
// here: the model's protobuf is read from its bytes.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/data/sp_bpe_tokenizer.h"
#include "tandem/data/sp_model_proto.h"
#include "tandem/data/sp_normalizer.h"

namespace tandem {

/// Encodes a text holding none of the model's user-defined pieces as the `sentencepiece` package
/// does with a BPE model.
class SpModelBpe {
 public:
  std::vector<TokenId> encode(std::string_view text) const;

 private:
  friend std::unique_ptr<SpModelBpe> sp_bpe_for_model(const SpModelProto&, const std::string&);
  SpModelBpe() = default;

  std::unique_ptr<SpNormalizer> normalizer_;  // null: the BPE's own Prepend/Replace (identity models)
  std::unique_ptr<SpBpeTokenizer> bpe_;
};

/// The BPE encoder of `model`; null for a model it cannot stand for (not BPE, whitespace as a
/// suffix, a piece twice).
std::unique_ptr<SpModelBpe> sp_bpe_for_model(const SpModelProto& model, const std::string& source);

}  // namespace tandem
