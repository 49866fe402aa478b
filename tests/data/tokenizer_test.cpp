// The tokenizers (byte, byte-level BPE from a hand-written tokenizer.json, SentencePiece errors),
// finding them in folders, and tokenize_corpus's files as TokenBuffer reads them back.

#include "tandem/data/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "tandem/data/bpe_tokenizer.h"
#include "tandem/data/byte_tokenizer.h"
#include "tandem/data/token_file.h"
#include "tandem/data/tokenize_corpus.h"
#include "tandem/data/tokenizer_files.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using test::error_of;
using Ids = std::vector<TokenId>;

const std::string kG = "\xC4\xA0";  // 'Ġ': the byte-level character of a space
const std::string kC = "\xC4\x8A";  // 'Ċ': of a line break

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// A GPT-2-style tokenizer.json: ByteLevel pre-tokenizer with its regex, merges by rank.
json gpt2_style_json() {
  json vocab = {{"a", 0},
                {"b", 1},
                {"c", 2},
                {kG, 3},
                {kC, 4},
                {"d", 5},
                {"ab", 6},
                {"abc", 7},
                {kG + "a", 8},
                {kG + "ab", 9},
                {"<|endoftext|>", 10},
                {"<|sep|>", 11},
                {"aa", 12},
                {"'", 13},
                {"s", 14},
                {kC + kC, 16}};
  json merges = json::array({"a b", json::array({"ab", "c"}), kG + " a", "a a", kC + " " + kC});  // both forms
  json added = json::array();
  added.push_back({{"id", 10}, {"content", "<|endoftext|>"}, {"special", true}, {"normalized", false}});
  added.push_back({{"id", 11}, {"content", "<|sep|>"}, {"special", true}, {"normalized", false}});
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", false}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"byte_fallback", false}}}};
}

