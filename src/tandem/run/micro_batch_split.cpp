#include "tandem/run/micro_batch_split.h"

#include "tandem/core/error.h"

namespace tandem {

// Note [Adaptive micro-batch]
// An out-of-memory error in a forward or backward gives the step up (the engine undoes what it
// began), frees the cache, and runs the step again with each micro-batch cut into twice as many
// parts: the micro-batch halves, the accumulation doubles, and the step sees the same samples with
// the same weights (each part's loss weighted by its share of rows), so only the summation order
// differs. After train.oom_grow_after clean steps the parts halve again. At one row a part the
// plan cannot fit. The CLI's trainer rewinds its loader to the step's first micro-batch; the
// Python engine's train_step slices the same batch again.
MicroBatchSplit::MicroBatchSplit(const TrainConfig& train)
    : retry_(train.oom_retry), grow_after_(train.oom_grow_after) {}

void MicroBatchSplit::split_further(int64_t step, const std::string& what, int64_t rows) {
  TANDEM_CHECK(retry_, "out of memory at step ", step + 1, " (", what,
               "); lower train.micro_batch, set model.checkpointing=true, or set train.oom_retry=true");
  TANDEM_CHECK(parts(rows) < rows, "out of memory at step ", step + 1,
               " even at micro-batch 1, one row a micro-batch (", what,
               "); lower train.seq_len, set model.checkpointing=true or offload.optimizer=cpu");
  parts_ *= 2;
  rows_ = rows;
  clean_steps_ = 0;
  ++retries_;
}

int64_t MicroBatchSplit::after_step(bool* grew) {
  if (grew) *grew = false;
  if (parts_ == 1) return 0;
  const int64_t ran = part_rows();
  if (grow_after_ > 0 && ++clean_steps_ >= grow_after_) {
    parts_ /= 2;
    clean_steps_ = 0;
    if (grew) *grew = true;
  }
  return ran;
}

}  // namespace tandem
