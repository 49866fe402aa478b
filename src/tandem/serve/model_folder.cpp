#include "tandem/serve/model_folder.h"

#include <filesystem>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/io/checkpoint.h"
#include "tandem/io/hf.h"
#include "tandem/io/json_text.h"
#include "tandem/io/safetensors.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";

bool has_weights(const fs::path& dir) {
  return fs::exists(dir / "config.json") && (fs::exists(dir / kSingle) || fs::exists(dir / kIndex));
}

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
               "Hugging Face Llama folder");
  ModelFolder m;
  m.dir = has_weights(path) ? path : resolve_checkpoint_dir(path, "--checkpoint");
  TANDEM_CHECK(has_weights(m.dir), "--checkpoint: '", m.dir, "' has no config.json with ", kSingle, " or ", kIndex,
               "; give a folder written by `tandem train` or transformers' save_pretrained");
  const std::string config = (fs::path(m.dir) / "config.json").string();
  m.spec = spec_from_hf_config(config);
  TANDEM_CHECK(m.spec.arch == Arch::kLlama, config, ": `tandem generate` runs Llama models; this one is ",
               to_string(m.spec.arch));
  m.eos_ids = eos_ids_of(config);
  return m;
}

WeightFiles::WeightFiles(const std::string& dir) {
  const fs::path d(dir);
  if (fs::exists(d / kSingle)) {
    source_ = (d / kSingle).string();
    auto f = std::make_shared<SafetensorsFile>(source_);
    for (const auto& n : f->names()) by_name_[n] = f;
    return;
  }
  source_ = (d / kIndex).string();
  const auto j = parse_json_text(read_file(source_, "safetensors index"), source_);
  TANDEM_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), source_,
               ": missing the 'weight_map' object");
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files;
  for (const auto& [name, file] : j["weight_map"].items()) {
    TANDEM_CHECK(file.is_string(), source_, ": weight_map entry '", name, "' is not a file name");
    const auto shard = file.get<std::string>();
    TANDEM_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "..", source_, ": shard name '",
                 shard, "' must be a plain file name in the same directory");
    auto& f = files[shard];
    if (!f) {
      TANDEM_CHECK(fs::exists(d / shard), source_, " lists shard '", shard, "' which is missing from ", dir);
      f = std::make_shared<SafetensorsFile>((d / shard).string());
    }
    by_name_[name] = f;
  }
}

WeightFiles::~WeightFiles() = default;

std::optional<torch::Tensor> WeightFiles::tensor(const std::string& name) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end() || !it->second->contains(name)) return std::nullopt;
  return it->second->tensor(name);
}

TensorLookup WeightFiles::lookup() const {
  return [this](const std::string& name) { return tensor(name); };
}

}  // namespace tandem
