#pragma once
// BPE merges as `tokenizers` applies them, for both kinds of BPE tokenizer.json (Note [Two kinds of
// BPE tokenizer.json]): always the pair of lowest rank, the leftmost on a tie, until none applies.
// And the cache of words' ids that both keep.

#include <array>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tandem/data/tokenizer_json.h"

namespace tandem::detail {

/// The merge of a pair: its rank (its place in the file) and the token it makes.
struct MergeRule {
  int32_t rank;
  TokenId merged;
};

/// (left id, right id) -> rule.
class MergeTable {
 public:
  /// Reads model.merges ("a b" strings or ["a", "b"] pairs); UserError naming a merge whose tokens
  /// `vocab` lacks.
  static MergeTable parse(const json& model, const std::unordered_map<std::string, TokenId>& vocab,
                          const std::string& source);

  const MergeRule* find(TokenId left, TokenId right) const {
    const auto it = rules_.find(key(left, right));
    return it == rules_.end() ? nullptr : &it->second;
  }

 private:
  static uint64_t key(TokenId a, TokenId b) {
    return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
  }
  std::unordered_map<uint64_t, MergeRule> rules_;
};

/// Per-call buffers of merge_symbols (reused across the words of one encode).
struct MergeScratch {
  struct Symbol {
    TokenId id;
    int32_t prev, next, len;  // len 0: merged into the symbol before it
  };
  struct Candidate {
    int32_t rank, pos;
    TokenId merged;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

/// Merges `ids` (a word's initial symbols) by rank and appends the result to `out`.
void merge_symbols(const MergeTable& merges, const std::vector<TokenId>& ids, MergeScratch& scratch,
                   std::vector<TokenId>& out);

/// The ids of words, shared by all threads (sharded, locked per shard; a full shard is emptied).
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 64;  // longer words are not cached

  bool lookup(std::string_view word, std::vector<TokenId>& out);
  void insert(std::string_view word, const TokenId* ids, size_t n);

 private:
  static constexpr size_t kShards = 64, kShardCapacity = 8192;
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<TokenId>> map;
  };
  Shard& shard(std::string_view word) { return shards_[std::hash<std::string_view>{}(word) % kShards]; }
  std::array<Shard, kShards> shards_;
};

}  // namespace tandem::detail
