#pragma once
// Leftmost-longest search for a set of byte strings: a tokenizer.json's added tokens
// (added_tokens.h), a SentencePiece model's user-defined pieces (sp_normalizer.h, sentencepiece_tokenizer.h).

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

/// Leftmost-longest search for a set of strings (a byte trie).
class StringMatcher {
 public:
  struct Match {
    size_t start, end;
    int token;  // the value the matched pattern was added with
  };
  void add(std::string_view pattern, int token);
  bool empty() const { return nodes_.size() == 1; }
  std::optional<Match> find(std::string_view text, size_t from) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> next;
    int token = -1;
  };
  int find_child(int node, unsigned char b) const;
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
};

}  // namespace tandem
