#include "tandem/io/config_file.h"

#include "tandem/core/log.h"
#include "tandem/io/config_layers.h"

namespace tandem {

void load_config_file(Config& cfg, const std::string& path) {
  std::vector<std::string> warnings;
  config_file_layer(path).apply(cfg, warnings);
  for (const auto& w : warnings) log::warn(w);
}

}  // namespace tandem
