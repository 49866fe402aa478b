#pragma once
// The CLI's training batches for a Python loop (tandem.data.TokenBatches): data.path,
// train.micro_batch, train.seq_len and train.seed as `tandem train` reads them.

#include <torch/torch.h>

#include <memory>
#include <utility>

#include "tandem/core/config.h"
#include "tandem/data/dataset.h"
#include "tandem/data/loader.h"

namespace tandem {

class TokenBatches {
 public:
  /// `rows` per batch (0 = train.micro_batch) from `first_row` of each global batch; every token
  /// must be below `vocab_size`. UserError without train.seq_len.
  TokenBatches(const Config& cfg, int64_t vocab_size, int64_t rows, int64_t first_row);
  /// (B, T) int64 inputs and targets (inputs shifted by one), on the CPU.
  std::pair<torch::Tensor, torch::Tensor> next();
  int64_t position() const { return loader_->position(); }
  void seek(int64_t position) { loader_->seek(position); }

 private:
  DataSplits data_;
  std::unique_ptr<BatchLoader> loader_;
};

}  // namespace tandem