// Llama 3's layout: a Split regex, ByteLevel without its own, ignore_merges, a BOS template.
json llama3_style_json() {
  json j = gpt2_style_json();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array(
           {{{"type", "Split"},
             {"pattern",
              {{"Regex",
                R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  j["model"]["ignore_merges"] = true;
  j["added_tokens"].push_back({{"id", 15}, {"content", "<|begin_of_text|>"}, {"special", true}, {"normalized", false}});
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"special_tokens",
       {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {15}}, {"tokens", {"<|begin_of_text|>"}}}}}}};
  return j;
}

std::unique_ptr<BpeTokenizer> bpe(const json& j) { return BpeTokenizer::from_json(j.dump(), "fixture.json"); }

TEST(ByteTokenizer, RoundTripsEveryByte) {
  ByteTokenizer t;
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const Ids ids = t.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(t.decode(t.encode("héllo 🙂\n")), "héllo 🙂\n");
  EXPECT_EQ(t.decode({0x66, 0xFF, 0x6F}), "f\xEF\xBF\xBDo");  // a stray byte becomes U+FFFD
  std::string streamed;
  for (TokenId id : t.encode("añb")) streamed += t.token_bytes(id);
  EXPECT_EQ(streamed, "añb");
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_FALSE(t.eos_id().has_value());
  EXPECT_EQ(byte_tokenize("xy"), (std::vector<uint16_t>{'x', 'y'}));  // the same ids as text files get
}

TEST(Utf8, CompleteLengthAndLossy) {
  EXPECT_EQ(utf8_complete_length("ab"), 2u);
  EXPECT_EQ(utf8_complete_length("a\xE4\xBD"), 1u);  // 你 cut after two of its three bytes
  EXPECT_EQ(utf8_complete_length("a\xE4\xBD\xA0"), 4u);
  EXPECT_EQ(utf8_complete_length("\xF0\x9F\x99"), 0u);
  EXPECT_EQ(utf8_complete_length("a\xE4Z"), 3u);  // malformed: shown (as U+FFFD) rather than held
  EXPECT_EQ(utf8_lossy("a\xE4\xBD"
                       "b"),
            "a\xEF\xBF\xBD"
            "b");                                                 // one U+FFFD for the maximal part
  EXPECT_EQ(utf8_lossy("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: each byte
  EXPECT_EQ(utf8_lossy("ok ✓"), "ok ✓");
}

TEST(BpeTokenizer, MergesByRankLeftmostFirst) {
  const auto t = bpe(gpt2_style_json());
  // "abc" -> ab (rank 0) -> abc (rank 1); " ab": (a,b) outranks (Ġ,a), and Ġ+ab is no merge.
  EXPECT_EQ(t->encode("abc ab\nd"), (Ids{7, 3, 6, 4, 5}));
  EXPECT_EQ(t->encode(" a"), (Ids{8}));
  EXPECT_EQ(t->encode("aaa"), (Ids{12, 0}));  // the leftmost (a,a) first
  EXPECT_EQ(t->encode("aab"), (Ids{0, 6}));   // (a,b) outranks (a,a)
  EXPECT_EQ(t->encode("ba"), (Ids{1, 0}));
  EXPECT_EQ(t->encode("a's"), (Ids{0, 13, 14}));  // the contraction is one piece, with no merge
  EXPECT_EQ(t->encode("ab\xFF\xC3"
                      "ab"),
            (Ids{6, 6}));  // malformed UTF-8: its bytes have no tokens here
  EXPECT_EQ(t->decode(t->encode("abc ab\nd")), "abc ab\nd");
  EXPECT_EQ(t->vocab_size(), 17);
  EXPECT_EQ(t->id_to_token(9), kG + "ab");
  EXPECT_EQ(t->token_to_id(kG + "a"), 8);
  EXPECT_EQ(t->eos_id(), 10);
  EXPECT_FALSE(t->bos_id().has_value());
}

TEST(BpeTokenizer, IgnoreMergesTakesWholeWordsAndTemplateAddsBos) {
  const auto gpt2 = bpe(gpt2_style_json());
  const auto llama = bpe(llama3_style_json());
  EXPECT_EQ(gpt2->encode(" ab"), (Ids{3, 6}));
  EXPECT_EQ(llama->encode(" ab"), (Ids{9}));  // "Ġab" is in the vocabulary: one token
  EXPECT_EQ(llama->encode(" ab", SpecialTokens::kInclude), (Ids{15, 9}));
  EXPECT_EQ(llama->bos_id(), 15);
  EXPECT_EQ(llama->encode("A's"), (Ids{13, 14}));  // "A" has no byte token: dropped, as `tokenizers` drops it
  EXPECT_EQ(llama->encode("d\n\nab"), (Ids{5, 16, 6}));
}

TEST(BpeTokenizer, SpecialTokensAreSplitOutBeforePreTokenizing) {
  const auto t = bpe(gpt2_style_json());
  EXPECT_EQ(t->encode("ab<|endoftext|>ba"), (Ids{6, 10, 1, 0}));
  EXPECT_EQ(t->encode("<|sep|><|endoftext|>"), (Ids{11, 10}));
  EXPECT_EQ(t->encode("a<|sep"), (Ids{0, 14}));  // not a token; '<', '|', 'e', 'p' have no byte tokens here
  EXPECT_EQ(t->decode({6, 10, 1}), "ab<|endoftext|>b");
  EXPECT_EQ(t->decode({6, 10, 1}, SpecialTokens::kOmit), "abb");
  const auto specials = t->special_tokens();
  ASSERT_EQ(specials.size(), 2u);
  EXPECT_EQ(specials[0].text, "<|endoftext|>");
}

TEST(BpeTokenizer, AddedTokenOptions) {
  json j = gpt2_style_json();
  j["added_tokens"].push_back(
      {{"id", 20}, {"content", "<m>"}, {"lstrip", true}, {"rstrip", true}, {"normalized", false}});
  j["added_tokens"].push_back({{"id", 21}, {"content", "dd"}, {"single_word", true}, {"normalized", false}});
  const auto t = bpe(j);
  EXPECT_EQ(t->encode("a  <m> b"), (Ids{0, 20, 1}));  // the spaces on both sides go with <m>
  EXPECT_EQ(t->encode("dd a"), (Ids{21, 8}));
  EXPECT_EQ(t->encode("add"), (Ids{0, 5, 5}));  // inside a word: not the single-word token
}

TEST(BpeTokenizer, NormalizerAndSplitBehaviours) {
  json j = gpt2_style_json();
  j["normalizer"] = {{"type", "NFC"}};
  j["model"]["vocab"]["\xC3\x83"] = 30;                   // 'Ã': byte 0xC3 (é is C3 A9 in UTF-8)
  j["model"]["vocab"]["\xC2\xA9"] = 31;                   // '©': byte 0xA9
  EXPECT_EQ(bpe(j)->encode("e\xCC\x81"), (Ids{30, 31}));  // e + combining acute -> é (NFC) -> its two bytes
  json removed = gpt2_style_json();
  removed["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Removed"}, {"invert", false}},
                    {{"type", "ByteLevel"}, {"use_regex", false}}})}};
  EXPECT_EQ(bpe(removed)->encode("ab  abc"), (Ids{6, 7}));  // the spaces are dropped
}

