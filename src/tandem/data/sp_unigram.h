#pragma once
// A SentencePiece unigram model file (tokenizer.model: T5, ALBERT, XLNet, and SentencePiece's
// default) encoded without libsentencepiece (Note [SentencePiece unigram]): the model's compiled
// normalization (Note [SentencePiece normalization]) and the best segmentation by its pieces' scores.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/data/sp_model_proto.h"
#include "tandem/data/sp_normalizer.h"

namespace tandem {

/// Encodes a text as the `sentencepiece` package 0.2.3 does with a unigram model.
class SpUnigram {
 public:
  std::vector<int> encode(std::string_view text) const;

 private:
  friend std::unique_ptr<SpUnigram> sp_unigram_for_model(const SpModelProto&, const std::string&);
  SpUnigram(const SpModelProto& model, const std::string& source);
  void build_trie(const std::vector<std::pair<std::string, int32_t>>& pieces);
  struct BestPath {
    double score = 0;    // in double: a float sum over a long text loses close paths' difference
    int32_t start = -1;  // where the path's last piece starts; -1: not reached
    int32_t id = -1;     // that piece
  };
  /// The ids of the best segmentation of normalized text.
  std::vector<int> encode_normalized(std::string_view normalized) const;
  void best_paths(std::string_view normalized, BestPath* best) const;

  SpNormalizer normalizer_;
  // A byte trie of the pieces, its edges in one array: node v's are [first_[v], first_[v + 1]) of
  // byte_ and to_, sorted by byte; root_ the root's by byte (-1: none). piece_[v]: the piece ending
  // at v, -1 for none.
  std::vector<int32_t> first_, to_, piece_;
  std::vector<uint8_t> byte_;
  int32_t root_[256];
  std::vector<double> score_;
  int unk_ = -1;
  float unk_score_ = 0;
  std::vector<int> byte_ids_;  // <0x00>..<0xFF> with byte_fallback; empty without
};

/// The unigram encoder of `model`; null for a model that is not unigram or puts whitespace after
/// pieces (treat_whitespace_as_suffix).
std::unique_ptr<SpUnigram> sp_unigram_for_model(const SpModelProto& model, const std::string& source);

}  // namespace tandem
