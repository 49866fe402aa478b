// tokenize_corpus (data/tokenize_corpus.h) with a byte tokenizer whose ids spell the input: which
// documents are held out (Note [Held-out documents]), the llm.c files written byte by byte, the
// same result for any thread count and task size, and the errors that leave nothing behind.

#include "tandem/data/tokenize_corpus.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "../test_util.h"
#include "tandem/data/byte_tokenizer.h"
#include "tandem/data/token_file.h"

namespace tandem {
namespace {

using test::error_of;
namespace fs = std::filesystem;
using Ids = std::vector<TokenId>;

// Bytes as ids, with an EOS after them: each id in a token file says which byte or document end
// it came from. Any position is a piece boundary, as for the byte tokenizer.
class BytesWithEos final : public Tokenizer {
 public:
  explicit BytesWithEos(TokenId eos = 256, int64_t vocab = 257) : eos_(eos), vocab_(vocab) {}
  TokenizerKind kind() const override { return TokenizerKind::kByte; }
  std::vector<TokenId> encode(std::string_view text, SpecialTokens) const override { return bytes_.encode(text); }
  std::string decode(const std::vector<TokenId>& ids, SpecialTokens) const override { return bytes_.decode(ids); }
  std::string token_bytes(TokenId id, TokenPlace) const override { return bytes_.token_bytes(id); }
  int64_t vocab_size() const override { return vocab_; }
  std::optional<TokenId> bos_id() const override { return std::nullopt; }
  std::optional<TokenId> eos_id() const override { return eos_; }
  std::optional<TokenId> token_to_id(std::string_view t) const override { return bytes_.token_to_id(t); }
  std::string id_to_token(TokenId id) const override { return bytes_.id_to_token(id); }
  std::vector<SpecialToken> special_tokens() const override { return {{eos_, "<eos>"}}; }
  size_t piece_boundary(std::string_view text, size_t limit) const override { return std::min(limit, text.size()); }
  std::string description() const override { return "bytes and an EOS"; }