TEST(BpeTokenizer, PiecesEncodeAsTheWhole) {
  // Note [Document pieces]: cutting where the tokenizer allows changes no id.
  const std::string text = "abc ab.\nd ab\n\nba.\nabc\nd aaa\n";
  for (const json& j : {gpt2_style_json(), llama3_style_json()}) {
    const auto t = bpe(j);
    std::vector<size_t> cuts;
    for (size_t c = t->piece_boundary(text, text.size() - 1); c > 0; c = t->piece_boundary(text, c - 1))
      cuts.push_back(c);
    EXPECT_EQ(cuts, (std::vector<size_t>{22, 18, 8}));  // before "d aaa", "abc", "d ab"; not after "\n\n"
    for (size_t cut : cuts) {
      Ids parts = t->encode(text.substr(0, cut));
      const Ids rest = t->encode(text.substr(cut));
      parts.insert(parts.end(), rest.begin(), rest.end());
      EXPECT_EQ(parts, t->encode(text)) << "cut at " << cut;
    }
  }
  // Why not after two whitespace characters: GPT-2's \s+(?!\S) reads the end of a text differently.
  const auto gpt2 = bpe(gpt2_style_json());
  EXPECT_EQ(gpt2->encode("ab\n\nba"), (Ids{6, 4, 4, 1, 0}));
  EXPECT_EQ(gpt2->encode("ab\n\n"), (Ids{6, 16}));
  json prefixed = gpt2_style_json();
  prefixed["pre_tokenizer"]["add_prefix_space"] = true;  // each piece would gain a space
  EXPECT_EQ(bpe(prefixed)->piece_boundary(text, text.size() - 1), 0u);
}

TEST(BpeTokenizer, BadFilesAreUserErrors) {
  test::TempDir dir;
  EXPECT_NE(error_of([&] { BpeTokenizer::from_file(dir.file("none.json")); }).find("none.json"), std::string::npos);
  EXPECT_NE(
      error_of([] { BpeTokenizer::from_json("{\"model\": ", "broken.json"); }).find("broken.json is not valid JSON"),
      std::string::npos);
  json wordpiece = gpt2_style_json();
  wordpiece["model"]["type"] = "WordPiece";
  EXPECT_NE(error_of([&] { bpe(wordpiece); }).find("model 'WordPiece' is not read"), std::string::npos);
  json fallback = gpt2_style_json();
  fallback["model"]["byte_fallback"] = true;
  EXPECT_NE(error_of([&] { bpe(fallback); }).find("tokenizer.model"), std::string::npos);
  json bad_merge = gpt2_style_json();
  bad_merge["model"]["merges"].push_back("b zz");
  EXPECT_NE(error_of([&] { bpe(bad_merge); }).find("names a token the vocabulary lacks"), std::string::npos);
  json no_model = gpt2_style_json();
  no_model.erase("model");
  EXPECT_NE(error_of([&] { bpe(no_model); }).find("has no \"model\""), std::string::npos);
  json regex = llama3_style_json();
  regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_NE(error_of([&] { bpe(regex); }).find("does not compile"), std::string::npos);
  json metaspace = gpt2_style_json();
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_NE(error_of([&] { bpe(metaspace); }).find("does not end with ByteLevel"), std::string::npos);
}

TEST(TokenizerFiles, FindsTokenizersInFoldersAndNamesTheFix) {
  test::TempDir dir;
  write_text(dir.file("tokenizer.json"), gpt2_style_json().dump());
  write_text(dir.file("tokenizer_config.json"),
             R"({"eos_token": {"content": "<|sep|>"}, "bos_token": "<|endoftext|>", "chat_template": "{{ x }}"})");
  const TokenizerSource s = find_tokenizer(dir.path());
  EXPECT_EQ(s.file, dir.file("tokenizer.json"));
  EXPECT_EQ(s.config.chat_template, "{{ x }}");
  const auto t = open_tokenizer(s);
  EXPECT_EQ(t->kind(), TokenizerKind::kByteLevelBpe);
  EXPECT_EQ(t->eos_id(), 11);  // the config's names win
  EXPECT_EQ(t->bos_id(), 10);
  EXPECT_EQ(open_tokenizer(s, {std::nullopt, std::string("<|endoftext|>")})->eos_id(), 10);  // --eos wins
  EXPECT_EQ(open_tokenizer("byte")->kind(), TokenizerKind::kByte);

  test::TempDir empty;
  EXPECT_NE(error_of([&] { open_tokenizer(empty.path()); }).find("neither tokenizer.json nor tokenizer.model"),
            std::string::npos);
  write_text(empty.file("config.json"), R"({"vocab_size": 256})");  // a tandem byte model's checkpoint
  EXPECT_EQ(open_tokenizer(empty.path())->kind(), TokenizerKind::kByte);
  EXPECT_NE(error_of([&] { open_tokenizer(dir.file("missing")); }).find("does not exist"), std::string::npos);
  write_text(dir.file("junk.model"), "not a protobuf");
  EXPECT_NE(error_of([&] { open_tokenizer(dir.file("junk.model")); }).find("junk.model"), std::string::npos);
  write_text(dir.file("tokenizer_config.json"), R"({"eos_token": "<|nope|>"})");
  EXPECT_NE(error_of([&] { open_tokenizer(dir.path()); }).find("<|nope|>"), std::string::npos);
}

