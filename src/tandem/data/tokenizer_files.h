#pragma once
// Finding and opening a tokenizer: `--tokenizer byte`, a tokenizer.json or tokenizer.model file, or a
// folder (a Hugging Face model folder, a tandem checkpoint) that holds one, with the settings of
// the folder's tokenizer_config.json.

#include <memory>
#include <optional>
#include <string>

#include "tandem/data/tokenizer.h"

namespace tandem {

/// A model folder's tokenizer settings (tokenizer_config.json); each unset when absent.
struct TokenizerConfig {
  std::optional<std::string> bos_token, eos_token;
  std::optional<bool> add_bos_token, add_eos_token;
  /// The chat template's Jinja text ("" when none; chat_template.jinja when the config has none).
  /// serve/chat_format.h names its family.
  std::string chat_template;
};

/// Where a tokenizer comes from.
struct TokenizerSource {
  std::string path;         ///< as given
  std::string file;         ///< the tokenizer.json or tokenizer.model to read; "" for the byte tokenizer
  std::string sibling;      ///< tokenizer.model beside a tokenizer.json, read when tandem cannot read the JSON
  std::string config_file;  ///< tokenizer_config.json read, "" when none
  TokenizerConfig config;
};

/// Locates the tokenizer of `path`: "byte" (tandem's byte models); a tokenizer.json or *.model file;
/// a folder holding tokenizer.json, else tokenizer.model, else a byte model's config.json
/// (vocab_size 256). UserError naming the path and the fix when there is none.
TokenizerSource find_tokenizer(const std::string& path);

/// Reads a tokenizer_config.json; UserError when it is not valid JSON.
TokenizerConfig read_tokenizer_config(const std::string& path);

/// Opens what find_tokenizer found; `overrides` (e.g. --eos) take precedence over the config's names.
std::unique_ptr<Tokenizer> open_tokenizer(const TokenizerSource& source, const SpecialTokenNames& overrides = {});

/// find_tokenizer then open_tokenizer.
std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path);

}  // namespace tandem
