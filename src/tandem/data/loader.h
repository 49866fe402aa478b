#pragma once
// Batches of (inputs, targets) windows drawn from a TokenBuffer by a seeded, counter-based
// sampler (batch i depends only on the seed and i, so the position saved in a checkpoint is a
// single integer). A background thread prepares the next batches in pinned memory.

#include <torch/torch.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "tandem/data/token_file.h"

namespace tandem {

/// One micro-batch on the target device.
struct Batch {
  torch::Tensor inputs;   // (B, T) int64
  torch::Tensor targets;  // (B, T) int64, inputs shifted by one
  int64_t index = 0;      // sampler position of this batch
};

/// Window offsets of rows [first_row, first_row + batch) of batch `index`, each in [0, n_tokens - T - 1].
/// A row depends only on the seed, the index and its row number, so ranks that take disjoint rows
/// of one global batch see exactly what one process taking all of them sees.
std::vector<int64_t> sample_offsets(uint64_t seed, int64_t index, int64_t batch, int64_t seq_len, int64_t n_tokens,
                                    int64_t first_row = 0);

/// Prefetching batch loader over one split.
class BatchLoader {
 public:
  /// `vocab_limit`: every token must be below it (the model's vocabulary); checked per batch.
  /// `first_row`: this loader's first row of each global batch (data parallel: a rank's share).
  BatchLoader(TokenBuffer tokens, int64_t batch, int64_t seq_len, uint64_t seed, torch::Device device, int64_t prefetch,
              int64_t vocab_limit, std::string split_name, int64_t first_row = 0);
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  /// The batch at the current position; advances the position by one.
  Batch next();
  /// Number of batches handed out so far (the sampler position).
  int64_t position() const { return position_; }
  /// Continue from a saved position.
  void seek(int64_t position);

 private:
  torch::Tensor make_host_batch(int64_t index) const;  // (2, B, T) int64, pinned when device is CUDA
  void worker();

  TokenBuffer tokens_;
  int64_t batch_, seq_len_, first_row_;
  uint64_t seed_;
  torch::Device device_;
  int64_t prefetch_, vocab_limit_;
  std::string split_;
  bool pin_;

  int64_t position_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<int64_t, torch::Tensor>> ready_;
  int64_t next_to_make_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace tandem
