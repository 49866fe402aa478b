#include "tandem/data/string_matcher.h"

namespace tandem {

void StringMatcher::add(std::string_view pattern, int token) {
  if (pattern.empty()) return;
  int node = 0;
  for (char ch : pattern) {
    const auto b = static_cast<unsigned char>(ch);
    const int child = find_child(node, b);
    if (child >= 0) {
      node = child;
      continue;
    }
    nodes_.push_back({});
    nodes_[node].next.emplace_back(b, static_cast<int>(nodes_.size()) - 1);
    node = static_cast<int>(nodes_.size()) - 1;
  }
  if (nodes_[node].token < 0) nodes_[node].token = token;
  first_[static_cast<unsigned char>(pattern[0])] = true;
}

std::optional<StringMatcher::Match> StringMatcher::find(std::string_view text, size_t from) const {
  for (size_t p = from; p < text.size(); ++p) {
    if (!first_[static_cast<unsigned char>(text[p])]) continue;
    int node = 0, best = -1;
    size_t best_end = 0;
    for (size_t q = p; q < text.size(); ++q) {
      node = find_child(node, static_cast<unsigned char>(text[q]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) best = nodes_[node].token, best_end = q + 1;
    }
    if (best >= 0) return Match{p, best_end, best};
  }
  return std::nullopt;
}

int StringMatcher::find_child(int node, unsigned char b) const {
  for (const auto& [c, child] : nodes_[node].next)
    if (c == b) return child;
  return -1;
}

}  // namespace tandem
