#include "tandem/data/bpe_tokenizer.h"

#include <unicode/utf8.h>

#include <algorithm>
#include <array>
#include <unordered_map>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/strings.h"
#include "tandem/data/added_tokens.h"
#include "tandem/data/bpe_merges.h"
#include "tandem/data/text_normalizer.h"
#include "tandem/data/text_split.h"

// Note [Byte-level BPE]
// What tandem reads of a Hugging Face tokenizer.json, in the order `tokenizers` applies it:
// 1. Added tokens are split out of the text before anything else (added_tokens.h).
// 2. The normalizer: none, Unicode normal forms (by ICU), Prepend, Replace, Strip (text_normalizer.h).
// 3. The pre-tokenizer: Split (a Regex or a String, any split behaviour, invert), ByteLevel (its
//    add_prefix_space, and GPT-2's regex when use_regex) and a Sequence of those ending in ByteLevel.
//    The file's regexes are Oniguruma patterns; ICU runs them as written: both read \p{L}, \p{N},
//    (?i:...) with Unicode case folding, lookahead, and \s as the White_Space property (U+000B and
//    U+0085 included, whatever ICU's documentation says; the parity test holds both to it).
// 4. The BPE model. ByteLevel maps every byte to one printable character; tandem keeps the
//    vocabulary keyed by the raw bytes too, so a word is merged from its bytes without building
//    that string. Merges by rank (bpe_merges.h); with ignore_merges (Llama 3) a word that is
//    itself in the vocabulary is one token. Words' ids are cached.
// 5. The post-processor's template (TemplateProcessing, Roberta/Bert, ByteLevel, a Sequence) adds
//    its special tokens when encode is asked to (SpecialTokens::kInclude).
// 6. Decoding maps each token's characters back to bytes (a token with a character outside the
//    alphabet, e.g. an added token with a space, is taken as its UTF-8 text, as `tokenizers`
//    does) and replaces malformed UTF-8 by U+FFFD.
// Refused with the reason: WordPiece/Unigram models, other normalizers, pre-tokenizers and
// decoders. SentencePiece-style BPE (byte_fallback, Metaspace) is SpBpeTokenizer's (Note [Two
// kinds of BPE tokenizer.json]).

namespace tandem {

using namespace detail;  // NOLINT: this file implements the byte-level reader of tokenizer.json

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

// GPT-2's pattern, which ByteLevel(use_regex=true) splits with.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

// ---- The parsed file ------------------------------------------------------------------------

struct BpeTokenizer::Model {
  std::string source;
  TextNormalizer normalizer;
  std::vector<SplitStep> steps;
  std::unordered_map<std::string, TokenId> vocab;      // stored form -> id (the BPE model's)
  std::unordered_map<std::string, TokenId> raw_vocab;  // raw bytes -> id (ignore_merges)
  std::array<TokenId, 256> byte_ids{};                 // the one-byte tokens; -1 when absent
  MergeTable merges;
  std::optional<TokenId> unk;
  bool ignore_merges = false;
  AddedTokens added;
  TokenTemplate tmpl;               // the single-sequence template around $A
  std::vector<std::string> stored;  // id -> stored form ("" for unused ids)
  std::vector<std::string> bytes;   // id -> the bytes it decodes to
  std::vector<char> special;        // id -> a special added token
  std::optional<TokenId> bos, eos;
  bool cuttable = false;  // Note [Document pieces]
  mutable WordCache cache;

  std::optional<TokenId> find(std::string_view token) const {
    if (auto id = added.find(token)) return id;
    if (auto it = vocab.find(std::string(token)); it != vocab.end()) return it->second;
    return std::nullopt;
  }
  std::string_view normalize(std::string_view text, std::string& storage) const {
    return normalizer.apply(text, storage);
  }
};

namespace {

using Model = BpeTokenizer::Model;

// Per-call state: an ICU RegexMatcher holds match state, so each encode has its own.
struct EncodeScratch {
  std::vector<std::unique_ptr<icu::RegexMatcher>> matchers;
  std::vector<TokenId> initial;
  MergeScratch merge;