// The tokens of a token file, read back as `tandem train` reads it.
std::vector<int64_t> read_tokens(const std::string& path) {
  const TokenBuffer b = TokenBuffer::open(path);
  std::vector<int64_t> out(static_cast<size_t>(b.size()));
  b.read(0, b.size(), out.data());
  return out;
}

void append(std::vector<int64_t>& out, const Ids& ids) { out.insert(out.end(), ids.begin(), ids.end()); }

TEST(TokenizeCorpus, TextJsonlAndFoldersWithEosAndHeldOutDocuments) {
  test::TempDir dir;
  const auto t = bpe(gpt2_style_json());
  write_text(dir.file("a.txt"), "abc ab\n");
  write_text(dir.file("b.jsonl"), "{\"text\": \"ba\"}\n\n{\"text\": \"\", \"id\": 2}\n{\"text\": \"d d\"}\n");
  std::filesystem::create_directories(dir.file("folder/sub"));
  write_text(dir.file("folder/sub/c.md"), "aaa");
  write_text(dir.file("folder/skip.bin"), "not text");
  write_text(dir.file("folder/.hidden.txt"), "hidden");
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("a.txt"), dir.file("b.jsonl"), dir.file("folder")};
  o.out = dir.file("out/train.bin");
  o.val_fraction = 0.5;  // documents 1 and 3 (of 0..3) are held out
  o.threads = 2;
  const TokenizeSummary s = tokenize_corpus(*t, o);
  EXPECT_EQ(s.documents, 4);
  EXPECT_EQ(s.empty_documents, 1);
  EXPECT_EQ(s.held_out, HeldOut::kDocuments);
  EXPECT_EQ(s.val_path, dir.file("out/train_val.bin"));
  std::vector<int64_t> train, val;
  append(train, t->encode("abc ab\n")), train.push_back(10);
  append(val, t->encode("ba")), val.push_back(10);
  append(train, t->encode("d d")), train.push_back(10);
  append(val, t->encode("aaa")), val.push_back(10);
  EXPECT_EQ(read_tokens(s.train_path), train);
  EXPECT_EQ(read_tokens(s.val_path), val);
  EXPECT_EQ(TokenBuffer::open(s.train_path).bytes_per_token(), 2);
  EXPECT_EQ(s.train_tokens + s.val_tokens, static_cast<int64_t>(train.size() + val.size()));
}

TEST(TokenizeCorpus, VocabulariesOver65536WriteUint32) {
  test::TempDir dir;
  json j = gpt2_style_json();
  j["added_tokens"].push_back({{"id", 70000}, {"content", "<|big|>"}, {"special", true}, {"normalized", false}});
  const auto t = bpe(j);
  write_text(dir.file("a.txt"), "ab<|big|>c");
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("a.txt")};
  o.out = dir.file("train.bin");
  o.val_fraction = 0;
  const TokenizeSummary s = tokenize_corpus(*t, o);
  EXPECT_EQ(s.bytes_per_token, 4);
  EXPECT_EQ(s.held_out, HeldOut::kNone);
  EXPECT_EQ(s.val_path, "");
  EXPECT_EQ(TokenBuffer::open(s.train_path).bytes_per_token(), 4);
  EXPECT_EQ(read_tokens(s.train_path), (std::vector<int64_t>{6, 70000, 2, 10}));
}

