#include "tandem/data/sp_bpe_tokenizer.h"

#include <unicode/utf8.h>

#include <algorithm>
#include <array>
#include <unordered_map>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/strings.h"
#include "tandem/data/added_tokens.h"
#include "tandem/data/bpe_merges.h"
#include "tandem/data/text_decoder.h"
#include "tandem/data/text_normalizer.h"
#include "tandem/data/text_split.h"

// Note [SentencePiece-style BPE]
// transformers converts a SentencePiece BPE model (tokenizer.model) to tokenizer.json in a few
// shapes, all read here as `tokenizers` runs them:
// - convert_slow_tokenizer's LlamaConverter, legacy (Llama 2, Mistral 7B v0.1 on the Hub):
//   normalizer Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer;
// - LlamaConverter non-legacy and transformers 5's LlamaTokenizer: no normalizer, pre-tokenizer
//   Metaspace("▁", prepend_scheme first (legacy: always; add_prefix_space false: never), split false);
// - GemmaConverter and transformers 5's GemmaTokenizer: normalizer Replace(" ", "▁") (no dummy
//   prefix), pre-tokenizer none or Split(" ", MergedWithPrevious);
// - SpmConverter.build_tokenizer_from_spm_proto (a tokenizer.model with no model class):
//   Replace normalizers (string and regex), Metaspace, a Split of user-defined pieces, ignore_merges.
// Metaspace replaces spaces, then prepends "▁" to a piece that does not start with one (kFirst:
// only to the piece at the start of the text, i.e. not after an added token). The model looks each
// character (code point) up in the vocabulary; a character that is not there becomes the <0xXX>
// tokens of its UTF-8 bytes when byte_fallback is set and all of them exist, else unk_token (runs
// fused with fuse_unk), else nothing. Malformed UTF-8 in the input counts byte by byte. Then the
// merges by rank (bpe_merges.h); ignore_merges takes a word that is in the vocabulary whole.
// Decoding runs the decoder chain (text_decoder.h), e.g. Replace("▁", " "), ByteFallback (a run of
// byte tokens that is not UTF-8 becomes one U+FFFD per token), Fuse, Strip(" ", 1, 0).

namespace tandem {

using namespace detail;  // NOLINT: this file implements the SentencePiece-style reader of tokenizer.json

namespace {

// One step of the pre-tokenizer: Metaspace or Split.
struct PreStep {
  enum class Kind { kMetaspace, kSplit } kind = Kind::kSplit;
  SplitStep split;          // kSplit; kMetaspace with split: on `replacement`, MergedWithNext
  std::string replacement;  // kMetaspace
  PrependScheme prepend = PrependScheme::kAlways;
  bool split_words = false;
};

}  // namespace

struct SpBpeTokenizer::Model {
  std::string source;
  TextNormalizer normalizer;
  std::vector<PreStep> pre;
  std::unordered_map<std::string, TokenId> vocab;  // the BPE model's
  std::array<TokenId, 128> ascii_ids{};            // one-character ASCII tokens; -1 when absent
  std::unordered_map<UChar32, TokenId> char_ids;   // other one-character tokens
  std::array<TokenId, 256> byte_ids{};             // <0xXX> tokens; -1 when absent
  MergeTable merges;
  std::optional<TokenId> unk;
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  bool split_at_spaces = false;  // Note [Words at space runs]
  AddedTokens added;
  TokenTemplate tmpl;
  TextDecoder decoder;
  std::vector<std::string> stored;         // id -> stored form ("" for unused ids)
  std::vector<std::string> first, follow;  // id -> token_bytes at kFirst, kFollowing
  std::vector<char> special;               // id -> a special added token
  std::optional<TokenId> bos, eos;
  mutable WordCache cache;

