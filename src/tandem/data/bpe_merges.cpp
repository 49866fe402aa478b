#include "tandem/data/bpe_merges.h"

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem::detail {

MergeTable MergeTable::parse(const json& model, const std::unordered_map<std::string, TokenId>& vocab,
                             const std::string& source) {
  MergeTable table;
  int32_t rank = 0;
  for (const auto& merge : member(model, "merges", source + "'s model")) {
    std::string a, b;
    if (merge.is_array() && merge.size() == 2) {
      a = merge[0].get<std::string>(), b = merge[1].get<std::string>();
    } else {
      const auto text = merge.get<std::string>();
      const auto space = text.find(' ');
      TANDEM_CHECK(space != std::string::npos, source, ": merge ", rank, " '", text, "' is not two tokens");
      a = text.substr(0, space), b = text.substr(space + 1);
    }
    const auto left = vocab.find(a), right = vocab.find(b), merged = vocab.find(a + b);
    TANDEM_CHECK(left != vocab.end() && right != vocab.end() && merged != vocab.end(), source, ": merge ", rank, " ('",
                 a, "', '", b, "') names a token the vocabulary lacks; the file is damaged");
    table.rules_.emplace(key(left->second, right->second), MergeRule{rank++, merged->second});
  }
  return table;
}

namespace {

using Candidate = MergeScratch::Candidate;

// Orders the heap so that the lowest rank, then the leftmost position, comes out first.
struct MergesLater {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

void merge_symbols(const MergeTable& merges, const std::vector<TokenId>& ids, MergeScratch& scratch,
                   std::vector<TokenId>& out) {
  if (ids.empty()) return;
  auto& syms = scratch.symbols;
  syms.clear();
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto p = static_cast<int32_t>(i);
    syms.push_back({ids[i], p - 1, p + 1, 1});
  }
  syms.back().next = -1;
  auto& heap = scratch.heap;
  heap.clear();
  auto push = [&](int32_t left) {
    const int32_t right = syms[left].next;
    if (right < 0) return;
    const MergeRule* rule = merges.find(syms[left].id, syms[right].id);
    if (!rule) return;
    heap.push_back({rule->rank, left, rule->merged});
    std::push_heap(heap.begin(), heap.end(), MergesLater{});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), MergesLater{});
    const Candidate c = heap.back();
    heap.pop_back();
    auto& left = syms[c.pos];
    if (left.len == 0 || left.next < 0) continue;
    auto& right = syms[left.next];
    const MergeRule* rule = merges.find(left.id, right.id);
    if (!rule || rule->merged != c.merged) continue;  // a stale candidate
    left.id = c.merged;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) syms[left.next].prev = c.pos;
    if (left.prev >= 0) push(left.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

bool WordCache::lookup(std::string_view word, std::vector<TokenId>& out) {
  Shard& s = shard(word);
  std::lock_guard<std::mutex> lock(s.mutex);
  const auto it = s.map.find(std::string(word));
  if (it == s.map.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void WordCache::insert(std::string_view word, const TokenId* ids, size_t n) {
  Shard& s = shard(word);
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.map.size() >= kShardCapacity) s.map.clear();
  s.map.emplace(std::string(word), std::vector<TokenId>(ids, ids + n));
}

}  // namespace tandem::detail
