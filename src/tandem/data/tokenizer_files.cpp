#include "tandem/data/tokenizer_files.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/data/bpe_tokenizer.h"
#include "tandem/data/byte_tokenizer.h"
#include "tandem/data/sentencepiece_tokenizer.h"
#include "tandem/data/sp_bpe_tokenizer.h"
#include "tandem/data/tokenizer_json.h"

namespace fs = std::filesystem;

namespace tandem {

namespace {

using json = nlohmann::json;

constexpr const char* kFix =
    "give --tokenizer a tokenizer.json, a tokenizer.model, a model folder holding one, or 'byte' for tandem's "
    "byte models";

// A token setting: a string, or an AddedToken object {"content": ...}; nullopt for null or absent.
std::optional<std::string> token_name(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

std::optional<bool> flag(const json& config, const char* key) {
  if (config.contains(key) && config[key].is_boolean()) return config[key].get<bool>();
  return std::nullopt;
}

// "chat_template": a string, or a list of {"name", "template"} of which "default" is the one.
std::string chat_template_of(const json& config) {
  if (!config.contains("chat_template")) return "";
  const json& t = config["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (!t.is_array()) return "";
  const auto text_of = [](const json& entry) {
    return entry.is_object() && entry.contains("template") && entry["template"].is_string()
               ? entry["template"].get<std::string>()
               : std::string();
  };
  for (const auto& entry : t)
    if (entry.is_object() && entry.contains("name") && entry["name"] == "default") return text_of(entry);
  return t.empty() ? "" : text_of(t[0]);
}

// Whether a folder is a tandem byte model: its config.json says vocab_size 256.
bool is_byte_model_folder(const fs::path& dir) {
  const fs::path config = dir / "config.json";
  if (!fs::is_regular_file(config)) return false;
  const json j = json::parse(read_file(config.string(), "model config"), nullptr, false);
  return !j.is_discarded() && j.is_object() && j.contains("vocab_size") && j["vocab_size"] == 256;
}

// Whether a file holds JSON (tokenizer.json) rather than a SentencePiece protobuf.
bool looks_like_json(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  char c = 0;
  while (in.get(c))
    if (!std::isspace(static_cast<unsigned char>(c))) return c == '{';
  return false;
}

void find_in_folder(const fs::path& dir, TokenizerSource& s) {
  const fs::path json_file = dir / "tokenizer.json", model_file = dir / "tokenizer.model";
  if (fs::is_regular_file(json_file)) {
    s.file = json_file.string();
    if (fs::is_regular_file(model_file)) s.sibling = model_file.string();
  } else if (fs::is_regular_file(model_file)) {
    s.file = model_file.string();
  } else {
    TANDEM_CHECK(is_byte_model_folder(dir), "no tokenizer in '", s.path,
                 "': it holds neither tokenizer.json nor tokenizer.model; copy them from the model the weights came "
                 "from, or ",
                 kFix);
  }
}

// A tokenizer.json, read by the reader its BPE model needs (Note [Two kinds of BPE tokenizer.json]).
std::unique_ptr<Tokenizer> open_tokenizer_json(const std::string& file, const SpecialTokenNames& names) {
  const json j = detail::parse_tokenizer_json(read_file(file, "tokenizer file"), file);
  if (detail::is_sentencepiece_style_bpe(j)) return SpBpeTokenizer::from_parsed(j, file, names);
  return BpeTokenizer::from_parsed(j, file, names);
}

}  // namespace

TokenizerConfig read_tokenizer_config(const std::string& path) {
  json j;
  try {
    j = json::parse(read_file(path, "tokenizer config"));
  } catch (const json::exception& e) {
    TANDEM_FAIL("'", path, "' is not valid JSON (", e.what(), "); fix or remove it");
  }
  TokenizerConfig c;
  if (!j.is_object()) return c;
  c.bos_token = token_name(j, "bos_token");
  c.eos_token = token_name(j, "eos_token");
  c.add_bos_token = flag(j, "add_bos_token");
  c.add_eos_token = flag(j, "add_eos_token");
  c.chat_template = chat_template_of(j);
  return c;
}

TokenizerSource find_tokenizer(const std::string& path) {
  TokenizerSource s;
  s.path = path;
  if (path == "byte") return s;
  TANDEM_CHECK(!path.empty() && fs::exists(path), "tokenizer '", path, "' does not exist; ", kFix);
  const fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  if (fs::is_directory(path))
    find_in_folder(dir, s);
  else
    s.file = path;
  const fs::path config = (dir.empty() ? fs::path(".") : dir) / "tokenizer_config.json";
  if (fs::is_regular_file(config)) {
    s.config_file = config.string();
    s.config = read_tokenizer_config(s.config_file);
  }
  const fs::path jinja = (dir.empty() ? fs::path(".") : dir) / "chat_template.jinja";
  if (s.config.chat_template.empty() && fs::is_regular_file(jinja))
    s.config.chat_template = read_file(jinja.string(), "chat template");
  return s;
}

std::unique_ptr<Tokenizer> open_tokenizer(const TokenizerSource& source, const SpecialTokenNames& overrides) {
  if (source.file.empty()) return std::make_unique<ByteTokenizer>();
  SpecialTokenNames names{source.config.bos_token, source.config.eos_token};
  if (overrides.bos) names.bos = overrides.bos;
  if (overrides.eos) names.eos = overrides.eos;
  SentencePieceTemplate tmpl;
  tmpl.add_bos = source.config.add_bos_token.value_or(true);
  tmpl.add_eos = source.config.add_eos_token.value_or(false);
  if (!looks_like_json(source.file)) return SentencePieceTokenizer::from_file(source.file, names, tmpl);
  try {
    return open_tokenizer_json(source.file, names);
  } catch (const UserError& e) {
    if (source.sibling.empty()) throw;
    log::info(std::string("reading ") + source.sibling + " (" + one_line(e.what()) + ")");
    return SentencePieceTokenizer::from_file(source.sibling, names, tmpl);
  }
}

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path) { return open_tokenizer(find_tokenizer(path)); }

}  // namespace tandem
