#pragma once
// The parts of a Hugging Face tokenizer.json that every model kind reads alike: checked access to
// its members, the post-processor's template, the choice of BOS and EOS, and which of tandem's
// readers a file is for (Note [Two kinds of BPE tokenizer.json]).

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/data/tokenizer.h"

namespace tandem::detail {

using json = nlohmann::json;

/// The id of a stored token (added tokens first, then the model's vocabulary), or nullopt.
using FindToken = std::function<std::optional<TokenId>(std::string_view)>;

/// `text` parsed; UserError naming `source` when it is not JSON.
json parse_tokenizer_json(const std::string& text, const std::string& source);

/// j[key]; UserError naming `where` when j is not an object holding it.
const json& member(const json& j, const char* key, const std::string& where);

/// A token id as a tokenizer.json gives it: an integer in [0, 2^31); UserError naming `where`
/// otherwise.
TokenId token_id(const json& v, const std::string& where);

/// j["type"], or "" when j has none.
std::string type_of(const json& j);

/// Whether tokenizer.json's BPE model is SentencePiece-style (BPE over characters, with
/// byte_fallback or a Metaspace pre-tokenizer) rather than byte-level.
bool is_sentencepiece_style_bpe(const json& tokenizer);

/// What the post-processor puts around a single text.
struct TokenTemplate {
  std::vector<TokenId> before, after;
};

/// Reads TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel (nothing) and a Sequence
/// of them; UserError for others.
TokenTemplate parse_post_processor(const json& processor, const std::string& source, const FindToken& find);

/// BOS and EOS: the names given (tokenizer_config.json, --eos), else the template's first token and
/// the usual names.
std::pair<std::optional<TokenId>, std::optional<TokenId>> choose_bos_eos(const SpecialTokenNames& names,
                                                                         const TokenTemplate& tmpl,
                                                                         const std::string& source,
                                                                         const FindToken& find);

/// Tokenizer::description of a tokenizer.json: "<kind> from <source>: N tokens (A added), BOS .., EOS ..".
std::string describe_json_tokenizer(const char* kind, const std::string& source, const std::vector<std::string>& stored,
                                    size_t added, std::optional<TokenId> bos, std::optional<TokenId> eos);

/// The vocabulary of model.vocab (stored form -> id); UserError for an id out of range.
std::vector<std::pair<std::string, TokenId>> parse_vocab(const json& model, const std::string& source);

}  // namespace tandem::detail