  explicit EncodeScratch(const Model& m) {
    for (const auto& step : m.steps) matchers.push_back(new_matcher(step.regex.get()));
  }
};

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
  for (const auto& [a, b] : split_pieces(piece, s, scratch.matchers[step].get()))
    pre_tokenize(m, piece.substr(a, b - a), step + 1, scratch, word);
}

// The word's bytes merged by rank (Note [Byte-level BPE]); appends the ids to `out`.
void merge_bytes(const Model& m, std::string_view word, EncodeScratch& scratch, std::vector<TokenId>& out) {
  auto& ids = scratch.initial;
  ids.clear();
  for (char ch : word) {
    TokenId id = m.byte_ids[static_cast<unsigned char>(ch)];
    if (id < 0 && !m.unk) continue;  // a byte without a token and no unk_token: dropped, as `tokenizers` does
    ids.push_back(id < 0 ? *m.unk : id);
  }
  merge_symbols(m.merges, ids, scratch.merge, out);
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
  m.added.split(
      text, [&](std::string_view t, std::string& storage) { return m.normalize(t, storage); },
      [&](std::string_view piece, bool) { pre_tokenize(m, piece, 0, scratch, word); },
      [&](TokenId id) { out.push_back(id); });
}

// ---- Reading tokenizer.json -----------------------------------------------------------------

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

void parse_model(const json& model, Model& m) {
  const std::string type = type_of(model);
  TANDEM_CHECK(type == "BPE", m.source, ": model '", type,
               "' is not read by tandem (it reads byte-level BPE; for a SentencePiece model give tokenizer.model)");
  TANDEM_CHECK(!model.value("byte_fallback", false), m.source,
               ": a BPE with byte_fallback is SentencePiece-style (Llama 2, Mistral, Gemma), not byte-level; open "
               "it with open_tokenizer (SpBpeTokenizer reads it), or give its tokenizer.model");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    TANDEM_CHECK(!model.contains(key) || model[key].is_null() || model[key].get<std::string>().empty(), m.source,
                 ": model.", key, " is set, which byte-level BPE does not use; tandem does not read it");
  m.ignore_merges = model.value("ignore_merges", false);
  for (auto& [token, id] : parse_vocab(model, m.source)) m.vocab.emplace(std::move(token), id);
  m.merges = MergeTable::parse(model, m.vocab, m.source);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto it = m.vocab.find(model["unk_token"].get<std::string>());
    if (it != m.vocab.end()) m.unk = it->second;
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
  for (const auto& a : m.added.tokens) size = std::max<int64_t>(size, a.id + 1);
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
  for (const auto& a : m.added.tokens) {
    m.stored[a.id] = a.content;
    m.special[a.id] = a.special;
  }
  for (size_t id = 0; id < m.stored.size(); ++id) m.bytes[id] = byte_level_bytes(m.stored[id]).value_or(m.stored[id]);
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
// never qualifies (its dummy prefix would start each piece), nor does SentencePiece-style BPE;
// bytes always do.
namespace {

// The pre-tokenizer's words of `text` (the same pieces BPE would merge).
std::vector<std::string> words_of(const Model& m, std::string_view text) {
  EncodeScratch scratch(m);
  std::vector<std::string> words;
  pre_tokenize(m, text, 0, scratch, [&](std::string_view w) { words.emplace_back(w); });
  return words;
}

bool cuts_are_safe(const Model& m) {
  for (const auto& a : m.added.tokens)
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
  return from_parsed(parse_tokenizer_json(json_text, source), source, names);
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_parsed(const nlohmann::json& j, const std::string& source,
                                                        const SpecialTokenNames& names) {
  auto m = std::make_unique<Model>();
  m->source = source;
  const FindToken find = [&m = *m](std::string_view t) { return m.find(t); };
  try {
    m->normalizer = TextNormalizer::parse(j.value("normalizer", json()), source);
    m->steps = parse_pre_tokenizer(j.value("pre_tokenizer", json()), source);
    parse_model(member(j, "model", source), *m);
    m->added = AddedTokens::parse(j.value("added_tokens", json()), source,
                                  [&m = *m](std::string_view t, std::string& s) { return m.normalize(t, s); });
    m->tmpl = parse_post_processor(j.value("post_processor", json()), source, find);
    check_decoder(j.value("decoder", json()), source);
  } catch (const json::exception& e) {
    TANDEM_FAIL(source, ": unexpected tokenizer.json structure (", e.what(),
                "); is it a Hugging Face tokenizer.json written by `tokenizers`?");
  }
  build_tables(*m);
  TANDEM_CHECK(!m->vocab.empty(), source, " has an empty vocabulary; the file is damaged");
  std::tie(m->bos, m->eos) = choose_bos_eos(names, m->tmpl, source, find);
  m->cuttable = cuts_are_safe(*m);
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(m)));
}

std::vector<TokenId> BpeTokenizer::encode(std::string_view text, SpecialTokens special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (special == SpecialTokens::kInclude) out = m_->tmpl.before;
  EncodeScratch scratch(*m_);
  encode_text(*m_, text, scratch, out);
  if (special == SpecialTokens::kInclude) out.insert(out.end(), m_->tmpl.after.begin(), m_->tmpl.after.end());
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

std::vector<SpecialToken> BpeTokenizer::special_tokens() const { return m_->added.special(); }

size_t BpeTokenizer::piece_boundary(std::string_view text, size_t limit) const {
  if (!m_->cuttable) return 0;
  const auto is_letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  for (size_t p = std::min(limit, text.size() - 1); p >= 2 && p < text.size(); --p)
    if (text[p - 1] == '\n' && is_letter(text[p]) && text[p - 2] > ' ' && text[p - 2] < 0x7F) return p;
  return 0;
}

std::string BpeTokenizer::description() const {
  return describe_json_tokenizer("byte-level BPE", m_->source, m_->stored, m_->added.tokens.size(), m_->bos, m_->eos);
}

}  // namespace tandem
