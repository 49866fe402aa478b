#include "tandem/data/sp_unigram.h"

#include <algorithm>
#include <limits>
#include <map>

#include "tandem/core/error.h"
#include "tandem/data/tokenizer.h"

namespace tandem {

// Note [SentencePiece unigram]
// libsentencepiece 0.1.97 (Debian's) encodes a unigram model 3 to 4.5 times slower than the
// `sentencepiece` package 0.2.3, and sums path scores in float, which over a long text loses the
// difference between close segmentations (0.04 at a total near -3e6 on the parity tests' 1 MB mix),
// so its ids there differ from the package's. The package's best segmentation, rebuilt here: over
// the normalized text, at each character boundary reached, every piece starting there (a byte trie
// of the normal and user-defined pieces; unused, control and byte pieces never match) extends the
// best path to its end, a user-defined piece scoring its length times the highest normal score
// (which starts at FLT_MIN, so about -0.1: it beats its own splits); a character that no piece of
// its own length covers gets the unknown piece, scoring the lowest normal score minus 10. Scores add
// up in double, as the package 0.2.3's do. A later candidate replaces a path only when strictly
// better, so a tie keeps the path found first: the one whose last piece starts earlier (the longer
// last piece). Going back from the end, consecutive unknown characters become one unknown piece,
// which byte_fallback spells as the pieces of its bytes. A malformed character in the input becomes
// U+FFFD, one byte at a time, as SentencePiece's UTF-8 decoding has it. tests/python/
// test_tokenizers_parity.py holds the ids equal to the package's for three unigram models (NFKC
// with collapsed whitespace; case folding with byte fallback and no dummy prefix; identity with
// spaces kept) on the parity texts and a 1 MB mix with and without a user-defined piece.

namespace {

constexpr float kUnknownPenalty = 10.0f;

}  // namespace

SpUnigram::SpUnigram(const SpModelProto& m, const std::string& source) : normalizer_(m, source) {
  // As libsentencepiece: the highest score starts at FLT_MIN (the least positive float), so with the
  // usual negative scores a user-defined piece scores about -0.1 and beats any split of itself.
  float min_score = std::numeric_limits<float>::max(), max_score = std::numeric_limits<float>::min();
  for (const auto& p : m.pieces)
    if (p.type == SpModelProto::kNormal)
      min_score = std::min(min_score, p.score), max_score = std::max(max_score, p.score);
  score_.assign(m.pieces.size(), 0.0f);
  std::vector<std::pair<std::string, int32_t>> matched;
  for (size_t id = 0; id < m.pieces.size(); ++id) {
    const auto& p = m.pieces[id];
    if (p.type == SpModelProto::kUnknown && unk_ < 0) unk_ = static_cast<int>(id);
    if ((p.type != SpModelProto::kNormal && p.type != SpModelProto::kUserDefined) || p.piece.empty()) continue;
    // A user-defined piece outscores every split of its bytes, as in libsentencepiece.
    score_[id] = p.type == SpModelProto::kNormal ? double(p.score) : double(p.piece.size()) * max_score - 0.1;
    matched.emplace_back(p.piece, static_cast<int32_t>(id));
  }
  TANDEM_CHECK(unk_ >= 0, source, " is a unigram model without an unknown piece; the model file is damaged");
  unk_score_ = min_score - kUnknownPenalty;
  build_trie(matched);
  byte_ids_ = sp_byte_ids(m, source);
}

// The trie built with a map per node, then laid out flat: node v's edges in byte order at
// [first_[v], first_[v + 1]), the root's also as a table by byte.
void SpUnigram::build_trie(const std::vector<std::pair<std::string, int32_t>>& pieces) {
  struct Node {
    std::map<uint8_t, int32_t> next;
    int32_t piece = -1;
  };
  std::vector<Node> nodes(1);
  for (const auto& [piece, id] : pieces) {
    int32_t v = 0;
    for (const char c : piece) {
      const auto b = static_cast<uint8_t>(c);
      const auto it = nodes[static_cast<size_t>(v)].next.find(b);
      if (it != nodes[static_cast<size_t>(v)].next.end()) {
        v = it->second;
        continue;
      }
      const auto fresh = static_cast<int32_t>(nodes.size());
      nodes[static_cast<size_t>(v)].next.emplace(b, fresh);
      nodes.emplace_back();
      v = fresh;
    }
    if (nodes[static_cast<size_t>(v)].piece < 0) nodes[static_cast<size_t>(v)].piece = id;  // the first of equals
  }
  first_.clear(), byte_.clear(), to_.clear(), piece_.clear();
  for (const auto& node : nodes) {
    first_.push_back(static_cast<int32_t>(byte_.size()));
    piece_.push_back(node.piece);
    for (const auto& [b, to] : node.next) byte_.push_back(b), to_.push_back(to);
  }
  first_.push_back(static_cast<int32_t>(byte_.size()));
  std::fill(std::begin(root_), std::end(root_), -1);
  for (const auto& [b, to] : nodes[0].next) root_[b] = to;
}

// The best path to every character boundary of `text`: best[end] the last piece's start and id.
void SpUnigram::best_paths(std::string_view text, BestPath* best) const {
  const size_t n = text.size();
  best[0].start = 0;
  for (size_t at = 0; at < n;) {
    // Every character start is reached (by the unknown piece at least).
    const size_t len = std::min(sp_char_length(static_cast<uint8_t>(text[at])), n - at);
    const double here = best[at].score;
    bool single = false;
    for (size_t end = at + 1, node = size_t(root_[static_cast<uint8_t>(text[at])]); node != size_t(-1); ++end) {
      const int32_t id = piece_[node];
      if (id >= 0) {
        BestPath& b = best[end];
        const double candidate = here + score_[static_cast<size_t>(id)];
        if (b.start < 0 || candidate > b.score) b = {candidate, static_cast<int32_t>(at), id};
        single = single || end - at == len;
      }
      if (end == n) break;
      const auto byte = static_cast<uint8_t>(text[end]);  // the child by this byte, if any
      size_t next = size_t(-1);
      for (auto e = static_cast<size_t>(first_[node]), last = static_cast<size_t>(first_[node + 1]); e < last; ++e) {
        if (byte_[e] < byte) continue;
        if (byte_[e] == byte) next = static_cast<size_t>(to_[e]);
        break;
      }
      node = next;
    }
    if (!single) {
      BestPath& b = best[at + len];
      const double candidate = here + unk_score_;
      if (b.start < 0 || candidate > b.score) b = {candidate, static_cast<int32_t>(at), unk_};
    }
    at += len;
  }
}

std::vector<int> SpUnigram::encode_normalized(std::string_view text) const {
  const size_t n = text.size();
  TANDEM_CHECK(n < size_t{1} << 31, "a text of ", n,
               " bytes is beyond the unigram encoder's 2 GiB; encode it in pieces");
  // A thread's buffer is reused (a fresh one page-faults its way through every call) up to 4 M
  // characters (64 MiB); a longer text gets one of its own, freed after.
  constexpr size_t kReused = size_t{1} << 22;
  thread_local std::vector<BestPath> reused;
  std::vector<BestPath> own;
  std::vector<BestPath>& buffer = n < kReused ? reused : own;
  buffer.assign(n + 1, BestPath{});
  BestPath* const best = buffer.data();  // one lookup of the thread's vector, not one per use
  best_paths(text, best);
  // Back from the end: ids in reverse, consecutive unknown characters one unknown piece (or their
  // bytes with byte_fallback).
  std::vector<int> ids;
  ids.reserve(n / 3 + 1);
  bool after_unknown = false;
  for (size_t end = n; end > 0;) {
    const BestPath& b = best[end];
    TANDEM_ASSERT(b.start >= 0, "a unigram segmentation that does not reach the text's end");
    const auto start = static_cast<size_t>(b.start);
    if (b.id != unk_) {
      ids.push_back(b.id);
    } else if (!byte_ids_.empty()) {
      for (size_t i = end; i > start; --i) ids.push_back(byte_ids_[static_cast<uint8_t>(text[i - 1])]);
    } else if (!after_unknown) {
      ids.push_back(unk_);
    }
    after_unknown = b.id == unk_;
    end = start;
  }
  std::reverse(ids.begin(), ids.end());
  return ids;
}

std::vector<int> SpUnigram::encode(std::string_view text) const {
  return encode_normalized(normalizer_.normalize(text));
}

std::unique_ptr<SpUnigram> sp_unigram_for_model(const SpModelProto& m, const std::string& source) {
  if (m.model_type != 1 || m.treat_whitespace_as_suffix) return nullptr;
  return std::unique_ptr<SpUnigram>(new SpUnigram(m, source));
}

}  // namespace tandem