  std::optional<TokenId> find(std::string_view token) const {
    if (auto id = added.find(token)) return id;
    if (auto it = vocab.find(std::string(token)); it != vocab.end()) return it->second;
    return std::nullopt;
  }
  std::optional<TokenId> char_id(UChar32 c) const {
    if (c >= 0 && c < 128) return ascii_ids[c] >= 0 ? std::optional<TokenId>(ascii_ids[c]) : std::nullopt;
    const auto it = char_ids.find(c);
    return c >= 0 && it != char_ids.end() ? std::optional<TokenId>(it->second) : std::nullopt;
  }
  std::string_view normalize(std::string_view text, std::string& storage) const {
    return normalizer.apply(text, storage);
  }
};

namespace {

using Model = SpBpeTokenizer::Model;
using WordSink = std::function<void(std::string_view)>;

struct EncodeScratch {
  std::vector<std::unique_ptr<icu::RegexMatcher>> matchers;  // per pre-tokenizer step
  std::vector<TokenId> initial;
  MergeScratch merge;

  explicit EncodeScratch(const Model& m) {
    for (const auto& step : m.pre) matchers.push_back(new_matcher(step.split.regex.get()));
  }
};

// Metaspace on one piece: spaces replaced, the replacement prepended as its scheme says.
std::string metaspace(const PreStep& s, std::string_view piece, bool at_start) {
  std::string out;
  for (char c : piece) {
    if (c == ' ')
      out.append(s.replacement);
    else
      out.push_back(c);
  }
  const bool starts = out.compare(0, s.replacement.size(), s.replacement) == 0;
  if (!starts && (s.prepend == PrependScheme::kAlways || (s.prepend == PrependScheme::kFirst && at_start)))
    out.insert(0, s.replacement);
  return out;
}

void pre_tokenize(const Model& m, std::string_view piece, bool at_start, size_t step, EncodeScratch& scratch,
                  const WordSink& word) {
  if (step == m.pre.size()) {
    word(piece);
    return;
  }
  const PreStep& s = m.pre[step];
  std::string storage;
  if (s.kind == PreStep::Kind::kMetaspace) {
    storage = metaspace(s, piece, at_start);
    piece = storage;
    if (!s.split_words) {
      pre_tokenize(m, piece, at_start, step + 1, scratch, word);
      return;
    }
  }
  for (const auto& [a, b] : split_pieces(piece, s.split, scratch.matchers[step].get()))
    pre_tokenize(m, piece.substr(a, b - a), at_start && a == 0, step + 1, scratch, word);
}

// The word's characters as ids (Note [SentencePiece-style BPE]), before merging.
void initial_symbols(const Model& m, std::string_view word, std::vector<TokenId>& ids) {
  ids.clear();
  std::optional<TokenId> unk;  // an unknown run not yet added
  const auto* s = reinterpret_cast<const uint8_t*>(word.data());
  const auto n = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < n;) {
    const int32_t begin = i;
    UChar32 c;
    U8_NEXT(s, i, n, c);
    if (const auto id = m.char_id(c)) {
      if (unk) ids.push_back(*unk), unk.reset();
      ids.push_back(*id);
      continue;
    }
    const bool bytes_known =
        m.byte_fallback && std::all_of(s + begin, s + i, [&](uint8_t b) { return m.byte_ids[b] >= 0; });
    if (bytes_known) {  // a pending unknown run stays pending, as in `tokenizers`
      for (int32_t k = begin; k < i; ++k) ids.push_back(m.byte_ids[s[k]]);
      continue;
    }
    if (!m.unk) continue;  // no unk_token: the character is dropped
    if (unk && m.fuse_unk) continue;
    if (unk) ids.push_back(*unk);
    unk = m.unk;
  }
  if (unk) ids.push_back(*unk);
}

// Note [Words at space runs]
// With no pre-tokenizer that splits (a converted Llama 2 or Mistral, a tokenizer.model read as BPE:
// Note [SentencePiece model as BPE]) the whole text is one word, merged at once and never found in
// the word cache. When no token of the vocabulary has a "▁" after another character than "▁" (as
// SentencePiece's trainer makes them: a space starts a piece, runs of spaces stay together), no
// merge can join a character to a "▁" that follows it, so the text splits before each run of "▁"
// into words whose merges are those of the whole text: merges of different words never meet, and
// within a word they go in the same order. "▁" must be a token itself, so that a run of unknown
// characters (fused into one unk) cannot reach over a split either; and without ignore_merges, which
// looks the whole word up first. The words, a few bytes each, then come from the cache.
bool splits_at_spaces(const Model& m) {
  static constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581
  if (m.ignore_merges || !m.char_id(0x2581)) return false;
  for (const auto& [token, id] : m.vocab)
    for (size_t at = token.find(kSpace, 1); at != std::string::npos; at = token.find(kSpace, at + 1))
      if (at < kSpace.size() || token.compare(at - kSpace.size(), kSpace.size(), kSpace) != 0) return false;
  return true;
}

// `word` cut before each run of "▁" that does not start it (Note [Words at space runs]).
template <class F>
void for_each_space_word(std::string_view word, F&& f) {
  static constexpr std::string_view kSpace = "\xE2\x96\x81";
  size_t start = 0;
  for (size_t at = word.find(kSpace, 1); at != std::string_view::npos; at = word.find(kSpace, at + kSpace.size())) {
    const bool run_start = at >= kSpace.size() && word.compare(at - kSpace.size(), kSpace.size(), kSpace) != 0;
    if (!run_start || at == start) continue;
    f(word.substr(start, at - start));
    start = at;
  }
  f(word.substr(start));
}

void encode_merged(const Model& m, std::string_view word, EncodeScratch& scratch, std::vector<TokenId>& out);

void encode_word(const Model& m, std::string_view word, EncodeScratch& scratch, std::vector<TokenId>& out) {
  if (!m.split_at_spaces) return encode_merged(m, word, scratch, out);
  for_each_space_word(word, [&](std::string_view w) { encode_merged(m, w, scratch, out); });
}

// One word through the cache, or its characters merged.
void encode_merged(const Model& m, std::string_view word, EncodeScratch& scratch, std::vector<TokenId>& out) {
  if (m.ignore_merges) {
    if (const auto it = m.vocab.find(std::string(word)); it != m.vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= WordCache::kMaxWordBytes;
  if (cacheable && m.cache.lookup(word, out)) return;
  const size_t before = out.size();
  initial_symbols(m, word, scratch.initial);
  merge_symbols(m.merges, scratch.initial, scratch.merge, out);
  if (cacheable) m.cache.insert(word, out.data() + before, out.size() - before);
}

// ---- Reading tokenizer.json -----------------------------------------------------------------

PreStep parse_metaspace(const json& j, const std::string& source) {
  PreStep step;
  step.kind = PreStep::Kind::kMetaspace;
  step.replacement = member(j, "replacement", source + "'s Metaspace pre-tokenizer").get<std::string>();
  step.prepend = parse_prepend_scheme(j, source);
  step.split_words = j.value("split", true);
  step.split.literal = step.replacement;
  step.split.behavior = SplitBehavior::kMergedWithNext;
  return step;
}

std::vector<PreStep> parse_pre_tokenizer(const json& j, const std::string& source) {
  std::vector<const json*> items;
  if (type_of(j) == "Sequence")
    for (const auto& p : member(j, "pretokenizers", source + "'s pre_tokenizer")) items.push_back(&p);
  else if (!j.is_null())
    items.push_back(&j);
  std::vector<PreStep> steps;
  for (const json* p : items) {
    const std::string type = type_of(*p);
    TANDEM_CHECK(type == "Metaspace" || type == "Split", source, ": pre-tokenizer '", type,
                 "' is not read by tandem for a SentencePiece-style BPE (it reads Metaspace, Split and a Sequence of "
                 "them); give the model's tokenizer.model instead");
    if (type == "Metaspace") {
      steps.push_back(parse_metaspace(*p, source));
    } else {
      PreStep step;
      step.split = parse_split(*p, source);
      steps.push_back(std::move(step));
    }
  }
  return steps;
}

void check_model_options(const json& model, const std::string& source) {
  const std::string type = type_of(model);
  TANDEM_CHECK(type == "BPE", source, ": model '", type, "' is not a BPE; give the model's tokenizer.model instead");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    TANDEM_CHECK(!model.contains(key) || model[key].is_null() || model[key].get<std::string>().empty(), source,
                 ": model.", key, " is set, which SentencePiece-style BPE does not use; tandem does not read it");
  const bool dropout = model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0;
  TANDEM_CHECK(!dropout, source,
               ": model.dropout is set (random merges while training); tandem encodes "
               "deterministically: set \"dropout\" to null");
}

void parse_model(const json& model, Model& m) {
  check_model_options(model, m.source);
  m.byte_fallback = model.value("byte_fallback", false);
  m.fuse_unk = model.value("fuse_unk", false);
  m.ignore_merges = model.value("ignore_merges", false);
  for (auto& [token, id] : parse_vocab(model, m.source)) m.vocab.emplace(std::move(token), id);
  m.merges = MergeTable::parse(model, m.vocab, m.source);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto name = model["unk_token"].get<std::string>();
    const auto it = m.vocab.find(name);
    TANDEM_CHECK(it != m.vocab.end(), m.source, ": model.unk_token '", name,
                 "' is not in the vocabulary; the file is damaged (fix unk_token or set it to null)");
    m.unk = it->second;
  }
}

// The one-character and byte tokens, and id -> stored form, streaming bytes and special flag.
void build_tables(Model& m) {
  m.ascii_ids.fill(-1);
  m.byte_ids.fill(-1);
  for (const auto& [token, id] : m.vocab) {
    const auto* s = reinterpret_cast<const uint8_t*>(token.data());
    int32_t i = 0;
    UChar32 c;
    U8_NEXT(s, i, static_cast<int32_t>(token.size()), c);
    if (c >= 0 && i == static_cast<int32_t>(token.size())) (c < 128 ? m.ascii_ids[c] : m.char_ids[c]) = id;
  }
  for (int b = 0; b < 256; ++b)
    if (const auto it = m.vocab.find(strprintf("<0x%02X>", b)); it != m.vocab.end()) m.byte_ids[b] = it->second;
  int64_t size = 0;
  for (const auto& [token, id] : m.vocab) size = std::max<int64_t>(size, id + 1);
  for (const auto& a : m.added.tokens) size = std::max<int64_t>(size, a.id + 1);
  m.stored.assign(static_cast<size_t>(size), "");
  m.special.assign(static_cast<size_t>(size), 0);
  for (const auto& [token, id] : m.vocab) m.stored[id] = token;
  for (const auto& a : m.added.tokens) m.stored[a.id] = a.content, m.special[a.id] = a.special;
  m.first.resize(m.stored.size());
  m.follow.resize(m.stored.size());
  for (size_t id = 0; id < m.stored.size(); ++id) {
    m.first[id] = m.decoder.token_text(m.stored[id], true);
    m.follow[id] = m.decoder.token_text(m.stored[id], false);
  }
}

}  // namespace

// ---- SpBpeTokenizer -------------------------------------------------------------------------

SpBpeTokenizer::SpBpeTokenizer(std::unique_ptr<Model> model) : m_(std::move(model)) {}
SpBpeTokenizer::~SpBpeTokenizer() = default;

std::unique_ptr<SpBpeTokenizer> SpBpeTokenizer::from_file(const std::string& path, const SpecialTokenNames& names) {
  return from_json(read_file(path, "tokenizer file"), path, names);
}

std::unique_ptr<SpBpeTokenizer> SpBpeTokenizer::from_json(const std::string& json_text, const std::string& source,
                                                          const SpecialTokenNames& names) {
  return from_parsed(parse_tokenizer_json(json_text, source), source, names);
}

std::unique_ptr<SpBpeTokenizer> SpBpeTokenizer::from_parsed(const nlohmann::json& j, const std::string& source,
                                                            const SpecialTokenNames& names) {
  auto m = std::make_unique<Model>();
  m->source = source;
  const FindToken find = [&m = *m](std::string_view t) { return m.find(t); };
  try {
    m->normalizer = TextNormalizer::parse(j.value("normalizer", json()), source);
    m->pre = parse_pre_tokenizer(j.value("pre_tokenizer", json()), source);
    parse_model(member(j, "model", source), *m);
    m->added = AddedTokens::parse(j.value("added_tokens", json()), source,
                                  [&m = *m](std::string_view t, std::string& s) { return m.normalize(t, s); });
    m->tmpl = parse_post_processor(j.value("post_processor", json()), source, find);
    m->decoder = TextDecoder::parse(j.value("decoder", json()), source);
  } catch (const json::exception& e) {
    TANDEM_FAIL(source, ": unexpected tokenizer.json structure (", e.what(),
                "); is it a Hugging Face tokenizer.json written by `tokenizers`?");
  }
  TANDEM_CHECK(!m->vocab.empty(), source, " has an empty vocabulary; the file is damaged");
  build_tables(*m);
  m->split_at_spaces = splits_at_spaces(*m);
  std::tie(m->bos, m->eos) = choose_bos_eos(names, m->tmpl, source, find);
  return std::unique_ptr<SpBpeTokenizer>(new SpBpeTokenizer(std::move(m)));
}

std::vector<TokenId> SpBpeTokenizer::encode(std::string_view text, SpecialTokens special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 4);
  if (special == SpecialTokens::kInclude) out = m_->tmpl.before;
  EncodeScratch scratch(*m_);
  const WordSink word = [&](std::string_view w) { encode_word(*m_, w, scratch, out); };
  m_->added.split(
      text, [&](std::string_view t, std::string& storage) { return m_->normalize(t, storage); },
      [&](std::string_view piece, bool at_start) { pre_tokenize(*m_, piece, at_start, 0, scratch, word); },
      [&](TokenId id) { out.push_back(id); });
  if (special == SpecialTokens::kInclude) out.insert(out.end(), m_->tmpl.after.begin(), m_->tmpl.after.end());
  return out;
}

