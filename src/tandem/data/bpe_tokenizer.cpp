#include "tandem/data/bpe_tokenizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/utext.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <array>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/strings.h"

// Note [Byte-level BPE]
// What tandem reads of a Hugging Face tokenizer.json, in the order `tokenizers` applies it:
// 1. Added tokens are split out of the text before anything else: first those with
//    normalized=false on the raw text, then, after the normalizer ran on what is left, those with
//    normalized=true; leftmost-longest, with single_word, lstrip and rstrip as `tokenizers` has them.
// 2. The normalizer: none, or Unicode normal forms (NFC, NFD, NFKC, NFKD, a Sequence of them), by ICU.
// 3. The pre-tokenizer: Split (a Regex or a String, any split behaviour, invert), ByteLevel (its
//    add_prefix_space, and GPT-2's regex when use_regex) and a Sequence of those ending in ByteLevel.
//    The file's regexes are Oniguruma patterns; ICU runs them as written: both read \p{L}, \p{N},
//    (?i:...) with Unicode case folding, lookahead, and \s as the White_Space property (U+000B and
//    U+0085 included, whatever ICU's documentation says; the parity test holds both to it).
// 4. The BPE model. ByteLevel maps every byte to one printable character; tandem keeps the
//    vocabulary keyed by the raw bytes too, so a word is merged from its bytes without building
//    that string. Merges are applied as `tokenizers` does: always the pair of lowest rank, the
//    leftmost on a tie, until none applies; with ignore_merges (Llama 3) a word that is itself in
//    the vocabulary is one token. Words' ids are cached (sharded, locked per shard).
// 5. The post-processor's template (TemplateProcessing, Roberta/Bert, ByteLevel, a Sequence) adds
//    its special tokens when encode is asked to (SpecialTokens::kInclude).
// 6. Decoding maps each token's characters back to bytes (a token with a character outside the
//    alphabet, e.g. an added token with a space, is taken as its UTF-8 text, as `tokenizers`
//    does) and replaces malformed UTF-8 by U+FFFD.
// Refused with the reason: byte_fallback and SentencePiece-style BPE (Metaspace; use
// tokenizer.model), WordPiece/Unigram models, other normalizers, pre-tokenizers and decoders.

namespace tandem {

using json = nlohmann::json;

namespace {

// ---- The byte-level alphabet ----------------------------------------------------------------

struct ByteAlphabet {
  std::array<std::string, 256> char_of;          // byte -> its character (UTF-8)
  std::unordered_map<UChar32, uint8_t> byte_of;  // character -> byte
};

// GPT-2's mapping: printable Latin-1 bytes stand for themselves, the other 68 bytes for the code
// points 256, 257, ... in byte order.
const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet = [] {
    ByteAlphabet a;
    UChar32 next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const UChar32 c = printable ? b : next++;
      uint8_t buf[4];
      int32_t n = 0;
      U8_APPEND_UNSAFE(buf, n, c);
      a.char_of[b].assign(reinterpret_cast<char*>(buf), static_cast<size_t>(n));
      a.byte_of[c] = static_cast<uint8_t>(b);
    }
    return a;
  }();
  return alphabet;
}

