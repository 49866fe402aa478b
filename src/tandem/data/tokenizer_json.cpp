#include "tandem/data/tokenizer_json.h"

#include "tandem/core/error.h"
#include "tandem/core/strings.h"

// Note [Two kinds of BPE tokenizer.json]
// Hugging Face writes two unrelated BPE tokenizers into the same format. Byte-level BPE (GPT-2,
// Llama 3, Qwen) maps every byte to a printable character and merges those (BpeTokenizer, Note
// [Byte-level BPE]). SentencePiece-style BPE (Llama 2, Mistral, Gemma, converted from a
// tokenizer.model) merges Unicode characters, writes spaces as U+2581 and spells a character
// outside its vocabulary as the <0xXX> tokens of its bytes (SpBpeTokenizer, Note [SentencePiece-
// style BPE]). The model's byte_fallback flag, or a Metaspace pre-tokenizer, tells them apart.

namespace tandem::detail {

json parse_tokenizer_json(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    TANDEM_FAIL(source, " is not valid JSON (", e.what(), "); re-download or re-save the tokenizer");
  }
}

const json& member(const json& j, const char* key, const std::string& where) {
  TANDEM_CHECK(j.is_object() && j.contains(key), where, " has no \"", key,
               "\"; is this a Hugging Face tokenizer.json (written by `tokenizers`)?");
  return j.at(key);
}

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
}

namespace {

// Whether `j` or one of its Sequence members has type `type`.
bool has_step(const json& j, const char* type) {
  if (type_of(j) == type) return true;
  for (const char* list : {"pretokenizers", "decoders", "normalizers"})
    if (j.is_object() && j.contains(list) && j[list].is_array())
      for (const auto& e : j[list])
        if (has_step(e, type)) return true;
  return false;
}

}  // namespace

bool is_sentencepiece_style_bpe(const json& t) {
  if (!t.is_object() || !t.contains("model") || type_of(t["model"]) != "BPE") return false;
  const json& model = t["model"];
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>())
    return true;
  const json none;
  const json& pre = t.contains("pre_tokenizer") ? t["pre_tokenizer"] : none;
  return has_step(pre, "Metaspace") && !has_step(pre, "ByteLevel");
}

namespace {

std::vector<TokenId> special_ids(const json& processor, const std::string& name, const std::string& source,
                                 const FindToken& find) {
  const json& specials = member(processor, "special_tokens", source + "'s post_processor");
  if (specials.contains(name)) {
    const std::string where = source + "'s post_processor special token '" + name + "'";
    const json& ids = member(specials[name], "ids", where);
    TANDEM_CHECK(ids.is_array(), where, ": ids must be a list of token ids");
    std::vector<TokenId> out;
    for (const auto& id : ids) out.push_back(token_id(id, where));
    return out;
  }
  const auto id = find(name);
  TANDEM_CHECK(id.has_value(), source, ": the post_processor's template names '", name, "', which it does not define");
  return {*id};
}

void read_template(const json& p, const std::string& source, const FindToken& find, TokenTemplate& out) {
  const std::string type = p.is_null() ? "" : type_of(p);
  if (type.empty() || type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const auto& q : member(p, "processors", source + "'s post_processor")) read_template(q, source, find, out);
  } else if (type == "TemplateProcessing") {
    bool after = false;
    for (const auto& piece : member(p, "single", source + "'s TemplateProcessing")) {
      if (piece.contains("Sequence")) {
        after = true;
        continue;
      }
      const auto name = member(piece, "SpecialToken", source + "'s template").at("id").get<std::string>();
      auto& into = after ? out.after : out.before;
      for (TokenId id : special_ids(p, name, source, find)) into.push_back(id);
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const json& pair = member(p, key, source + "'s " + type);
      TANDEM_CHECK(pair.is_array() && pair.size() == 2, source, ": the ", type, "'s ", key,
                   " must be [token, id], not ", pair.dump());
      (std::string(key) == "cls" ? out.before : out.after).push_back(token_id(pair[1], source + "'s " + key));
    }
  } else {
    TANDEM_FAIL(source, ": post_processor '", type, "' is not read by tandem (it reads TemplateProcessing, ",
                "ByteLevel, RobertaProcessing, BertProcessing and a Sequence of them)");
  }
}

}  // namespace

TokenTemplate parse_post_processor(const json& processor, const std::string& source, const FindToken& find) {
  TokenTemplate t;
  read_template(processor, source, find, t);
  return t;
}

std::pair<std::optional<TokenId>, std::optional<TokenId>> choose_bos_eos(const SpecialTokenNames& names,
                                                                         const TokenTemplate& tmpl,
                                                                         const std::string& source,
                                                                         const FindToken& find) {
  auto named = [&](const std::string& name, const char* what) -> std::optional<TokenId> {
    const auto id = find(name);
    TANDEM_CHECK(id.has_value(), source, " has no token '", name, "', which the ", what,
                 " names; fix the name (tokenizer_config.json or --eos)");
    return id;
  };
  auto first_of = [&](std::initializer_list<const char*> candidates) -> std::optional<TokenId> {
    for (const char* c : candidates)
      if (auto id = find(c)) return id;
    return std::nullopt;
  };
  const auto bos = names.bos              ? named(*names.bos, "BOS setting")
                   : !tmpl.before.empty() ? std::optional<TokenId>(tmpl.before.front())
                                          : first_of({"<|begin_of_text|>", "<s>", "<bos>"});
  const auto eos = names.eos ? named(*names.eos, "EOS setting")
                             : first_of({"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>"});
  return {bos, eos};
}

TokenId token_id(const json& v, const std::string& where) {
  TANDEM_CHECK(v.is_number_integer(), where, ": a token id must be an integer, not ", v.dump());
  const auto value = v.get<int64_t>();
  TANDEM_CHECK(value >= 0 && value < (int64_t{1} << 31), where, ": token id ", value, " is out of range");
  return static_cast<TokenId>(value);
}

std::vector<std::pair<std::string, TokenId>> parse_vocab(const json& model, const std::string& source) {
  std::vector<std::pair<std::string, TokenId>> out;
  for (const auto& [token, id] : member(model, "vocab", source + "'s model").items()) {
    TANDEM_CHECK(id.is_number_integer(), source, ": vocabulary id of '", token, "' must be an integer, not ",
                 id.dump());
    const auto value = id.get<int64_t>();
    TANDEM_CHECK(value >= 0 && value < (int64_t{1} << 31), source, ": vocabulary id ", value, " of '", token,
                 "' is out of range");
    out.emplace_back(token, static_cast<TokenId>(value));
  }
  return out;
}

std::string describe_json_tokenizer(const char* kind, const std::string& source, const std::vector<std::string>& stored,
                                    size_t added, std::optional<TokenId> bos, std::optional<TokenId> eos) {
  const auto name = [&](const std::optional<TokenId>& id) {
    return id ? "'" + stored[static_cast<size_t>(*id)] + "' (" + std::to_string(*id) + ")" : std::string("none");
  };
  return strprintf("%s from %s: %zu tokens (%zu added), BOS %s, EOS %s", kind, source.c_str(), stored.size(), added,
                   name(bos).c_str(), name(eos).c_str());
}

}  // namespace tandem::detail