std::string SpBpeTokenizer::decode(const std::vector<TokenId>& ids, SpecialTokens special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (TokenId id : ids) {
    if (id < 0 || id >= vocab_size() || m_->stored[id].empty()) continue;
    if (special == SpecialTokens::kOmit && m_->special[id]) continue;
    tokens.push_back(m_->stored[id]);
  }
  return m_->decoder.decode(std::move(tokens));
}

std::string SpBpeTokenizer::token_bytes(TokenId id, TokenPlace place) const {
  if (id < 0 || id >= vocab_size()) return "";
  return place == TokenPlace::kFirst ? m_->first[id] : m_->follow[id];
}

int64_t SpBpeTokenizer::vocab_size() const { return static_cast<int64_t>(m_->stored.size()); }
std::optional<TokenId> SpBpeTokenizer::bos_id() const { return m_->bos; }
std::optional<TokenId> SpBpeTokenizer::eos_id() const { return m_->eos; }
std::optional<TokenId> SpBpeTokenizer::token_to_id(std::string_view token) const { return m_->find(token); }

std::string SpBpeTokenizer::id_to_token(TokenId id) const {
  return id >= 0 && id < vocab_size() ? m_->stored[id] : std::string();
}

std::vector<SpecialToken> SpBpeTokenizer::special_tokens() const { return m_->added.special(); }

std::string SpBpeTokenizer::description() const {
  return describe_json_tokenizer("SentencePiece-style BPE", m_->source, m_->stored, m_->added.tokens.size(), m_->bos,
                                 m_->eos);
}

}  // namespace tandem
