#pragma once
// Which KV cache pages hold which prompt prefix (Note [Prefix cache] in kv_cache.h): full pages of
// prompt tokens keyed by a hash chained over the pages before them, so that a page's key names
// its whole prefix. A lookup compares the page's own tokens and its parent's key as well, so a
// 64-bit collision of keys cannot hand out another prompt's keys and values.

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "tandem/data/tokenizer.h"

namespace tandem {

class PrefixIndex {
 public:
  /// The key of the page holding tokens[0, n) after the pages keyed `parent` (0 before the first).
  static uint64_t key(uint64_t parent, const TokenId* tokens, int64_t n);

  /// The page published under `key` for these tokens after `parent`, or -1.
  int32_t find(uint64_t key, uint64_t parent, const TokenId* tokens, int64_t n) const;
  /// Publishes `page` under `key`; false when the key already names a page (this one stays private).
  bool publish(uint64_t key, uint64_t parent, const TokenId* tokens, int64_t n, int32_t page);
  /// Whether `page` is published.
  bool published(int32_t page) const { return key_of_page_.count(page) > 0; }
  /// Forgets `page`'s entry (its page is being reused).
  void forget(int32_t page);
  /// Pages published.
  int64_t size() const { return static_cast<int64_t>(key_of_page_.size()); }

 private:
  struct Entry {
    uint64_t parent = 0;
    std::vector<TokenId> tokens;
    int32_t page = -1;
  };
  std::unordered_map<uint64_t, Entry> by_key_;
  std::unordered_map<int32_t, uint64_t> key_of_page_;
};

}  // namespace tandem