// The bytes a stored token stands for, or nullopt when a character is outside the alphabet.
std::optional<std::string> byte_level_bytes(std::string_view token) {
  const auto& alphabet = byte_alphabet();
  std::string out;
  const auto* s = reinterpret_cast<const uint8_t*>(token.data());
  const auto n = static_cast<int32_t>(token.size());
  for (int32_t i = 0; i < n;) {
    UChar32 c;
    U8_NEXT(s, i, n, c);
    const auto it = alphabet.byte_of.find(c);
    if (c < 0 || it == alphabet.byte_of.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

// ---- Unicode helpers ------------------------------------------------------------------------

UChar32 char_before(std::string_view s, size_t end, size_t* start = nullptr) {
  auto i = static_cast<int32_t>(end);
  UChar32 c;
  U8_PREV(reinterpret_cast<const uint8_t*>(s.data()), 0, i, c);
  if (start) *start = static_cast<size_t>(i);
  return c;
}

UChar32 char_at(std::string_view s, size_t begin, size_t* end = nullptr) {
  auto i = static_cast<int32_t>(begin);
  UChar32 c;
  U8_NEXT(reinterpret_cast<const uint8_t*>(s.data()), i, static_cast<int32_t>(s.size()), c);
  if (end) *end = static_cast<size_t>(i);
  return c;
}

// A regex \w character (Unicode): alphabetic, mark, decimal digit, connector punctuation, joiner.
bool is_word_char(UChar32 c) {
  if (c < 0) return false;
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || (U_GET_GC_MASK(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) ||
         u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL);
}

// The start of the run of White_Space characters that ends at `end`.
size_t whitespace_start_before(std::string_view s, size_t end) {
  while (end > 0) {
    size_t start;
    if (!u_isUWhiteSpace(char_before(s, end, &start))) break;
    end = start;
  }
  return end;
}

// The end of the run of White_Space characters that starts at `begin`.
size_t whitespace_end_after(std::string_view s, size_t begin) {
  while (begin < s.size()) {
    size_t next;
    if (!u_isUWhiteSpace(char_at(s, begin, &next))) break;
    begin = next;
  }
  return begin;
}

// ---- Added tokens ---------------------------------------------------------------------------

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false, single_word = false, lstrip = false, rstrip = false, normalized = true;
};

// Leftmost-longest search for a set of strings (a byte trie).
class AddedTokenMatcher {
 public:
  struct Match {
    size_t start, end;
    int token;  // index into the added tokens
  };

  void add(std::string_view pattern, int token) {
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

  bool empty() const { return nodes_.size() == 1; }

  std::optional<Match> find(std::string_view text, size_t from) const {
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

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> next;
    int token = -1;
  };
  int find_child(int node, unsigned char b) const {
    for (const auto& [c, child] : nodes_[node].next)
      if (c == b) return child;
    return -1;
  }
  std::vector<Node> nodes_{1};
  std::array<bool, 256> first_{};
};

// Cuts `text` at the matches of `matcher`: on_text for the text between them, on_token for each
// match (single_word, lstrip and rstrip applied as `tokenizers` does).
void split_added(std::string_view text, const AddedTokenMatcher& matcher, const std::vector<AddedToken>& tokens,
                 const std::function<void(std::string_view)>& on_text, const std::function<void(TokenId)>& on_token) {
  size_t done = 0, pos = 0;
  while (auto match = matcher.find(text, pos)) {
    const AddedToken& token = tokens[match->token];
    size_t start = match->start, stop = match->end;
    pos = stop;
    if (token.single_word) {
      const bool free_left = start == 0 || !is_word_char(char_before(text, start));
      const bool free_right = stop == text.size() || !is_word_char(char_at(text, stop));
      if (!free_left || !free_right) continue;
    }
    if (token.lstrip) start = std::max(whitespace_start_before(text, start), done);
    if (token.rstrip) stop = pos = whitespace_end_after(text, stop);
    if (done < start) on_text(text.substr(done, start - done));
    on_token(token.id);
    done = stop;
  }
  if (done < text.size()) on_text(text.substr(done));
}

// ---- Pre-tokenizer --------------------------------------------------------------------------

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One step of the pre-tokenizer, applied to every piece the steps before it left.
struct SplitStep {
  std::unique_ptr<icu::RegexPattern> regex;  // null: split on `literal` (none when empty)
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool prefix_space = false;  // ByteLevel's add_prefix_space: a space before a piece that lacks one
};

struct Span {
  size_t begin, end;
  bool match;
};

// GPT-2's pattern, which ByteLevel(use_regex=true) splits with.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::unique_ptr<icu::RegexPattern> compile_regex(const std::string& pattern, const std::string& source) {
  UParseError where{};
  UErrorCode status = U_ZERO_ERROR;
  const icu::UnicodeString text = icu::UnicodeString::fromUTF8(pattern);
  std::unique_ptr<icu::RegexPattern> re(icu::RegexPattern::compile(text, 0, where, status));
  TANDEM_CHECK(U_SUCCESS(status), source, ": the pre-tokenizer's regex '", pattern, "' does not compile with ICU (",
               u_errorName(status), " at offset ", where.offset,
               "); tandem runs tokenizer.json's patterns with ICU's regex engine");
  return re;
}

// The matches of `step` in `text` and the text between them, covering it.
std::vector<Span> find_spans(std::string_view text, const SplitStep& step, icu::RegexMatcher* matcher) {
  std::vector<Span> spans;
  size_t prev = 0;
  auto add = [&](size_t a, size_t b) {
    if (prev < a) spans.push_back({prev, a, false});
    spans.push_back({a, b, true});
    prev = b;
  };
  if (step.regex) {
    UErrorCode status = U_ZERO_ERROR;
    UText ut = UTEXT_INITIALIZER;
    utext_openUTF8(&ut, text.data(), static_cast<int64_t>(text.size()), &status);
    matcher->reset(&ut);
    while (matcher->find(status) && U_SUCCESS(status))
      add(static_cast<size_t>(matcher->start64(status)), static_cast<size_t>(matcher->end64(status)));
    utext_close(&ut);
    TANDEM_ASSERT(U_SUCCESS(status), "ICU regex: ", u_errorName(status));
  } else {
    for (size_t at = text.find(step.literal); at != std::string_view::npos; at = text.find(step.literal, prev))
      add(at, at + step.literal.size());
  }
  if (prev < text.size()) spans.push_back({prev, text.size(), false});
  if (step.invert)
    for (auto& s : spans) s.match = !s.match;
  return spans;
}

// The pieces `spans` leave under `behavior` (empty ones dropped), as [begin, end) pairs.
std::vector<std::pair<size_t, size_t>> apply_behavior(const std::vector<Span>& spans, SplitBehavior behavior) {
  std::vector<std::pair<size_t, size_t>> out;
  bool prev_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& s : spans)
        if (!s.match) out.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kIsolated:
      for (const auto& s : spans) out.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::kContiguous:
      for (const auto& s : spans) {
        if (s.match && prev_match && !out.empty())
          out.back().second = s.end;
        else
          out.emplace_back(s.begin, s.end);
        prev_match = s.match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& s : spans) {
        if (s.match && !prev_match && !out.empty())
          out.back().second = s.end;
        else
          out.emplace_back(s.begin, s.end);
        prev_match = s.match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev_match && !out.empty())
          out.back().first = it->begin;
        else
          out.emplace_back(it->begin, it->end);
        prev_match = it->match;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
  out.erase(std::remove_if(out.begin(), out.end(), [](const auto& p) { return p.first == p.second; }), out.end());
  return out;
}

// ---- BPE merges -----------------------------------------------------------------------------

struct MergeRule {
  int32_t rank;
  TokenId merged;
};

uint64_t pair_key(TokenId a, TokenId b) {
  return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
}

struct Symbol {
  TokenId id;
  int32_t prev, next, len;  // len 0: merged into the symbol before it
};

struct Candidate {
  int32_t rank, pos;
  TokenId merged;
};

// Orders the heap so that the lowest rank, then the leftmost position, comes out first.
struct MergesLater {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

// The ids of a word from a cache shared by all threads (sharded; a full shard is emptied).
class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 64;

  bool lookup(std::string_view word, std::vector<TokenId>& out) {
    Shard& s = shard(word);
    std::lock_guard<std::mutex> lock(s.mutex);
    const auto it = s.map.find(std::string(word));
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }

  void insert(std::string_view word, const TokenId* ids, size_t n) {
    Shard& s = shard(word);
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.map.size() >= kShardCapacity) s.map.clear();
    s.map.emplace(std::string(word), std::vector<TokenId>(ids, ids + n));
  }

 private:
  static constexpr size_t kShards = 64, kShardCapacity = 8192;
  struct Shard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<TokenId>> map;
  };
  Shard& shard(std::string_view word) { return shards_[std::hash<std::string_view>{}(word) % kShards]; }
  std::array<Shard, kShards> shards_;
};

}  // namespace

