#include "tandem/data/sentencepiece_tokenizer.h"

#include <algorithm>
#include <cstdlib>

#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/data/sp_model_proto.h"

#ifdef TANDEM_WITH_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace tandem {

#ifdef TANDEM_WITH_SENTENCEPIECE

struct SentencePieceTokenizer::Processor {
  sentencepiece::SentencePieceProcessor sp;
};

namespace {

constexpr const char* kSpaceSymbol = "\xE2\x96\x81";       // U+2581, SentencePiece's space
constexpr const char* kUnknownSurface = " \xE2\x81\x87 ";  // " ⁇ ", how SentencePiece decodes <unk>

std::string replace_space_symbol(const std::string& piece) {
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, 3, kSpaceSymbol) == 0) {
      out.push_back(' ');
      i += 3;
    } else {
      out.push_back(piece[i++]);
    }
  }
  return out;
}

}  // namespace

bool SentencePieceTokenizer::available() { return true; }

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<Processor> processor, std::string path,
                                               const SentencePieceTemplate& tmpl)
    : sp_(std::move(processor)), path_(std::move(path)), template_(tmpl) {}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::from_file(const std::string& path,
                                                                          const SpecialTokenNames& names,
                                                                          const SentencePieceTemplate& tmpl) {
  auto processor = std::make_unique<Processor>();
  const auto status = processor->sp.Load(path);
  TANDEM_CHECK(status.ok(), "cannot read SentencePiece model '", path, "': ", one_line(status.ToString()),
               "; give a tokenizer.model written by SentencePiece (or the model's folder)");
  std::unique_ptr<SentencePieceTokenizer> t(new SentencePieceTokenizer(std::move(processor), path, tmpl));
  t->choose_bos_eos(names);
  const SpModelProto proto = parse_sp_model_proto(t->sp_->sp.serialized_model_proto(), path);
  t->bpe_ = sp_bpe_for_model(proto, path);
  t->char_ = sp_char_for_model(proto, path);
  t->unigram_ = sp_unigram_for_model(proto, path);
  for (const auto& p : proto.pieces)
    if (p.type == SpModelProto::kUserDefined) t->user_pieces_.add(p.piece, 0);
  return t;
}

void SentencePieceTokenizer::choose_bos_eos(const SpecialTokenNames& names) {
  auto pick = [&](const std::optional<std::string>& name, int own) -> std::optional<TokenId> {
    if (!name) return own >= 0 ? std::optional<TokenId>(own) : std::nullopt;
    const auto id = token_to_id(*name);
    TANDEM_CHECK(id.has_value(), "SentencePiece model '", path_, "' has no piece '", *name,
                 "', which the configuration names as BOS or EOS; fix the name (tokenizer_config.json or --eos)");
    return id;
  };
  bos_ = pick(names.bos, sp_->sp.bos_id());
  eos_ = pick(names.eos, sp_->sp.eos_id());
  // Whether decoding drops the space of a text's first piece (the model's dummy prefix): asked of
  // the library with the first ordinary piece that starts with one.
  for (int id = 0; id < sp_->sp.GetPieceSize(); ++id) {
    const std::string& piece = sp_->sp.IdToPiece(id);
    if (sp_->sp.IsControl(id) || sp_->sp.IsUnknown(id) || sp_->sp.IsByte(id) || piece.rfind(kSpaceSymbol, 0) != 0)
      continue;
    drops_first_space_ = decode({id}) == replace_space_symbol(piece.substr(3));
    break;
  }
}

std::vector<TokenId> SentencePieceTokenizer::encode(std::string_view text, SpecialTokens special) const {
  std::vector<int> ids;
  const auto user_piece = [&] { return !user_pieces_.empty() && user_pieces_.find(text, 0).has_value(); };
  if (bpe_ && !user_piece()) {  // Note [SentencePiece model as BPE]
    const auto bpe_ids = bpe_->encode(text);
    ids.assign(bpe_ids.begin(), bpe_ids.end());
  } else if (char_ && !user_piece()) {  // Note [SentencePiece char model]
    ids = char_->encode(text);
  } else if (unigram_) {  // Note [SentencePiece unigram]
    ids = unigram_->encode(text);
  } else {
    const auto status = sp_->sp.Encode(text, &ids);
    TANDEM_CHECK(status.ok(), "SentencePiece could not encode a text: ", one_line(status.ToString()));
  }
  if (special == SpecialTokens::kInclude) {
    if (template_.add_bos && bos_) ids.insert(ids.begin(), *bos_);
    if (template_.add_eos && eos_) ids.push_back(*eos_);
  }
  return std::vector<TokenId>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<TokenId>& ids, SpecialTokens) const {
  std::vector<int> known;
  for (TokenId id : ids)
    if (id >= 0 && id < vocab_size()) known.push_back(id);
  std::string text;
  const auto status = sp_->sp.Decode(known, &text);
  TANDEM_CHECK(status.ok(), "SentencePiece could not decode: ", one_line(status.ToString()));
  return text;
}

