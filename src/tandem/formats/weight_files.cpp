#include "tandem/formats/weight_files.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/formats/json_text.h"
#include "tandem/formats/safetensors.h"

namespace tandem {

namespace fs = std::filesystem;

namespace {
constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";
}  // namespace

bool has_weight_files(const std::string& dir) {
  return fs::exists(fs::path(dir) / kSingle) || fs::exists(fs::path(dir) / kIndex);
}

WeightFiles::WeightFiles(const std::string& dir, const std::string& base) {
  const fs::path d(dir);
  std::map<std::string, std::shared_ptr<SafetensorsFile>> stored;  // the files' own names
  if (fs::exists(d / kSingle)) {
    source_ = (d / kSingle).string();
    auto f = std::make_shared<SafetensorsFile>(source_);
    for (const auto& n : f->names()) stored[n] = f;
  } else {
    source_ = (d / kIndex).string();
    TANDEM_CHECK(fs::exists(d / kIndex), "no ", kSingle, " or ", kIndex, " in '", dir,
                 "'; give a folder with safetensors weights (convert .bin checkpoints first)");
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
      TANDEM_CHECK(f->contains(name), f->path(), " does not hold tensor '", name, "' although ", source_, " says so");
      stored[name] = f;
    }
  }
  for (const auto& [name, file] : stored) {
    const bool bare =
        !base.empty() && name.rfind(base, 0) != 0 && name.rfind("lm_head.", 0) != 0 && !stored.count(base + name);
    by_name_[bare ? base + name : name] = Entry{file, name};
  }
}

WeightFiles::~WeightFiles() = default;

std::vector<std::string> WeightFiles::names() const {
  std::vector<std::string> out;
  for (const auto& [name, entry] : by_name_) out.push_back(name);
  return out;
}

std::optional<torch::Tensor> WeightFiles::tensor(const std::string& name) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second.file->tensor(it->second.stored);
}

TensorLookup WeightFiles::lookup() const {
  return [this](const std::string& name) { return tensor(name); };
}

}  // namespace tandem