// ---- The parsed file ------------------------------------------------------------------------

struct BpeTokenizer::Model {
  std::string source;
  std::vector<const icu::Normalizer2*> normalizers;
  std::vector<SplitStep> steps;
  std::unordered_map<std::string, TokenId> vocab;      // stored form -> id (the BPE model's)
  std::unordered_map<std::string, TokenId> raw_vocab;  // raw bytes -> id (ignore_merges)
  std::array<TokenId, 256> byte_ids{};                 // the one-byte tokens; -1 when absent
  std::unordered_map<uint64_t, MergeRule> merges;      // (left, right) -> rank, merged id
  std::optional<TokenId> unk;
  bool ignore_merges = false;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, TokenId> added_ids;  // content -> id
  AddedTokenMatcher raw_matcher, normalized_matcher;
  std::vector<TokenId> template_before, template_after;  // the single-sequence template around $A
  std::vector<std::string> stored;                       // id -> stored form ("" for unused ids)
  std::vector<std::string> bytes;                        // id -> the bytes it decodes to
  std::vector<char> special;                             // id -> a special added token
  std::optional<TokenId> bos, eos;
  bool cuttable = false;  // Note [Document pieces]
  mutable WordCache cache;

  std::optional<TokenId> find(std::string_view token) const {
    const std::string key(token);
    if (auto it = added_ids.find(key); it != added_ids.end()) return it->second;
    if (auto it = vocab.find(key); it != vocab.end()) return it->second;
    return std::nullopt;
  }
};