 private:
  ByteTokenizer bytes_;
  TokenId eos_;
  int64_t vocab_;
};

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// The ids of `docs`, each followed by `eos`.
Ids ids_of(const std::vector<std::string>& docs, TokenId eos = 256) {
  Ids out;
  for (const auto& d : docs) {
    for (unsigned char c : d) out.push_back(c);
    out.push_back(eos);
  }
  return out;
}

// An llm.c token file read byte by byte, without tandem's reader.
struct LlmcFile {
  int32_t magic = 0, version = 0, count = 0;
  Ids ids;
};

LlmcFile read_llmc(const std::string& path) {
  const std::string bytes = test::read_text(path);
  LlmcFile f;
  if (bytes.size() < static_cast<size_t>(kLlmcHeaderBytes)) return f;
  std::memcpy(&f.magic, bytes.data(), 4);
  std::memcpy(&f.version, bytes.data() + 4, 4);
  std::memcpy(&f.count, bytes.data() + 8, 4);
  const size_t width = f.magic == kLlmcMagicU32 ? 4 : 2;
  for (size_t at = kLlmcHeaderBytes; at + width <= bytes.size(); at += width) {
    uint32_t v = 0;
    std::memcpy(&v, bytes.data() + at, width);  // little-endian
    f.ids.push_back(static_cast<TokenId>(v));
  }
  return f;
}

std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string jsonl(const std::vector<std::string>& texts) {
  std::string out;
  for (const auto& t : texts) out += "{\"text\": \"" + t + "\"}\n";
  return out;
}

TEST(TokenizeCorpus, HeldOutPathAddsValBeforeTheExtension) {
  EXPECT_EQ(held_out_path("data/train.bin"), "data/train_val.bin");
  EXPECT_EQ(held_out_path("train"), "train_val");
  EXPECT_EQ(held_out_path("/x/corpus.v2.bin"), "/x/corpus.v2_val.bin");
}

// Note [Held-out documents]: document g over all inputs is held out when floor((g+1)f) > floor(g f);
// with f = 1/4 those are g = 3 and 7, here the text file and the fourth line of c.jsonl.
TEST(TokenizeCorpus, EveryNthDocumentOverAllInputsIsHeldOut) {
  test::TempDir dir;
  write_text(dir.file("a.jsonl"), jsonl({"d0", "d1", "d2"}));
  write_text(dir.file("b.txt"), "text file\n");
  write_text(dir.file("c.jsonl"), jsonl({"d4", "d5", "d6", "d7", "d8", "d9"}));
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("a.jsonl"), dir.file("b.txt"), dir.file("c.jsonl")};
  o.out = dir.file("train.bin");
  o.val_fraction = 0.25;
  o.threads = 2;
  const BytesWithEos t;
  const TokenizeSummary s = tokenize_corpus(t, o);
  const Ids train = ids_of({"d0", "d1", "d2", "d4", "d5", "d6", "d8", "d9"});
  const Ids val = ids_of({"text file\n", "d7"});
  EXPECT_EQ(read_llmc(s.train_path).ids, train);
  EXPECT_EQ(read_llmc(s.val_path).ids, val);
  EXPECT_EQ(s.held_out, HeldOut::kDocuments);
  EXPECT_EQ(s.val_path, dir.file("train_val.bin"));
  EXPECT_EQ(s.files, 3);
  EXPECT_EQ(s.documents, 10);
  EXPECT_EQ(s.train_documents, 8);
  EXPECT_EQ(s.val_documents, 2);
  EXPECT_EQ(s.train_tokens, static_cast<int64_t>(train.size()));
  EXPECT_EQ(s.val_tokens, static_cast<int64_t>(val.size()));
  EXPECT_EQ(s.tokens(), s.train_tokens + s.val_tokens);
  EXPECT_EQ(s.eos, 256);
  EXPECT_EQ(s.threads, 2);
  EXPECT_EQ(s.input_bytes, static_cast<int64_t>(fs::file_size(dir.file("a.jsonl")) + fs::file_size(dir.file("b.txt")) +
                                                fs::file_size(dir.file("c.jsonl"))));
  EXPECT_EQ(names_in(dir.path()),
            (std::vector<std::string>{"a.jsonl", "b.txt", "c.jsonl", "train.bin", "train_val.bin"}))
      << "no temporary files left";
}

TEST(TokenizeCorpus, TheFilesAreLlmcTokenFilesOfTwoOrFourBytes) {
  test::TempDir dir;
  write_text(dir.file("a.jsonl"), jsonl({"hi", "yo"}));
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("a.jsonl")};
  o.out = dir.file("small.bin");
  o.val_fraction = 0;
  const TokenizeSummary small = tokenize_corpus(BytesWithEos(), o);
  EXPECT_EQ(small.bytes_per_token, 2);
  const LlmcFile u16 = read_llmc(small.train_path);
  EXPECT_EQ(u16.magic, kLlmcMagicU16);
  EXPECT_EQ(u16.version, kLlmcVersionU16);
  EXPECT_EQ(u16.count, 6);
  EXPECT_EQ(fs::file_size(small.train_path), static_cast<uintmax_t>(kLlmcHeaderBytes + 6 * 2));
  EXPECT_EQ(u16.ids, (Ids{'h', 'i', 256, 'y', 'o', 256}));
  EXPECT_EQ(TokenBuffer::open(small.train_path).size(), 6) << "tandem train reads it";

  o.out = dir.file("large.bin");
  const TokenizeSummary large = tokenize_corpus(BytesWithEos(70000, 70001), o);
  EXPECT_EQ(large.bytes_per_token, 4);
  const LlmcFile u32 = read_llmc(large.train_path);
  EXPECT_EQ(u32.magic, kLlmcMagicU32);
  EXPECT_EQ(u32.version, kLlmcVersionU32);
  EXPECT_EQ(u32.count, 6);
  EXPECT_EQ(fs::file_size(large.train_path), static_cast<uintmax_t>(kLlmcHeaderBytes + 6 * 4));
  EXPECT_EQ(u32.ids, (Ids{'h', 'i', 70000, 'y', 'o', 70000}));
  // 65536 ids still fit two bytes.
  o.out = dir.file("edge.bin");
  EXPECT_EQ(tokenize_corpus(BytesWithEos(65535, 65536), o).bytes_per_token, 2);
}