TEST(TokenizeCorpus, LongDocumentsInPiecesAndTheTailHeldOut) {
  test::TempDir dir;
  const auto t = bpe(llama3_style_json());
  std::string text;
  for (int i = 0; i < 300; ++i) text += i % 3 ? "abc ab.\nd" : "aaa ba\n\nabc,\n";
  write_text(dir.file("long.txt"), text);
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("long.txt")};
  o.out = dir.file("train.bin");
  o.task_bytes = 64;  // many pieces, encoded on two threads
  o.threads = 2;
  o.val_fraction = 0.1;
  const TokenizeSummary s = tokenize_corpus(*t, o);
  EXPECT_EQ(s.held_out, HeldOut::kTail);  // one document: the last tenth of its tokens
  std::vector<int64_t> whole;
  append(whole, t->encode(text)), whole.push_back(10);
  std::vector<int64_t> got = read_tokens(s.train_path);
  const auto val = read_tokens(s.val_path);
  EXPECT_EQ(static_cast<int64_t>(val.size()), std::llround(double(whole.size()) * 0.1));
  got.insert(got.end(), val.begin(), val.end());
  EXPECT_EQ(got, whole);
}

TEST(TokenizeCorpus, BadInputNamesFileLineAndFix) {
  test::TempDir dir;
  const auto t = bpe(gpt2_style_json());
  TokenizeCorpusOptions o;
  o.out = dir.file("train.bin");
  o.inputs = {dir.file("missing.txt")};
  EXPECT_NE(error_of([&] { tokenize_corpus(*t, o); }).find("input '" + dir.file("missing.txt") + "' does not exist"),
            std::string::npos);
  write_text(dir.file("bad.jsonl"), "{\"text\": \"ab\"}\n{\"text\": \"ab\",\n");
  o.inputs = {dir.file("bad.jsonl")};
  const std::string broken = error_of([&] { tokenize_corpus(*t, o); });
  EXPECT_NE(broken.find("bad.jsonl:2 is not valid JSON"), std::string::npos) << broken;
  write_text(dir.file("field.jsonl"), "{\"content\": \"ab\"}\n");
  o.inputs = {dir.file("field.jsonl")};
  const std::string field = error_of([&] { tokenize_corpus(*t, o); });
  EXPECT_NE(field.find("field.jsonl:1 has no field \"text\" (its fields: content); name the text's field with --field"),
            std::string::npos)
      << field;
  EXPECT_FALSE(std::filesystem::exists(o.out));                                      // nothing half-written
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 2);  // no temporary files either
  o.inputs = {dir.file("field.jsonl")};
  o.field = "content";
  o.val_fraction = 1.5;
  EXPECT_NE(error_of([&] { tokenize_corpus(*t, o); }).find("--val-fraction 1.5"), std::string::npos);
  EXPECT_EQ(held_out_path("data/train.bin"), "data/train_val.bin");
}

// Binary files are refused before anything is written; a text with a few latin-1 bytes is read and
// its malformed bytes counted.
TEST(TokenizeCorpus, BinaryInputIsRefusedAndStrayBytesAreCounted) {
  test::TempDir dir;
  const auto t = bpe(gpt2_style_json());
  TokenizeCorpusOptions o;
  o.out = dir.file("train.bin");
  o.val_fraction = 0;
  std::string binary;
  for (int i = 0; i < 4096; ++i) binary.push_back(static_cast<char>((i * 37) & 0xFF));
  write_text(dir.file("image.txt"), binary);
  o.inputs = {dir.file("image.txt")};
  const std::string refused = error_of([&] { tokenize_corpus(*t, o); });
  EXPECT_NE(refused.find("'" + dir.file("image.txt") + "' does not look like text"), std::string::npos) << refused;
  EXPECT_FALSE(std::filesystem::exists(o.out));
  std::string nul_only = "ab ab ab";
  nul_only.push_back('\0');
  write_text(dir.file("nul.txt"), nul_only);
  o.inputs = {dir.file("nul.txt")};
  EXPECT_NE(error_of([&] { tokenize_corpus(*t, o); }).find("1 NUL"), std::string::npos);
  std::string latin1;
  for (int i = 0; i < 200; ++i) latin1 += "abc ab ba d d ";
  latin1 += "caf\xe9 d\xe9j\xe0";  // three latin-1 bytes, each malformed as UTF-8
  latin1 += " h\xc3\xa9";          // and one well-formed character
  write_text(dir.file("latin1.txt"), latin1);
  o.inputs = {dir.file("latin1.txt")};
  const TokenizeSummary s = tokenize_corpus(*t, o);
  EXPECT_EQ(s.malformed_utf8_bytes, 3);
  EXPECT_GT(s.train_tokens, 0);
}

}  // namespace
}  // namespace tandem
