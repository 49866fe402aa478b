#include "tandem/serve/kv_cache.h"

#include <algorithm>
#include <limits>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"

namespace tandem {

int64_t KvCacheShape::token_bytes() const {
  return n_layer * 2 * n_kv_head * head_dim * static_cast<int64_t>(c10::elementSize(dtype));
}

int64_t kv_cache_budget(int64_t free_bytes, double fraction, int64_t cap) {
  const auto share = static_cast<int64_t>(std::max<double>(0.0, double(free_bytes) * fraction));
  return cap > 0 ? std::min(share, cap) : share;
}

KvCache::KvCache(const KvCacheShape& shape, int64_t budget_bytes) : shape_(shape) {
  TANDEM_ASSERT(shape_.n_layer > 0 && shape_.n_kv_head > 0 && shape_.head_dim > 0 && shape_.page_tokens > 0,
                "KV cache shape with a zero dimension");
  const int64_t page = shape_.page_bytes();
  pages_total_ = std::min<int64_t>(budget_bytes / page, std::numeric_limits<int32_t>::max() - 1);
  TANDEM_CHECK(pages_total_ > 0, "the KV cache budget of ", format_bytes(double(budget_bytes)),
               " does not hold one page of ", shape_.page_tokens, " tokens (", format_bytes(double(page)),
               "); raise --kv-cache-gib or free device memory");
  const auto options = torch::TensorOptions().dtype(shape_.dtype).device(shape_.device);
  for (int64_t l = 0; l < shape_.n_layer; ++l) {
    keys_.push_back(torch::zeros({pages_total_ + 1, shape_.n_kv_head, shape_.page_tokens, shape_.head_dim}, options));
    values_.push_back(torch::zeros({pages_total_ + 1, shape_.n_kv_head, shape_.page_tokens, shape_.head_dim}, options));
  }
  free_.resize(static_cast<size_t>(pages_total_));
  // Highest index at the bottom of the stack: a fresh cache hands out pages 0, 1, 2, ...
  for (int64_t i = 0; i < pages_total_; ++i) free_[static_cast<size_t>(i)] = static_cast<int32_t>(pages_total_ - 1 - i);
  pages_free_ = pages_total_;
}

bool KvCache::reserve(PageTable& table, int64_t tokens) {
  const int64_t need = pages_for(tokens) - static_cast<int64_t>(table.pages.size());
  if (need <= 0) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  if (need > static_cast<int64_t>(free_.size())) return false;
  for (int64_t i = 0; i < need; ++i) {
    table.pages.push_back(free_.back());
    free_.pop_back();
  }
  pages_free_ = static_cast<int64_t>(free_.size());
  return true;
}

void KvCache::release(PageTable& table) {
  if (table.pages.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // Reversed, so that a sequence that comes back gets the same pages in the same order.
  for (auto it = table.pages.rbegin(); it != table.pages.rend(); ++it) free_.push_back(*it);
  TANDEM_ASSERT(static_cast<int64_t>(free_.size()) <= pages_total_, "a KV page was released twice");
  pages_free_ = static_cast<int64_t>(free_.size());
  table.pages.clear();
}

}  // namespace tandem