TEST(TokenizeCorpus, TheResultDoesNotDependOnThreadsOrTaskSize) {
  test::TempDir dir;
  std::string text;
  for (int i = 0; i < 60; ++i) text += "line " + std::to_string(i) + " of the text file\n";
  write_text(dir.file("a.txt"), text);
  write_text(dir.file("b.jsonl"), jsonl({"first", "second record", "", "x", "fifth"}) + "\n  \n" + jsonl({"last"}));
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("a.txt"), dir.file("b.jsonl")};
  o.val_fraction = 0.5;
  const BytesWithEos t;
  std::string train0, val0;
  const std::pair<int, size_t> runs[] = {{1, size_t{1} << 20}, {2, 1}, {2, 5}, {1, 7}, {2, 64}};
  for (const auto& [threads, task_bytes] : runs) {
    o.threads = threads;
    o.task_bytes = task_bytes;
    o.out = dir.file("out_" + std::to_string(threads) + "_" + std::to_string(task_bytes) + ".bin");
    const TokenizeSummary s = tokenize_corpus(t, o);
    const std::string train = test::read_text(s.train_path), val = test::read_text(s.val_path);
    EXPECT_EQ(s.documents, 6) << "the text file and five non-empty records";
    EXPECT_EQ(s.empty_documents, 1);
    if (train0.empty()) {
      train0 = train, val0 = val;
      EXPECT_EQ(read_llmc(s.train_path).ids, ids_of({text, "second record", "fifth"}));
      EXPECT_EQ(read_llmc(s.val_path).ids, ids_of({"first", "x", "last"}));
    } else {
      EXPECT_EQ(train, train0) << threads << " threads, tasks of " << task_bytes << " bytes";
      EXPECT_EQ(val, val0) << threads << " threads, tasks of " << task_bytes << " bytes";
    }
  }
}

TEST(TokenizeCorpus, AShortCorpusHoldsOutItsTailWithinBounds) {
  test::TempDir dir;
  write_text(dir.file("ab.txt"), "ab");
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("ab.txt")};
  o.out = dir.file("train.bin");
  o.val_fraction = 0.01;  // 0.03 tokens round to none: at least one is held out
  TokenizeSummary s = tokenize_corpus(BytesWithEos(), o);
  EXPECT_EQ(s.held_out, HeldOut::kTail);
  EXPECT_EQ(read_llmc(s.train_path).ids, (Ids{'a', 'b'}));
  EXPECT_EQ(read_llmc(s.val_path).ids, (Ids{256}));
  EXPECT_EQ(s.train_documents, 1);
  EXPECT_EQ(s.val_documents, 0);
  o.val_fraction = 0.9;  // 2.7 tokens round to 3: at least one stays for training
  s = tokenize_corpus(BytesWithEos(), o);
  EXPECT_EQ(read_llmc(s.train_path).ids, (Ids{'a'}));
  EXPECT_EQ(read_llmc(s.val_path).ids, (Ids{'b', 256}));
  EXPECT_EQ(s.train_tokens, 1);
  EXPECT_EQ(s.val_tokens, 2);
}

TEST(TokenizeCorpus, OneTokenIsNotSplitAndLeavesNoHeldOutFile) {
  test::TempDir dir;
  write_text(dir.file("a.txt"), "a");
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("a.txt")};
  o.out = dir.file("train.bin");
  o.val_fraction = 0.5;
  const TokenizeSummary s = tokenize_corpus(ByteTokenizer(), o);  // no EOS: one token in all
  EXPECT_EQ(s.held_out, HeldOut::kNone);
  EXPECT_EQ(s.val_path, "");
  EXPECT_FALSE(s.eos.has_value());
  EXPECT_EQ(read_llmc(s.train_path).ids, (Ids{'a'}));
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"a.txt", "train.bin"}));
}

