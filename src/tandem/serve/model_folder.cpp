#include "tandem/serve/model_folder.h"

#include <filesystem>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/io/checkpoint.h"
#include "tandem/io/hf.h"
#include "tandem/formats/json_text.h"
#include "tandem/formats/weight_files.h"
#include "tandem/models/family.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

bool has_weights(const fs::path& dir) { return fs::exists(dir / "config.json") && has_weight_files(dir.string()); }

std::vector<TokenId> eos_ids_of(const std::string& config_path) {
  const auto j = parse_json_text(read_file(config_path, "model config"), config_path);
  std::vector<TokenId> ids;
  if (!j.contains("eos_token_id")) return ids;
  const auto& e = j["eos_token_id"];
  const auto add = [&](const nlohmann::json& v) {
    TANDEM_CHECK(v.is_number_integer(), config_path, ": eos_token_id must be a token id or a list of them");
    ids.push_back(v.get<TokenId>());
  };
  if (e.is_array())
    for (const auto& v : e) add(v);
  else if (!e.is_null())
    add(e);
  return ids;
}

}  // namespace

ModelFolder open_model_folder(const std::string& path) {
  std::error_code ec;
  TANDEM_CHECK(fs::is_directory(path, ec), "--checkpoint: '", path,
               "' is not a directory; give a tandem checkpoint (runs/<run>/checkpoints/step_N), a run directory or a "
               "Hugging Face model folder");
  ModelFolder m;
  m.dir = has_weights(path) ? path : resolve_checkpoint_dir(path, "--checkpoint");
  TANDEM_CHECK(has_weights(m.dir), "--checkpoint: '", m.dir,
               "' has no config.json with model.safetensors or model.safetensors.index.json; give a folder written "
               "by `tandem train` or transformers' save_pretrained");
  const std::string config = (fs::path(m.dir) / "config.json").string();
  m.spec = spec_from_hf_config(config);
  TANDEM_CHECK(m.spec.arch == Arch::kDecoder, config, ": generation runs decoder models (", supported_model_types(),
               "); this one is tandem's ", to_string(m.spec.arch), " model, which trains only");
  m.eos_ids = eos_ids_of(config);
  return m;
}

}  // namespace tandem
