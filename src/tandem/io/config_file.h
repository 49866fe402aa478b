#pragma once
// A configuration file by its extension: .yaml/.yml are tandem's keys (core/config.h), .json is a
// DeepSpeed config (io/deepspeed.h).

#include <string>

#include "tandem/core/config.h"

namespace tandem {

/// Loads `path` into cfg by extension; one warning lists the DeepSpeed keys it ignored.
void load_config_file(Config& cfg, const std::string& path);

}  // namespace tandem
