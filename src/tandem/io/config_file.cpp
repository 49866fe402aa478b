#include "tandem/io/config_file.h"

#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/io/deepspeed.h"

namespace tandem {

void load_config_file(Config& cfg, const std::string& path) {
  const auto dot = path.rfind('.');
  const std::string ext = dot == std::string::npos ? "" : to_lower(path.substr(dot + 1));
  if (ext == "json") {
    const auto r = load_deepspeed_config(cfg, path);
    if (!r.ignored_keys.empty())
      log::warn(path + ": DeepSpeed keys without a tandem equivalent were ignored: " + join(r.ignored_keys, ", "));
  } else if (ext == "yaml" || ext == "yml") {
    load_yaml_config(cfg, path);
  } else {
    TANDEM_FAIL("config file '", path, "' has an unknown extension; use .yaml/.yml (tandem) or .json (DeepSpeed)");
  }
}

}  // namespace tandem
