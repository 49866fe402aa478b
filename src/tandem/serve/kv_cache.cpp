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
  static std::atomic<uint64_t> caches{0};
  id_ = ++caches;
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
  refs_.assign(static_cast<size_t>(pages_total_), 0);
  free_.resize(static_cast<size_t>(pages_total_));
  // Highest index at the bottom of the stack: a fresh cache hands out pages 0, 1, 2, ...
  for (int64_t i = 0; i < pages_total_; ++i) free_[static_cast<size_t>(i)] = static_cast<int32_t>(pages_total_ - 1 - i);
  pages_free_ = pages_total_;
}

void KvCache::update_counts() {
  pages_free_ = static_cast<int64_t>(free_.size() + idle_.size());
  pages_cached_ = index_.size();
}

int32_t KvCache::take_page() {
  int32_t page;
  if (!free_.empty()) {
    page = free_.back();
    free_.pop_back();
  } else {
    page = idle_.front();
    idle_.pop_front();
    idle_at_.erase(page);
    index_.forget(page);
  }
  refs_[static_cast<size_t>(page)] = 1;
  return page;
}

bool KvCache::reserve(PageTable& table, int64_t tokens) {
  const int64_t need = pages_for(tokens) - static_cast<int64_t>(table.pages.size());
  if (need <= 0) return true;
  std::lock_guard<std::mutex> lock(mutex_);
  if (need > static_cast<int64_t>(free_.size() + idle_.size())) return false;
  for (int64_t i = 0; i < need; ++i) table.pages.push_back(take_page());
  update_counts();
  return true;
}

void KvCache::release(PageTable& table) {
  if (table.pages.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // Reversed, so that a sequence that comes back gets the same pages in the same order.
  for (auto it = table.pages.rbegin(); it != table.pages.rend(); ++it) {
    auto& refs = refs_[static_cast<size_t>(*it)];
    TANDEM_ASSERT(refs > 0, "a KV page was released twice");
    if (--refs > 0) continue;  // another sequence shares it
    if (index_.published(*it)) {
      idle_at_[*it] = idle_.insert(idle_.end(), *it);
    } else {
      free_.push_back(*it);
    }
  }
  update_counts();
  table.pages.clear();
}

int64_t KvCache::share_prefix(PageTable& table, const std::vector<TokenId>& tokens, int64_t max_tokens) {
  TANDEM_ASSERT(table.pages.empty(), "a prefix shared into a table that holds pages");
  const int64_t pt = shape_.page_tokens;
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t parent = 0;
  for (int64_t start = 0; start + pt <= std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
       start += pt) {
    const TokenId* page_tokens = tokens.data() + start;
    const uint64_t key = PrefixIndex::key(parent, page_tokens, pt);
    const int32_t page = index_.find(key, parent, page_tokens, pt);
    if (page < 0) break;
    if (refs_[static_cast<size_t>(page)]++ == 0) {  // cached and idle: held again
      idle_.erase(idle_at_.at(page));
      idle_at_.erase(page);
    }
    table.pages.push_back(page);
    parent = key;
  }
  update_counts();
  return static_cast<int64_t>(table.pages.size()) * pt;
}

void KvCache::publish_prefix(const PageTable& table, const std::vector<TokenId>& tokens, int64_t n) {
  const int64_t pt = shape_.page_tokens;
  const int64_t full = std::min<int64_t>(n, static_cast<int64_t>(tokens.size())) / pt;
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t parent = 0;
  for (int64_t i = 0; i < full && i < static_cast<int64_t>(table.pages.size()); ++i) {
    const TokenId* page_tokens = tokens.data() + i * pt;
    const uint64_t key = PrefixIndex::key(parent, page_tokens, pt);
    index_.publish(key, parent, page_tokens, pt, table.pages[static_cast<size_t>(i)]);
    parent = key;
  }
  update_counts();
}

}  // namespace tandem
