#include "tandem/io/hf.h"

#include <filesystem>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/formats/safetensors.h"
#include "tandem/formats/tensor_use.h"
#include "tandem/formats/weight_files.h"
#include "tandem/models/family.h"

namespace fs = std::filesystem;

namespace tandem {

void load_hf_weights(Model& model, const std::string& dir) {
  const WeightFiles files(dir, family_names(model.spec().family).base);
  const TensorUse use(files.names(), dir);                           // Note [Every tensor used]
  if (model.spec().tie_embeddings) use.mark_used("lm_head.weight");  // transformers ties it to the embedding too
  model.load_hf_state_dict(use.recording(files.lookup()), dir);
  use.check_all_used();
}

void save_hf_model(Model& model, const std::string& dir) {
  write_file_synced((fs::path(dir) / "config.json").string(), hf_config_json(model.spec()));
  write_safetensors((fs::path(dir) / "model.safetensors").string(), model.hf_state_dict(), {{"format", "pt"}});
}

}  // namespace tandem
