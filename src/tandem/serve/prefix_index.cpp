#include "tandem/serve/prefix_index.h"

#include <algorithm>

namespace tandem {

uint64_t PrefixIndex::key(uint64_t parent, const TokenId* tokens, int64_t n) {
  // FNV-1a over the parent's key and the tokens, then a final mix (splitmix64's).
  uint64_t h = 1469598103934665603ULL;
  const auto mix = [&h](uint64_t v) {
    for (int b = 0; b < 8; ++b, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ULL;
  };
  mix(parent);
  for (int64_t i = 0; i < n; ++i) mix(static_cast<uint32_t>(tokens[i]));
  h ^= h >> 30, h *= 0xbf58476d1ce4e5b9ULL, h ^= h >> 27, h *= 0x94d049bb133111ebULL, h ^= h >> 31;
  return h == 0 ? 1 : h;  // 0 stands for "no parent"
}

int32_t PrefixIndex::find(uint64_t key, uint64_t parent, const TokenId* tokens, int64_t n) const {
  const auto it = by_key_.find(key);
  if (it == by_key_.end() || it->second.parent != parent || static_cast<int64_t>(it->second.tokens.size()) != n ||
      !std::equal(tokens, tokens + n, it->second.tokens.begin()))
    return -1;
  return it->second.page;
}

bool PrefixIndex::publish(uint64_t key, uint64_t parent, const TokenId* tokens, int64_t n, int32_t page) {
  if (by_key_.count(key) > 0 || published(page)) return false;
  by_key_[key] = Entry{parent, std::vector<TokenId>(tokens, tokens + n), page};
  key_of_page_[page] = key;
  return true;
}

void PrefixIndex::forget(int32_t page) {
  const auto it = key_of_page_.find(page);
  if (it == key_of_page_.end()) return;
  by_key_.erase(it->second);
  key_of_page_.erase(it);
}

}  // namespace tandem