namespace {

using Model = BpeTokenizer::Model;

// Per-call matchers: an ICU RegexMatcher holds match state, so each encode has its own.
struct EncodeScratch {
  std::vector<std::unique_ptr<icu::RegexMatcher>> matchers;
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;

  explicit EncodeScratch(const Model& m) {
    for (const auto& step : m.steps) {
      UErrorCode status = U_ZERO_ERROR;
      matchers.emplace_back(step.regex ? step.regex->matcher(status) : nullptr);
      TANDEM_ASSERT(U_SUCCESS(status), "ICU matcher: ", u_errorName(status));
    }
  }
};

// The text after the normalizers (a view of `text` when they leave it unchanged).
std::string_view normalize(const Model& m, std::string_view text, std::string& storage) {
  if (m.normalizers.empty()) return text;
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return text;  // ASCII is in every normal form
  std::string current(text);
  for (const auto* n : m.normalizers) {
    UErrorCode status = U_ZERO_ERROR;
    if (n->isNormalizedUTF8(current, status) && U_SUCCESS(status)) continue;
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out);
    n->normalizeUTF8(0, current, sink, nullptr, status);
    TANDEM_ASSERT(U_SUCCESS(status), "ICU normalizer: ", u_errorName(status));
    current = std::move(out);
  }
  storage = std::move(current);
  return storage;
}

void pre_tokenize(const Model& m, std::string_view piece, size_t step, EncodeScratch& scratch,
                  const std::function<void(std::string_view)>& word) {
  if (step == m.steps.size()) {
    word(piece);
    return;
  }
  const SplitStep& s = m.steps[step];
  std::string spaced;
  if (s.prefix_space && (piece.empty() || piece[0] != ' ')) {
    spaced.reserve(piece.size() + 1);
    spaced.append(" ").append(piece);
    piece = spaced;
  }
  if (!s.regex && s.literal.empty()) {
    pre_tokenize(m, piece, step + 1, scratch, word);
    return;
  }
  for (const auto& [a, b] : apply_behavior(find_spans(piece, s, scratch.matchers[step].get()), s.behavior))
    pre_tokenize(m, piece.substr(a, b - a), step + 1, scratch, word);
}

// The word's bytes merged by rank (Note [Byte-level BPE]); appends the ids to `out`.
void merge_bytes(const Model& m, std::string_view word, EncodeScratch& scratch, std::vector<TokenId>& out) {
  auto& syms = scratch.symbols;
  syms.clear();
  for (char ch : word) {
    TokenId id = m.byte_ids[static_cast<unsigned char>(ch)];
    if (id < 0 && !m.unk) continue;  // a byte without a token and no unk_token: dropped, as `tokenizers` does
    if (id < 0) id = *m.unk;
    const auto i = static_cast<int32_t>(syms.size());
    syms.push_back({id, i - 1, i + 1, 1});
  }
  if (syms.empty()) return;
  syms.back().next = -1;
  auto& heap = scratch.heap;
  heap.clear();
  auto push = [&](int32_t left) {
    const int32_t right = syms[left].next;
    if (right < 0) return;
    const auto it = m.merges.find(pair_key(syms[left].id, syms[right].id));
    if (it == m.merges.end()) return;
    heap.push_back({it->second.rank, left, it->second.merged});
    std::push_heap(heap.begin(), heap.end(), MergesLater{});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(syms.size()); ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), MergesLater{});
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = syms[c.pos];
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = syms[left.next];
    const auto it = m.merges.find(pair_key(left.id, right.id));
    if (it == m.merges.end() || it->second.merged != c.merged) continue;  // a stale candidate
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