TEST(TokenizeCorpus, WithoutAnEosDocumentsFollowEachOther) {
  test::TempDir dir;
  write_text(dir.file("a.jsonl"), jsonl({"ab", "cd"}));
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("a.jsonl")};
  o.out = dir.file("train.bin");
  o.val_fraction = 0;
  const TokenizeSummary s = tokenize_corpus(ByteTokenizer(), o);
  EXPECT_EQ(s.documents, 2);
  EXPECT_EQ(read_llmc(s.train_path).ids, (Ids{'a', 'b', 'c', 'd'}));
}

TEST(TokenizeCorpus, JsonLinesMayUseCrlfBlankLinesAndOtherFieldsAndExtensionsInAnyCase) {
  test::TempDir dir;
  write_text(dir.file("docs.JSONL"),
             "{\"body\": \"one\", \"n\": 1}\r\n \t\r\n\n{\"body\": \"two\"}");  // no last newline
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("docs.JSONL")};
  o.out = dir.file("train.bin");
  o.field = "body";
  o.val_fraction = 0;
  const TokenizeSummary s = tokenize_corpus(BytesWithEos(), o);
  EXPECT_EQ(read_llmc(s.train_path).ids, ids_of({"one", "two"})) << "read as JSON Lines, not as text";
  EXPECT_EQ(s.documents, 2);
  EXPECT_EQ(s.empty_documents, 0);
}

TEST(TokenizeCorpus, JsonLineErrorsNameTheLineAcrossTasks) {
  test::TempDir dir;
  TokenizeCorpusOptions o;
  o.out = dir.file("train.bin");
  o.task_bytes = 8;  // every line in a task of its own
  const BytesWithEos t;
  const auto error_at = [&](const std::string& bad_line) {
    write_text(dir.file("c.jsonl"), jsonl({"l1", "l2", "l3", "l4", "l5", "l6", "l7", "l8", "l9"}) + bad_line + "\n");
    o.inputs = {dir.file("c.jsonl")};
    return error_of([&] { tokenize_corpus(t, o); });
  };
  const std::string where = dir.file("c.jsonl") + ":10";
  const std::string array = error_at("[1, 2]");
  EXPECT_NE(array.find(where + " is a JSON array, not an object; each line must be an object with a \"text\" field"),
            std::string::npos)
      << array;
  const std::string number = error_at("{\"text\": 5}");
  EXPECT_NE(number.find(where + ": field \"text\" is a number, not a string"), std::string::npos) << number;
  const std::string fields =
      error_at(R"({"j": 1, "i": 1, "h": 1, "g": 1, "f": 1, "e": 1, "d": 1, "c": 1, "b": 1, "a": 1})");
  EXPECT_NE(fields.find(where + " has no field \"text\" (its fields: a, b, c, d, e, f, g, h, ...)"), std::string::npos)
      << fields;
  EXPECT_NE(error_at("{}").find(where + " has no field \"text\" (its fields: none)"), std::string::npos);
  const std::string broken = error_at("{\"text\": \"unterminated}");
  EXPECT_NE(broken.find(where + " is not valid JSON ("), std::string::npos) << broken;
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"c.jsonl"})) << "nothing written under any name";
}

TEST(TokenizeCorpus, ACorpusOfEmptyDocumentsIsRefused) {
  test::TempDir dir;
  write_text(dir.file("a.jsonl"), jsonl({"", ""}));
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("a.jsonl")};
  o.out = dir.file("train.bin");
  const std::string msg = error_of([&] { tokenize_corpus(BytesWithEos(), o); });
  EXPECT_NE(msg.find("the inputs hold no text to tokenize (every document is empty)"), std::string::npos) << msg;
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"a.jsonl"}));
}

