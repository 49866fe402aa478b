#include "tandem/python/token_batches.h"

#include "tandem/core/error.h"

namespace tandem {

TokenBatches::TokenBatches(const Config& cfg, int64_t vocab_size, int64_t rows, int64_t first_row)
    : data_(open_data(cfg.data)) {
  TANDEM_CHECK(cfg.train.seq_len > 0, "tandem.data.TokenBatches needs train.seq_len (> 0)");
  loader_ = std::make_unique<BatchLoader>(data_.train, rows > 0 ? rows : cfg.train.micro_batch, cfg.train.seq_len,
                                          cfg.train.seed, torch::Device(torch::kCPU), cfg.data.prefetch, vocab_size,
                                          "training", first_row);
}

std::pair<torch::Tensor, torch::Tensor> TokenBatches::next() {
  Batch b = loader_->next();
  return {b.inputs, b.targets};
}

}  // namespace tandem
