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
//
// Note [Prefix cache]
// Requests that share a prompt prefix (a system prompt, a conversation's earlier turns) share the
// pages holding it. Once a sequence's prompt is prefilled, its full prompt pages are published in a
// PrefixIndex (serve/prefix_index.h) under keys chained over the pages before them; a later prompt
// looks its full pages up in order and takes each one found (a reference more), prefilling only
// from the first page not found. The page holding a prompt's last token is never shared (its logits
// must be computed), so a shared page is only ever read. A page no sequence holds any more stays
// published, and is handed out again (its entry forgotten) only when no free page is left, the least
// recently released first and of one sequence's pages the last first (a prefix keeps its first
// pages longest): cached prefixes cost no capacity. Keys and values of a prefix are the same whichever
// sequence computed them, as long as positions do not depend on the sequence's length (dynamic
// RoPE: the scheduler turns sharing off).

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tandem/data/tokenizer.h"
#include "tandem/serve/prefix_index.h"

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
  /// A number no other cache of this process has had, so that what is prepared over one cache's
  /// pages is never taken for another's, even at the same address (Note [Persistent decode step]).
  uint64_t id() const { return id_; }
  /// Tokens per page.
  int64_t page_tokens() const { return shape_.page_tokens; }
  /// Pages needed for `tokens` tokens.
  int64_t pages_for(int64_t tokens) const { return (tokens + shape_.page_tokens - 1) / shape_.page_tokens; }

  /// Grows `table` until it holds `tokens` tokens, from free pages and then from the oldest cached
  /// prefixes no sequence holds. False, and `table` unchanged, when there are not enough.
  bool reserve(PageTable& table, int64_t tokens);
  /// Gives back every page of `table` and empties it: a published page no one else holds stays
  /// cached (Note [Prefix cache]), the others are free.
  void release(PageTable& table);

  /// Note [Prefix cache]: fills the empty `table` with the published pages of the longest prefix of
  /// `tokens` that fits in `max_tokens` whole pages; returns the tokens they hold.
  int64_t share_prefix(PageTable& table, const std::vector<TokenId>& tokens, int64_t max_tokens);
  /// Publishes the full pages of `table` that hold tokens[0, n) (those already published for the
  /// same prefix are left as they are).
  void publish_prefix(const PageTable& table, const std::vector<TokenId>& tokens, int64_t n);

  /// Pages in all; free (never holding a cached prefix) or cached and held by no sequence; held by
  /// sequences; published (for metrics; any thread).
  int64_t pages_total() const { return pages_total_; }
  int64_t pages_free() const { return pages_free_.load(); }
  int64_t pages_used() const { return pages_total_ - pages_free_.load(); }
  int64_t pages_cached() const { return pages_cached_.load(); }
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
  uint64_t id_ = 0;
  std::vector<torch::Tensor> keys_, values_;  // per layer: (P + 1, KV, page_tokens, hd), the scratch page last
  /// Takes one page, free first, else the oldest cached one (its entry forgotten); under mutex_.
  int32_t take_page();
  void update_counts();  // under mutex_

  std::mutex mutex_;           // guards the fields below
  std::vector<int32_t> free_;  // a stack of free page indices
  std::vector<int32_t> refs_;  // sequences holding each page
  std::list<int32_t> idle_;    // published pages no sequence holds, oldest first
  std::unordered_map<int32_t, std::list<int32_t>::iterator> idle_at_;
  PrefixIndex index_;
  std::atomic<int64_t> pages_free_{0}, pages_cached_{0};
};

}  // namespace tandem