TEST(TokenizeCorpus, OptionsAreCheckedBeforeAnythingIsRead) {
  test::TempDir dir;
  write_text(dir.file("a.txt"), "text");
  const BytesWithEos t;
  const auto error_with = [&](const std::function<void(TokenizeCorpusOptions&)>& change) {
    TokenizeCorpusOptions o;
    o.inputs = {dir.file("a.txt")};
    o.out = dir.file("train.bin");
    change(o);
    return error_of([&] { tokenize_corpus(t, o); });
  };
  EXPECT_NE(error_with([](auto& o) { o.inputs.clear(); }).find("no inputs; give text files, .jsonl files or folders"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& o) { o.out = ""; }).find("no output file; give --out"), std::string::npos);
  EXPECT_NE(error_with([](auto& o) { o.val_fraction = -0.1; }).find("--val-fraction -0.1 is not in [0, 1)"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& o) { o.val_fraction = 1; }).find("--val-fraction 1 is not in [0, 1)"),
            std::string::npos);
  EXPECT_NE(error_with([](auto& o) { o.field = ""; }).find("--field is empty"), std::string::npos);
  const std::string folder = error_with([&](auto& o) { o.out = dir.path(); });
  EXPECT_NE(folder.find("--out '" + dir.path() + "' is a folder; give a file name"), std::string::npos) << folder;
  EXPECT_EQ(names_in(dir.path()), (std::vector<std::string>{"a.txt"}));
  // A missing output folder is created.
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("a.txt")};
  o.out = dir.file("new/sub/train.bin");
  o.val_fraction = 0;
  EXPECT_EQ(read_llmc(tokenize_corpus(t, o).train_path).ids, ids_of({"text"}));
}

TEST(TokenizeCorpus, CorpusFilesWalksFoldersInNameOrderSkippingHiddenAndOtherFiles) {
  test::TempDir dir;
  fs::create_directories(dir.file("folder/sub"));
  fs::create_directories(dir.file("folder/.cache"));
  for (const char* f :
       {"folder/b.TXT", "folder/a.md", "folder/sub/c.jsonl", "folder/g.NdJson", "folder/h.rst", "folder/i.markdown",
        "folder/j.text", "folder/.cache/d.txt", "folder/.e.txt", "folder/f.bin", "folder/notes", "given.bin"})
    write_text(dir.file(f), "{\"text\": \"t\"}\n");
  EXPECT_EQ(
      corpus_files({dir.file("given.bin"), dir.file("folder")}),
      (std::vector<std::string>{dir.file("given.bin"), dir.file("folder/a.md"), dir.file("folder/b.TXT"),
                                dir.file("folder/g.NdJson"), dir.file("folder/h.rst"), dir.file("folder/i.markdown"),
                                dir.file("folder/j.text"), dir.file("folder/sub/c.jsonl")}))
      << "a file given by name is read whatever its extension";
  fs::create_directories(dir.file("nothing/.hidden"));
  write_text(dir.file("nothing/.hidden/x.txt"), "hidden");
  write_text(dir.file("nothing/y.csv"), "a,b");
  const std::string msg = error_of([&] { corpus_files({dir.file("nothing")}); });
  EXPECT_NE(msg.find("folder '" + dir.file("nothing") + "' holds no text-like files"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] {
              corpus_files({dir.file("folder"), dir.file("gone.txt")});
            }).find("input '" + dir.file("gone.txt") + "' does not exist"),
            std::string::npos);
}

// A text may hold a few malformed UTF-8 bytes (latin-1 leftovers): counted, each byte once; more
// than 16 plus 1 % of the first 64 KiB and the file is refused as not text.
TEST(TokenizeCorpus, MalformedUtf8BytesAreCountedByTheirKind) {
  test::TempDir dir;
  const std::string text = std::string("stray \x80") +                      // a lone continuation byte: 1
                           " overlong \xC0\x80" +                           // 2
                           " surrogate \xED\xA0\x80" +                      // 3
                           " past U+10FFFF \xF4\x90\x80\x80" +              // 4
                           " cut \xE4\xBD" + " end" +                       // a 3-byte character cut after 2: 2
                           " fine \xF0\x9F\x99\x82 \xE4\xBD\xA0 \xC3\xA9";  // well-formed: 0
  write_text(dir.file("mixed.txt"), text);
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("mixed.txt")};
  o.out = dir.file("train.bin");
  o.val_fraction = 0;
  const TokenizeSummary s = tokenize_corpus(BytesWithEos(), o);
  EXPECT_EQ(s.malformed_utf8_bytes, 12);
  EXPECT_EQ(read_llmc(s.train_path).ids, ids_of({text})) << "the bytes are tokenized as they are";
}