std::string SentencePieceTokenizer::token_bytes(TokenId id, TokenPlace place) const {
  if (id < 0 || id >= vocab_size() || sp_->sp.IsControl(id)) return "";
  if (sp_->sp.IsUnknown(id)) return kUnknownSurface;
  const std::string& piece = sp_->sp.IdToPiece(id);
  if (sp_->sp.IsByte(id))  // "<0xAB>"
    return std::string(1, static_cast<char>(std::strtol(piece.substr(3, 2).c_str(), nullptr, 16)));
  const bool drop_space = place == TokenPlace::kFirst && drops_first_space_ && piece.rfind(kSpaceSymbol, 0) == 0;
  return replace_space_symbol(drop_space ? piece.substr(3) : piece);
}

int64_t SentencePieceTokenizer::vocab_size() const { return sp_->sp.GetPieceSize(); }

std::optional<TokenId> SentencePieceTokenizer::token_to_id(std::string_view token) const {
  const int id = sp_->sp.PieceToId(token);
  if (id < 0 || sp_->sp.IdToPiece(id) != token) return std::nullopt;
  return id;
}

std::string SentencePieceTokenizer::id_to_token(TokenId id) const {
  return id >= 0 && id < vocab_size() ? sp_->sp.IdToPiece(id) : std::string();
}

std::vector<SpecialToken> SentencePieceTokenizer::special_tokens() const {
  std::vector<SpecialToken> out;
  for (int id = 0; id < sp_->sp.GetPieceSize(); ++id)
    if (sp_->sp.IsControl(id)) out.push_back({id, sp_->sp.IdToPiece(id)});
  return out;
}

std::string SentencePieceTokenizer::description() const {
  auto name = [&](const std::optional<TokenId>& id) {
    return id ? "'" + id_to_token(*id) + "' (" + std::to_string(*id) + ")" : std::string("none");
  };
  return strprintf("SentencePiece from %s: %lld tokens, BOS %s, EOS %s", path_.c_str(),
                   static_cast<long long>(vocab_size()), name(bos_).c_str(), name(eos_).c_str());
}

#else  // Built without libsentencepiece-dev: every model is refused with the fix.

struct SentencePieceTokenizer::Processor {};

bool SentencePieceTokenizer::available() { return false; }

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<Processor> processor, std::string path,
                                               const SentencePieceTemplate& tmpl)
    : sp_(std::move(processor)), path_(std::move(path)), template_(tmpl) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::from_file(const std::string& path,
                                                                          const SpecialTokenNames&,
                                                                          const SentencePieceTemplate&) {
  TANDEM_FAIL("'", path, "' is a SentencePiece model, but this tandem was built without SentencePiece; install ",
              "libsentencepiece-dev (scripts/setup.sh does) and rebuild");
}

void SentencePieceTokenizer::choose_bos_eos(const SpecialTokenNames&) {}
std::vector<TokenId> SentencePieceTokenizer::encode(std::string_view, SpecialTokens) const { return {}; }
std::string SentencePieceTokenizer::decode(const std::vector<TokenId>&, SpecialTokens) const { return ""; }
std::string SentencePieceTokenizer::token_bytes(TokenId, TokenPlace) const { return ""; }
int64_t SentencePieceTokenizer::vocab_size() const { return 0; }
std::optional<TokenId> SentencePieceTokenizer::token_to_id(std::string_view) const { return std::nullopt; }
std::string SentencePieceTokenizer::id_to_token(TokenId) const { return ""; }
std::vector<SpecialToken> SentencePieceTokenizer::special_tokens() const { return {}; }
std::string SentencePieceTokenizer::description() const { return "SentencePiece (unavailable)"; }

#endif

}  // namespace tandem