void encode_word(const Model& m, std::string_view word, EncodeScratch& scratch, std::vector<TokenId>& out) {
  if (word.size() == 1 && m.byte_ids[static_cast<unsigned char>(word[0])] >= 0) {
    out.push_back(m.byte_ids[static_cast<unsigned char>(word[0])]);
    return;
  }
  if (m.ignore_merges) {
    const auto it = m.raw_vocab.find(std::string(word));
    if (it != m.raw_vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= WordCache::kMaxWordBytes;
  if (cacheable && m.cache.lookup(word, out)) return;
  const size_t before = out.size();
  merge_bytes(m, word, scratch, out);
  if (cacheable) m.cache.insert(word, out.data() + before, out.size() - before);
}

// The words of text between added tokens: normalized, pre-tokenized, merged.
void encode_text(const Model& m, std::string_view text, EncodeScratch& scratch, std::vector<TokenId>& out) {
  const auto word = [&](std::string_view w) { encode_word(m, w, scratch, out); };
  const auto token = [&](TokenId id) { out.push_back(id); };
  split_added(
      text, m.raw_matcher, m.added,
      [&](std::string_view raw) {
        std::string storage;
        const std::string_view normalized = normalize(m, raw, storage);
        split_added(
            normalized, m.normalized_matcher, m.added,
            [&](std::string_view piece) { pre_tokenize(m, piece, 0, scratch, word); }, token);
      },
      token);
}

// ---- Reading tokenizer.json -----------------------------------------------------------------

const json& member(const json& j, const char* key, const std::string& where) {
  TANDEM_CHECK(j.is_object() && j.contains(key), where, " has no \"", key,
               "\"; is this a Hugging Face tokenizer.json (written by `tokenizers`)?");
  return j.at(key);
}

std::string type_of(const json& j) { return j.is_object() && j.contains("type") ? j["type"].get<std::string>() : ""; }

std::vector<const icu::Normalizer2*> parse_normalizer(const json& j, const std::string& source) {
  std::vector<const icu::Normalizer2*> out;
  if (j.is_null()) return out;
  const std::string type = type_of(j);
  if (type == "Sequence") {
    for (const auto& n : member(j, "normalizers", source + "'s normalizer"))
      for (const auto* p : parse_normalizer(n, source)) out.push_back(p);
    return out;
  }
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = type == "NFC"    ? icu::Normalizer2::getNFCInstance(status)
                              : type == "NFD"  ? icu::Normalizer2::getNFDInstance(status)
                              : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(status)
                              : type == "NFKD" ? icu::Normalizer2::getNFKDInstance(status)
                                               : nullptr;
  TANDEM_CHECK(n != nullptr, source, ": normalizer '", type,
               "' is not read by tandem (it reads none, NFC, NFD, NFKC, NFKD and a Sequence of them); for a "
               "SentencePiece-style tokenizer give its tokenizer.model instead");
  TANDEM_ASSERT(U_SUCCESS(status), "ICU normalizer: ", u_errorName(status));
  out.push_back(n);
  return out;
}

SplitBehavior parse_behavior(const std::string& name, const std::string& source) {
  static const std::pair<const char*, SplitBehavior> kNames[] = {
      {"Removed", SplitBehavior::kRemoved},
      {"Isolated", SplitBehavior::kIsolated},
      {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
      {"MergedWithNext", SplitBehavior::kMergedWithNext},
      {"Contiguous", SplitBehavior::kContiguous}};
  for (const auto& [n, b] : kNames)
    if (name == n) return b;
  TANDEM_FAIL(source, ": Split behavior '", name, "' is unknown (Removed, Isolated, MergedWithPrevious, ",
              "MergedWithNext, Contiguous)");
}

SplitStep parse_split(const json& j, const std::string& source) {
  SplitStep step;
  const json& pattern = member(j, "pattern", source + "'s Split pre-tokenizer");
  if (pattern.contains("Regex"))
    step.regex = compile_regex(pattern["Regex"].get<std::string>(), source);
  else
    step.literal = member(pattern, "String", source + "'s Split pattern").get<std::string>();
  step.behavior = parse_behavior(member(j, "behavior", source + "'s Split").get<std::string>(), source);
  step.invert = j.value("invert", false);
  return step;
}

SplitStep parse_byte_level(const json& j, const std::string& source) {
  SplitStep step;
  step.prefix_space = j.value("add_prefix_space", false);
  if (j.value("use_regex", true)) step.regex = compile_regex(kGpt2Pattern, source);
  return step;
}

// The steps of the pre-tokenizer; the last must be ByteLevel (which maps bytes to characters).
std::vector<SplitStep> parse_pre_tokenizer(const json& j, const std::string& source) {
  std::vector<const json*> items;
  if (type_of(j) == "Sequence")
    for (const auto& p : member(j, "pretokenizers", source + "'s pre_tokenizer")) items.push_back(&p);
  else if (!j.is_null())
    items.push_back(&j);
  TANDEM_CHECK(!items.empty() && type_of(*items.back()) == "ByteLevel", source,
               ": the pre_tokenizer does not end with ByteLevel, so this is not a byte-level BPE tokenizer "
               "(GPT-2, Llama 3 style); for a SentencePiece-style one give its tokenizer.model instead");
  std::vector<SplitStep> steps;
  for (const json* p : items) {
    const std::string type = type_of(*p);
    TANDEM_CHECK(type == "Split" || type == "ByteLevel", source, ": pre-tokenizer '", type,
                 "' is not read by tandem (it reads Split, ByteLevel and a Sequence of them)");
    TANDEM_CHECK(type == "Split" || p == items.back(), source, ": ByteLevel must be the last pre-tokenizer");
    steps.push_back(type == "Split" ? parse_split(*p, source) : parse_byte_level(*p, source));
  }
  return steps;
}

void parse_vocab(const json& model, Model& m) {
  for (const auto& [token, id] : member(model, "vocab", m.source + "'s model").items()) {
    const auto value = id.get<int64_t>();
    TANDEM_CHECK(value >= 0 && value < (int64_t{1} << 31), m.source, ": vocabulary id ", value, " of '", token,
                 "' is out of range");
    m.vocab.emplace(token, static_cast<TokenId>(value));
  }
}

void parse_merges(const json& model, Model& m) {
  int32_t rank = 0;
  for (const auto& merge : member(model, "merges", m.source + "'s model")) {
    std::string a, b;
    if (merge.is_array() && merge.size() == 2) {
      a = merge[0].get<std::string>(), b = merge[1].get<std::string>();
    } else {
      const auto text = merge.get<std::string>();
      const auto space = text.find(' ');
      TANDEM_CHECK(space != std::string::npos, m.source, ": merge ", rank, " '", text, "' is not two tokens");
      a = text.substr(0, space), b = text.substr(space + 1);
    }
    const auto left = m.vocab.find(a), right = m.vocab.find(b), merged = m.vocab.find(a + b);
    TANDEM_CHECK(left != m.vocab.end() && right != m.vocab.end() && merged != m.vocab.end(), m.source, ": merge ", rank,
                 " ('", a, "', '", b, "') names a token the vocabulary lacks; the file is damaged");
    m.merges.emplace(pair_key(left->second, right->second), MergeRule{rank++, merged->second});
  }
}

void parse_model(const json& model, Model& m) {
  const std::string type = type_of(model);
  TANDEM_CHECK(type == "BPE", m.source, ": model '", type,
               "' is not read by tandem (it reads byte-level BPE; for a SentencePiece model give tokenizer.model)");
  TANDEM_CHECK(!model.value("byte_fallback", false), m.source,
               ": a BPE with byte_fallback is SentencePiece-style (Llama 2, Mistral); give its tokenizer.model");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    TANDEM_CHECK(!model.contains(key) || model[key].is_null() || model[key].get<std::string>().empty(), m.source,
                 ": model.", key, " is set, which byte-level BPE does not use; tandem does not read it");
  m.ignore_merges = model.value("ignore_merges", false);
  parse_vocab(model, m);
  parse_merges(model, m);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto it = m.vocab.find(model["unk_token"].get<std::string>());
    if (it != m.vocab.end()) m.unk = it->second;
  }
}

void parse_added_tokens(const json& list, Model& m) {
  if (list.is_null()) return;
  for (const auto& t : list) {
    AddedToken a;
    a.id = member(t, "id", m.source + "'s added token").get<TokenId>();
    a.content = member(t, "content", m.source + "'s added token").get<std::string>();
    a.special = t.value("special", false);
    a.single_word = t.value("single_word", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.normalized = t.value("normalized", !a.special);
    m.added_ids[a.content] = a.id;
    m.added.push_back(std::move(a));
  }
  for (size_t i = 0; i < m.added.size(); ++i) {
    const AddedToken& a = m.added[i];
    if (!a.normalized) {
      m.raw_matcher.add(a.content, static_cast<int>(i));
    } else {
      std::string storage;
      m.normalized_matcher.add(normalize(m, a.content, storage), static_cast<int>(i));
    }
  }
}

std::vector<TokenId> special_ids(const json& processor, const std::string& name, const Model& m) {
  const json& specials = member(processor, "special_tokens", m.source + "'s post_processor");
  if (specials.contains(name)) return specials[name].at("ids").get<std::vector<TokenId>>();
  const auto id = m.find(name);
  TANDEM_CHECK(id.has_value(), m.source, ": the post_processor's template names '", name,
               "', which it does not define");
  return {*id};
}

void parse_post_processor(const json& p, Model& m) {
  const std::string type = p.is_null() ? "" : type_of(p);
  if (type.empty() || type == "ByteLevel") return;
  if (type == "Sequence") {
    for (const auto& q : member(p, "processors", m.source + "'s post_processor")) parse_post_processor(q, m);
  } else if (type == "TemplateProcessing") {
    bool after = false;
    for (const auto& piece : member(p, "single", m.source + "'s TemplateProcessing")) {
      if (piece.contains("Sequence")) {
        after = true;
        continue;
      }
      const auto name = member(piece, "SpecialToken", m.source + "'s template").at("id").get<std::string>();
      auto& into = after ? m.template_after : m.template_before;
      for (TokenId id : special_ids(p, name, m)) into.push_back(id);
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    m.template_before.push_back(member(p, "cls", m.source)[1].get<TokenId>());
    m.template_after.push_back(member(p, "sep", m.source)[1].get<TokenId>());
  } else {
    TANDEM_FAIL(m.source, ": post_processor '", type, "' is not read by tandem (it reads TemplateProcessing, ",
                "ByteLevel, RobertaProcessing, BertProcessing and a Sequence of them)");
  }
}

void check_decoder(const json& d, const std::string& source) {
  const std::string type = d.is_null() ? "none" : type_of(d);
  if (type == "Sequence") {
    for (const auto& e : member(d, "decoders", source + "'s decoder")) check_decoder(e, source);
    return;
  }
  TANDEM_CHECK(type == "ByteLevel", source, ": decoder '", type,
               "' is not ByteLevel, so this is not a byte-level BPE tokenizer; for a SentencePiece-style one "
               "give its tokenizer.model");
}

// id -> stored form, decoded bytes and special flag, over the model vocabulary and the added tokens.
void build_tables(Model& m) {
  int64_t size = 0;
  for (const auto& [token, id] : m.vocab) size = std::max<int64_t>(size, id + 1);
  for (const auto& a : m.added) size = std::max<int64_t>(size, a.id + 1);
  m.stored.assign(static_cast<size_t>(size), "");
  m.bytes.assign(static_cast<size_t>(size), "");
  m.special.assign(static_cast<size_t>(size), 0);
  m.byte_ids.fill(-1);
  for (const auto& [token, id] : m.vocab) {
    m.stored[id] = token;
    if (auto raw = byte_level_bytes(token)) {
      if (raw->size() == 1) m.byte_ids[static_cast<unsigned char>((*raw)[0])] = id;
      m.raw_vocab.emplace(*raw, id);
    }
  }
  for (const auto& a : m.added) {
    m.stored[a.id] = a.content;
    m.special[a.id] = a.special;
  }
  for (size_t id = 0; id < m.stored.size(); ++id) m.bytes[id] = byte_level_bytes(m.stored[id]).value_or(m.stored[id]);
}

// BOS and EOS: the names given (tokenizer_config.json), else the template's first token and the
// usual end-of-text names.
void choose_bos_eos(Model& m, const SpecialTokenNames& names) {
  auto named = [&](const std::optional<std::string>& name, const char* what) -> std::optional<TokenId> {
    if (!name) return std::nullopt;
    const auto id = m.find(*name);
    TANDEM_CHECK(id.has_value(), m.source, " has no token '", *name, "', which the ", what,
                 " names; fix the name (tokenizer_config.json or --eos)");
    return id;
  };
  auto first_of = [&](std::initializer_list<const char*> candidates) -> std::optional<TokenId> {
    for (const char* c : candidates)
      if (auto id = m.find(c)) return id;
    return std::nullopt;
  };
  m.bos = names.bos                    ? named(names.bos, "BOS setting")
          : !m.template_before.empty() ? std::optional<TokenId>(m.template_before.front())
                                       : first_of({"<|begin_of_text|>", "<s>", "<bos>"});
  m.eos = names.eos ? named(names.eos, "EOS setting")
                    : first_of({"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>"});
}

}  // namespace

// Note [Document pieces]
// `tandem tokenize` encodes one long document in pieces on several cores, so it may only cut where
// the ids of the parts equal the ids of the whole. For byte-level BPE that is after a line break
// that follows a printable ASCII character and precedes an ASCII letter ("end.\nNext"): the
// GPT-2 and Llama 3 families of patterns end a piece at such a line break whether or not more text
// follows (two whitespace characters would not do: \s+(?!\S) reads the end of a text differently)
// and never join a line break to the letter after it. A tokenizer qualifies only when its
// pre-tokenizer splits there on probe texts exactly as it does whole, and no added token contains a
// line break or strips whitespace on its left, and ByteLevel adds no prefix space. SentencePiece
// never qualifies (its dummy prefix would start each piece); bytes always do.
namespace {

// The pre-tokenizer's words of `text` (the same pieces BPE would merge).
std::vector<std::string> words_of(const Model& m, std::string_view text) {
  EncodeScratch scratch(m);
  std::vector<std::string> words;
  pre_tokenize(m, text, 0, scratch, [&](std::string_view w) { words.emplace_back(w); });
  return words;
}

bool cuts_are_safe(const Model& m) {
  for (const auto& a : m.added)
    if (a.lstrip || a.content.find('\n') != std::string::npos) return false;
  bool splits = false;
  for (const auto& s : m.steps) {
    if (s.prefix_space) return false;
    splits = splits || s.regex || !s.literal.empty();
  }
  if (!splits) return false;
  for (const std::string probe : {"Hello world.\nNext line", "a\nB", "end,\nStart", "x)\nyes", "9\nq", "it's\nOk"}) {
    const size_t cut = probe.find('\n') + 1;
    auto parts = words_of(m, std::string_view(probe).substr(0, cut));
    for (auto& w : words_of(m, std::string_view(probe).substr(cut))) parts.push_back(std::move(w));
    if (parts != words_of(m, probe)) return false;
  }
  return true;
}

}  // namespace

// ---- BpeTokenizer ---------------------------------------------------------------------------

BpeTokenizer::BpeTokenizer(std::unique_ptr<Model> model) : m_(std::move(model)) {}
BpeTokenizer::~BpeTokenizer() = default;

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_file(const std::string& path, const SpecialTokenNames& names) {
  return from_json(read_file(path, "tokenizer file"), path, names);
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_json(const std::string& json_text, const std::string& source,
                                                      const SpecialTokenNames& names) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    TANDEM_FAIL(source, " is not valid JSON (", e.what(), "); re-download or re-save the tokenizer");
  }
  auto m = std::make_unique<Model>();
  m->source = source;
  try {
    m->normalizers = parse_normalizer(j.value("normalizer", json()), source);
    m->steps = parse_pre_tokenizer(j.value("pre_tokenizer", json()), source);
    parse_model(member(j, "model", source), *m);
    parse_added_tokens(j.value("added_tokens", json()), *m);
    parse_post_processor(j.value("post_processor", json()), *m);
    check_decoder(j.value("decoder", json()), source);
  } catch (const json::exception& e) {
    TANDEM_FAIL(source, ": unexpected tokenizer.json structure (", e.what(),
                "); is it a Hugging Face tokenizer.json written by `tokenizers`?");
  }
  build_tables(*m);
  TANDEM_CHECK(!m->vocab.empty(), source, " has an empty vocabulary; the file is damaged");
  choose_bos_eos(*m, names);
  m->cuttable = cuts_are_safe(*m);
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(m)));
}

