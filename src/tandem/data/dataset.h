#pragma once
#include <string>

#include "tandem/core/config.h"
#include "tandem/data/token_file.h"

namespace tandem {

/// The training and held-out token streams of a run.
struct DataSplits {
  TokenBuffer train, val;  // val.size() == 0 when nothing is held out
  std::string description;
};

/// Opens data.path ("synthetic", token file or text) and carves the held-out split.
DataSplits open_data(const DataConfig& cfg);

}  // namespace tandem
