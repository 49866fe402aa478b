#include "tandem/models/stage_blocks.h"

#include "tandem/core/error.h"

namespace tandem {

StageBlocks::StageBlocks(Model& model, size_t first, size_t end) : model_(model), first_(first), end_(end) {
  TANDEM_ASSERT(first < end && end <= model.block_count(), "stage Blocks [", first, ", ", end, ")");
}

std::vector<NamedTensor> StageBlocks::hf_parameters() {
  std::vector<NamedTensor> out;
  for (size_t i = 0; i < block_count(); ++i)
    for (auto& p : block_parameters(i)) out.push_back(std::move(p));
  return out;
}

void StageBlocks::set_before_block(std::function<void(size_t)> fn) {
  if (!fn) return model_.set_before_block(nullptr);
  model_.set_before_block([fn = std::move(fn), first = first_, end = end_](size_t i) {
    if (i >= first && i < end) fn(i - first);
  });
}

void StageBlocks::set_host_blocks(std::vector<bool> host) {
  std::vector<bool> all(model_.block_count(), false);
  for (size_t i = 0; i < host.size() && first_ + i < end_; ++i) all[first_ + i] = host[i];
  model_.set_host_blocks(std::move(all));
}

}  // namespace tandem
