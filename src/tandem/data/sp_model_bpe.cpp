#include "tandem/data/sp_model_bpe.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <tuple>
#include <unordered_map>

#include "tandem/core/error.h"

namespace tandem {

// Note [SentencePiece model as BPE]
// libsentencepiece (Debian's 0.1.97) encodes a BPE model two to four times slower than the
// SentencePiece-style BPE reader of tokenizer.json (sp_bpe_tokenizer.h), which already gives the
// ids `tokenizers` gives for the tokenizer.json transformers converts such a model to. So a BPE
// model is encoded by that reader over the converted form of the model:
// - the vocabulary is the pieces by id; the merges are every split of a piece into two pieces of the
//   vocabulary, ranked by the merged piece's score (higher first), then by the two halves' ids,
//   which is the order SentencePiece's BPE applies them in;
// - the model BPE with the model's byte_fallback and fuse_unk (the package gives a run of unknown
//   characters one unknown piece), unk_token the unknown piece; no pre-tokenizer, so the whole
//   normalized text is one word, as SentencePiece merges it;
// - the normalizer: for a model whose text passes unchanged but for whitespace (normalization
//   "identity", spaces kept and escaped as U+2581, Llama 2's kind) the reader's own Prepend("▁")
//   (with the dummy prefix) and Replace(" ", "▁"); for any other (NFKC, collapsed whitespace, as
//   SentencePiece's defaults have it) the model's own normalization (Note [SentencePiece
//   normalization]) first, and none in the reader.
// User-defined pieces are matched in the text by SentencePiece; a text that holds one is left to the
// library (the prefix it adds around them differs from tokenizers' split at added tokens). Control
// pieces (<s>, </s>) are never matched in a text, by either. Decoding and everything else stay the
// library's; tests/python/test_tokenizers_parity.py holds the ids equal to the sentencepiece package's.

std::vector<TokenId> SpModelBpe::encode(std::string_view text) const {
  if (!normalizer_) return bpe_->encode(text, SpecialTokens::kOmit);
  return bpe_->encode(normalizer_->normalize(text), SpecialTokens::kOmit);
}

std::unique_ptr<SpModelBpe> sp_bpe_for_model(const SpModelProto& m, const std::string& source) {
  if (m.model_type != 2 || m.treat_whitespace_as_suffix) return nullptr;
  const bool identity = m.normalizer_name == "identity" && m.charsmap.empty() && m.rules.empty() &&
                        !m.remove_extra_whitespaces && m.escape_whitespaces;
  using json = nlohmann::json;
  std::unordered_map<std::string, int> id_of;
  json vocab = json::object();
  std::string unk;
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    if (!id_of.emplace(p.piece, static_cast<int>(i)).second) return nullptr;  // a repeated piece: not a BPE vocabulary
    vocab[p.piece] = i;
    if (p.type == SpModelProto::kUnknown) unk = p.piece;
  }
  // Every split of a normal piece into two pieces, by the merged piece's score, then the halves' ids.
  std::vector<std::tuple<float, int, int, int>> splits;  // -score, left id, right id, merged id
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    if (p.type != SpModelProto::kNormal) continue;
    for (size_t cut = 1; cut < p.piece.size(); ++cut) {
      if ((static_cast<uint8_t>(p.piece[cut]) & 0xC0) == 0x80) continue;  // inside a character
      const auto l = id_of.find(p.piece.substr(0, cut)), r = id_of.find(p.piece.substr(cut));
      if (l != id_of.end() && r != id_of.end()) splits.emplace_back(-p.score, l->second, r->second, int(i));
    }
  }
  std::stable_sort(splits.begin(), splits.end());
  json merges = json::array();
  for (const auto& [score, l, r, merged] : splits)
    merges.push_back({m.pieces[size_t(l)].piece, m.pieces[size_t(r)].piece});
  json normalizer = nullptr;
  if (identity) {
    json normalizers = json::array();
    if (m.add_dummy_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}});
    normalizers.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}});
    normalizer = {{"type", "Sequence"}, {"normalizers", normalizers}};
  }
  const json tokenizer = {{"version", "1.0"},
                          {"added_tokens", json::array()},
                          {"normalizer", normalizer},
                          {"pre_tokenizer", nullptr},
                          {"post_processor", nullptr},
                          {"decoder", nullptr},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", unk.empty() ? json(nullptr) : json(unk)},
                            {"fuse_unk", true},
                            {"byte_fallback", m.byte_fallback},
                            {"vocab", vocab},
                            {"merges", merges}}}};
  std::unique_ptr<SpModelBpe> out(new SpModelBpe());
  out->bpe_ = SpBpeTokenizer::from_parsed(tokenizer, source);
  if (!identity) out->normalizer_ = std::make_unique<SpNormalizer>(m, source);
  return out;
}

}  // namespace tandem
