#pragma once
// The paged key/value cache of generation: fixed-size pages of `page_tokens` tokens, each holding
// the keys and values of every layer, handed out from a free list to the sequences being decoded.
//
// Note [Paged KV cache]
// A sequence's cache is not one contiguous tensor but a page table: the i-th page of the table holds
// its tokens [i * page_tokens, (i + 1) * page_tokens). Pages are allocated as a sequence grows and
// all returned when it finishes or is cancelled, so the cache holds as many tokens as the budget
// allows whatever the mix of lengths, and no sequence reserves room for a length it never reaches.
// The pages are allocated once, up front, from a byte budget (kv_cache_budget): running out of pages
// is not an error but a refusal (reserve() returns false) that the scheduler turns into waiting or
// preemption (Note [Continuous batching]). One page more than the budget holds is never handed
// out: the scratch page, where padded rows of a recorded decode step write (Note [Decode graphs]).

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

namespace tandem {

/// What fixes the size of a page: the model's attention shape and the cache's dtype and device.
struct KvCacheShape {
  int64_t n_layer = 0, n_kv_head = 0, head_dim = 0;
  int64_t page_tokens = 16;  ///< tokens per page
  torch::ScalarType dtype = torch::kFloat32;
  c10::Device device{c10::kCPU};

  /// Bytes one token takes in the cache: keys and values of every layer.
  int64_t token_bytes() const;
  /// Bytes one page takes: page_tokens tokens.
  int64_t page_bytes() const { return token_bytes() * page_tokens; }
};

/// Bytes to give the cache: `fraction` of the memory left free after the weights, at most `cap`
/// (a cap <= 0 means none).
int64_t kv_cache_budget(int64_t free_bytes, double fraction, int64_t cap);

/// One sequence's pages, in token order; owned by the sequence, filled and emptied by a KvCache.
struct PageTable {
  std::vector<int32_t> pages;
  /// Tokens the pages can hold.
  int64_t capacity(int64_t page_tokens) const { return static_cast<int64_t>(pages.size()) * page_tokens; }
};

/// The pages themselves and their free list (Note [Paged KV cache]). reserve() and release() may be
/// called from any thread; the tensors are read and written by the decoder's thread.
class KvCache {
 public:
  /// Allocates as many pages as `budget_bytes` holds; UserError when that is not even one page.
  KvCache(const KvCacheShape& shape, int64_t budget_bytes);
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  /// The shape the pages were allocated for.
  const KvCacheShape& shape() const { return shape_; }
  /// Tokens per page.
  int64_t page_tokens() const { return shape_.page_tokens; }
  /// Pages needed for `tokens` tokens.
  int64_t pages_for(int64_t tokens) const { return (tokens + shape_.page_tokens - 1) / shape_.page_tokens; }

  /// Grows `table` until it holds `tokens` tokens. False, and `table` unchanged, when there are not
  /// enough free pages.
  bool reserve(PageTable& table, int64_t tokens);
  /// Returns every page of `table` to the free list and empties it.
  void release(PageTable& table);

  /// Pages in all, free and held by sequences (for metrics; any thread).
  int64_t pages_total() const { return pages_total_; }
  int64_t pages_free() const { return pages_free_.load(); }
  int64_t pages_used() const { return pages_total_ - pages_free_.load(); }
  /// Tokens the whole cache holds.
  int64_t tokens_total() const { return pages_total_ * shape_.page_tokens; }
  /// Bytes the pages take.
  int64_t bytes() const { return pages_total_ * shape_.page_bytes(); }
  /// The page no sequence holds (its contents are garbage; nothing attends to it unmasked).
  int32_t scratch_page() const { return static_cast<int32_t>(pages_total_); }

  /// Layer `layer`'s keys and values: (pages, n_kv_head, page_tokens, head_dim) each.
  const torch::Tensor& keys(int64_t layer) const { return keys_[static_cast<size_t>(layer)]; }
  const torch::Tensor& values(int64_t layer) const { return values_[static_cast<size_t>(layer)]; }

 private:
  KvCacheShape shape_;
  int64_t pages_total_ = 0;
  std::vector<torch::Tensor> keys_, values_;  // per layer: (P + 1, KV, page_tokens, hd), the scratch page last
  std::mutex mutex_;                          // guards free_
  std::vector<int32_t> free_;                 // a stack of free page indices
  std::atomic<int64_t> pages_free_{0};
};

}  // namespace tandem