// The byte tokenizer may cut a task anywhere for its ids, but cuts at a character's start, so a
// character never counts as malformed for lying across two tasks.
TEST(TokenizeCorpus, TasksOfTheByteTokenizerNeverSplitACharacter) {
  test::TempDir dir;
  std::string text;
  for (int i = 0; i < 300; ++i) text += "\xC3\xA9";  // 300 x é
  write_text(dir.file("accents.txt"), text);
  for (const int64_t task_bytes : {7, 64, 1 << 20}) {
    TokenizeCorpusOptions o;
    o.inputs = {dir.file("accents.txt")};
    o.out = dir.file("train_" + std::to_string(task_bytes) + ".bin");
    o.val_fraction = 0;
    o.task_bytes = task_bytes;
    const TokenizeSummary s = tokenize_corpus(ByteTokenizer(), o);
    EXPECT_EQ(s.malformed_utf8_bytes, 0) << "tasks of " << task_bytes << " bytes";
    EXPECT_EQ(read_llmc(s.train_path).ids.size(), text.size()) << "every byte once";
  }
}

TEST(TokenizeCorpus, TheNotTextLimitIsSixteenBytesPlusOnePercent) {
  test::TempDir dir;
  TokenizeCorpusOptions o;
  o.out = dir.file("train.bin");
  o.val_fraction = 0;
  // 1000 bytes: up to 16 + 10 malformed ones are a text.
  write_text(dir.file("ok.txt"), std::string(974, 'a') + std::string(26, '\xFF'));
  o.inputs = {dir.file("ok.txt")};
  EXPECT_EQ(tokenize_corpus(BytesWithEos(), o).malformed_utf8_bytes, 26);
  write_text(dir.file("not.txt"), std::string(973, 'a') + std::string(27, '\xFF'));
  o.inputs = {dir.file("not.txt")};
  const std::string msg = error_of([&] { tokenize_corpus(BytesWithEos(), o); });
  EXPECT_NE(msg.find("input '" + dir.file("not.txt") + "' does not look like text (0 NUL and 27 malformed UTF-8 bytes"),
            std::string::npos)
      << msg;
}

TEST(TokenizeCorpus, ProgressEndsWithEveryInputByteAndTheSummarysCounts) {
  test::TempDir dir;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "progress line " + std::to_string(i) + "\n";
  write_text(dir.file("a.txt"), text);
  write_text(dir.file("b.jsonl"), jsonl({"one", "two", "three"}));
  TokenizeCorpusOptions o;
  o.inputs = {dir.file("a.txt"), dir.file("b.jsonl")};
  o.out = dir.file("train.bin");
  o.val_fraction = 0;
  o.threads = 1;
  o.task_bytes = 100;  // several batches
  std::vector<TokenizeProgress> reports;
  o.on_progress = [&](const TokenizeProgress& p) { reports.push_back(p); };
  const TokenizeSummary s = tokenize_corpus(BytesWithEos(), o);
  ASSERT_GE(reports.size(), 2u);
  for (size_t i = 1; i < reports.size(); ++i) {
    EXPECT_GE(reports[i].bytes_done, reports[i - 1].bytes_done);
    EXPECT_GE(reports[i].tokens, reports[i - 1].tokens);
  }
  const TokenizeProgress& last = reports.back();
  EXPECT_EQ(last.bytes_total, s.input_bytes);
  EXPECT_EQ(last.bytes_done, s.input_bytes);
  EXPECT_EQ(last.documents, s.documents);
  EXPECT_EQ(last.tokens, s.tokens());
  EXPECT_EQ(s.documents, 4);
}

}  // namespace
}  // namespace tandem