std::vector<TokenId> BpeTokenizer::encode(std::string_view text, SpecialTokens special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (special == SpecialTokens::kInclude) out = m_->template_before;
  EncodeScratch scratch(*m_);
  encode_text(*m_, text, scratch, out);
  if (special == SpecialTokens::kInclude) out.insert(out.end(), m_->template_after.begin(), m_->template_after.end());
  return out;
}

std::string BpeTokenizer::decode(const std::vector<TokenId>& ids, SpecialTokens special) const {
  std::string bytes;
  for (TokenId id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (special == SpecialTokens::kOmit && m_->special[id]) continue;
    bytes += m_->bytes[id];
  }
  return utf8_lossy(bytes);
}

std::string BpeTokenizer::token_bytes(TokenId id, TokenPlace) const {
  return id >= 0 && id < vocab_size() ? m_->bytes[id] : std::string();
}

int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(m_->stored.size()); }
std::optional<TokenId> BpeTokenizer::bos_id() const { return m_->bos; }
std::optional<TokenId> BpeTokenizer::eos_id() const { return m_->eos; }
std::optional<TokenId> BpeTokenizer::token_to_id(std::string_view token) const { return m_->find(token); }

std::string BpeTokenizer::id_to_token(TokenId id) const {
  return id >= 0 && id < vocab_size() ? m_->stored[id] : std::string();
}

std::vector<SpecialToken> BpeTokenizer::special_tokens() const {
  std::vector<SpecialToken> out;
  for (const auto& a : m_->added)
    if (a.special) out.push_back({a.id, a.content});
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

size_t BpeTokenizer::piece_boundary(std::string_view text, size_t limit) const {
  if (!m_->cuttable) return 0;
  const auto is_letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  for (size_t p = std::min(limit, text.size() - 1); p >= 2 && p < text.size(); --p)
    if (text[p - 1] == '\n' && is_letter(text[p]) && text[p - 2] > ' ' && text[p - 2] < 0x7F) return p;
  return 0;
}

std::string BpeTokenizer::description() const {
  auto name = [&](const std::optional<TokenId>& id) {
    return id ? "'" + m_->stored[*id] + "' (" + std::to_string(*id) + ")" : std::string("none");
  };
  return strprintf("byte-level BPE from %s: %lld tokens (%zu added), BOS %s, EOS %s", m_->source.c_str(),
                   static_cast<long long>(vocab_size()), m_->added.size(), name(m_->bos).c_str(),
                   name(m_->eos).c_str());
}

}  // namespace tandem
