#include "tandem/data/tokenize_corpus.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <nlohmann/json.hpp>

#include "tandem/core/error.h"
#include "tandem/core/fs.h"
#include "tandem/core/strings.h"
#include "tandem/core/thread_pool.h"
#include "tandem/data/token_file.h"

namespace fs = std::filesystem;

// Note [Held-out documents]
// Document g (counting from 0 over all inputs, in order) is held out when floor((g+1)*f) >
// floor(g*f): every 1/f-th document, spread evenly through the corpus and the same on every
// machine and thread count. With fewer documents than that (one long text file, say) no document
// qualifies, and the last f of the training tokens move to the held-out file instead. Both files
// end each document with the EOS token, as `tandem train` reads them (data.path, data.val_path).

namespace tandem {

namespace {

enum class InputKind { kText, kJsonl };

// A task: a piece of one input file.
struct Chunk {
  std::string bytes;
  InputKind kind = InputKind::kText;
  const std::string* file = nullptr;
  int64_t first_line = 1;      // JSONL: the line number of bytes[0]
  bool ends_document = false;  // text: the file's document ends with this piece
};

// A task's tokens: documents end at doc_ends (after their EOS); tokens after the last end belong
// to a document that continues in the next task.
struct ChunkTokens {
  std::vector<TokenId> ids;
  std::vector<size_t> doc_ends;
  int64_t empty_documents = 0;
  int64_t malformed_utf8_bytes = 0;
};

// Bytes of `text` inside malformed UTF-8 sequences (a stray continuation byte, a truncated or
// overlong sequence, a surrogate, a code point past U+10FFFF). A sequence cut by the end of the text
// counts as malformed: the reader cuts tasks at piece boundaries, never inside a character.
int64_t malformed_utf8_bytes(std::string_view text) {
  int64_t bad = 0;
  for (size_t i = 0; i < text.size();) {
    const int n = utf8_scan(text, i);
    if (n < 0) bad += -n;
    i += static_cast<size_t>(n < 0 ? -n : n);
  }
  return bad;
}

bool has_extension(const fs::path& p, std::initializer_list<const char*> extensions) {
  const std::string ext = to_lower(p.extension().string());
  for (const char* e : extensions)
    if (ext == e) return true;
  return false;
}

InputKind kind_of(const std::string& file) {
  return has_extension(file, {".jsonl", ".ndjson"}) ? InputKind::kJsonl : InputKind::kText;
}

bool hidden(const fs::path& p) { return p.filename().string().rfind('.', 0) == 0; }

std::vector<std::string> folder_files(const std::string& dir) {
  std::vector<std::string> files;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    if (hidden(it->path())) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file() &&
        has_extension(it->path(), {".txt", ".text", ".md", ".markdown", ".rst", ".jsonl", ".ndjson"}))
      files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  TANDEM_CHECK(!files.empty(), "folder '", dir,
               "' holds no text-like files (.txt .text .md .markdown .rst .jsonl .ndjson); give the files "
               "themselves or another folder");
  return files;
}

// ---- Reading ---------------------------------------------------------------------------------

// Reads the inputs in order and cuts them into tasks of about `task_bytes`: JSON Lines at line
// ends, text where the tokenizer allows (Note [Document pieces]), else a whole document per task.
class CorpusReader {
 public:
  CorpusReader(const std::vector<std::string>& files, const Tokenizer& tokenizer, size_t task_bytes)
      : files_(files), tokenizer_(tokenizer), task_bytes_(std::max<size_t>(task_bytes, 1)) {}

  bool next(Chunk& chunk) {
    while (index_ < files_.size()) {
      if (!in_.is_open() && !open_next()) continue;
      if (cut(chunk)) return true;
    }
    return false;
  }

  int64_t bytes_read() const { return bytes_read_; }

 private:
  bool open_next() {
    const std::string& file = files_[index_];
    in_.open(file, std::ios::binary);
    TANDEM_CHECK(in_.is_open(), "cannot read input '", file, "': ", std::strerror(errno), "; check its permissions");
    buffer_.clear();
    scanned_ = 0;
    line_ = 1;
    eof_ = false;
    return true;
  }

  void read_more() {
    const size_t old = buffer_.size();
    buffer_.resize(old + task_bytes_);
    in_.read(&buffer_[old], static_cast<std::streamsize>(task_bytes_));
    const auto got = static_cast<size_t>(in_.gcount());
    buffer_.resize(old + got);
    bytes_read_ += static_cast<int64_t>(got);
    eof_ = got < task_bytes_;
    TANDEM_CHECK(!in_.bad(), "cannot read input '", files_[index_], "': ", std::strerror(errno));
  }

  // The next task from the open file, false when the file is done.
  bool cut(Chunk& chunk) {
    const InputKind kind = kind_of(files_[index_]);
    while (true) {
      if (!eof_ && buffer_.size() < task_bytes_) read_more();
      size_t end = buffer_.size();
      if (!eof_ && (end = cut_point(kind)) == 0) {
        read_more();  // no place to cut yet: take more of the file
        continue;
      }
      if (end == 0) {  // the file is done
        in_.close();
        ++index_;
        return false;
      }
      chunk.bytes.assign(buffer_, 0, end);
      buffer_.erase(0, end);
      scanned_ = buffer_.size();
      chunk.kind = kind;
      chunk.file = &files_[index_];
      chunk.first_line = line_;
      chunk.ends_document = eof_ && buffer_.empty();
      line_ += std::count(chunk.bytes.begin(), chunk.bytes.end(), '\n');
      return true;
    }
  }

  // The last place in the buffer where a task may end (0: none), looking only at what the last
  // search did not see, so a long line or document costs one pass.
  size_t cut_point(InputKind kind) {
    const size_t from = scanned_ > 2 ? scanned_ - 2 : 0;
    scanned_ = buffer_.size();
    const std::string_view rest = std::string_view(buffer_).substr(from);
    if (kind == InputKind::kJsonl) {
      const size_t nl = rest.rfind('\n');
      return nl == std::string_view::npos ? 0 : from + nl + 1;
    }
    const size_t p = tokenizer_.piece_boundary(rest, rest.size() - 1);
    return p == 0 ? 0 : from + p;
  }

  const std::vector<std::string>& files_;
  const Tokenizer& tokenizer_;
  size_t task_bytes_;
  size_t index_ = 0, scanned_ = 0;
  std::ifstream in_;
  std::string buffer_;
  int64_t line_ = 1, bytes_read_ = 0;
  bool eof_ = false;
};

// ---- Encoding --------------------------------------------------------------------------------

std::string fields_of(const nlohmann::json& j) {
  std::vector<std::string> names;
  for (const auto& [k, v] : j.items()) names.push_back(k);
  if (names.size() > 8) names.resize(8), names.push_back("...");
  return names.empty() ? "none" : join(names, ", ");
}

// The text of one JSONL record; UserError naming the file, the line, the cause and the fix.
std::string record_text(std::string_view line, const std::string& field, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    TANDEM_FAIL(where, " is not valid JSON (", e.what(), "); fix or remove the line (JSON Lines: one object per line)");
  }
  TANDEM_CHECK(j.is_object(), where, " is a JSON ", j.type_name(),
               ", not an object; each line must be an object with a \"", field, "\" field");
  TANDEM_CHECK(j.contains(field), where, " has no field \"", field, "\" (its fields: ", fields_of(j),
               "); name the text's field with --field");
  TANDEM_CHECK(j[field].is_string(), where, ": field \"", field, "\" is a ", j[field].type_name(),
               ", not a string; name the text's field with --field");
  return j[field].get<std::string>();
}

void end_document(ChunkTokens& out, const std::optional<TokenId>& eos) {
  if (eos) out.ids.push_back(*eos);
  out.doc_ends.push_back(out.ids.size());
}

void encode_jsonl(const Tokenizer& tokenizer, const Chunk& chunk, const std::string& field,
                  const std::optional<TokenId>& eos, ChunkTokens& out) {
  std::string_view rest(chunk.bytes);
  for (int64_t line = chunk.first_line; !rest.empty(); ++line) {
    const size_t nl = rest.find('\n');
    std::string_view text = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    if (std::all_of(text.begin(), text.end(), [](char c) { return std::isspace(static_cast<unsigned char>(c)); }))
      continue;  // blank lines separate nothing
    const std::string doc = record_text(text, field, *chunk.file + ":" + std::to_string(line));
    if (doc.empty()) {
      ++out.empty_documents;
      continue;
    }
    const auto ids = tokenizer.encode(doc);
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    end_document(out, eos);
  }
}

ChunkTokens encode_chunk(const Tokenizer& tokenizer, const Chunk& chunk, const std::string& field,
                         const std::optional<TokenId>& eos) {
  ChunkTokens out;
  if (chunk.kind == InputKind::kJsonl) {
    encode_jsonl(tokenizer, chunk, field, eos, out);
  } else {
    out.ids = tokenizer.encode(chunk.bytes);
    if (chunk.ends_document) end_document(out, eos);
  }
  out.malformed_utf8_bytes = malformed_utf8_bytes(chunk.bytes);
  return out;
}

// ---- Writing ---------------------------------------------------------------------------------

// An llm.c token file written under a temporary name in its folder, renamed by commit(); removed
// when never committed (Note [Held-out documents]).
class TokenFileWriter {
 public:
  TokenFileWriter(std::string path, int bytes_per_token) : path_(std::move(path)), bpt_(bytes_per_token) {
    const fs::path p(path_);
    tmp_ = (p.parent_path() / ("." + p.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
    fd_ = ::open(tmp_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    TANDEM_CHECK(fd_ >= 0, "cannot create '", tmp_, "': ", std::strerror(errno), "; check the output folder");
    write_at(std::string(kLlmcHeaderBytes, '\0').data(), kLlmcHeaderBytes, 0);
  }
  ~TokenFileWriter() {
    if (fd_ >= 0) ::close(fd_), ::unlink(tmp_.c_str());
  }
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void append(const TokenId* ids, size_t n) {
    TANDEM_CHECK(count_ + static_cast<int64_t>(n) <= std::numeric_limits<int32_t>::max(), "'", path_,
                 "' would hold more than 2^31-1 tokens, the llm.c header's limit; tokenize the corpus in parts "
                 "(several --out files)");
    std::vector<char> bytes(n * static_cast<size_t>(bpt_));
    for (size_t i = 0; i < n; ++i) {
      const auto v = static_cast<uint32_t>(ids[i]);
      std::memcpy(&bytes[i * bpt_], &v, static_cast<size_t>(bpt_));  // little-endian: the low bytes
    }
    write_at(bytes.data(), static_cast<int64_t>(bytes.size()), kLlmcHeaderBytes + count_ * bpt_);
    count_ += static_cast<int64_t>(n);
  }

  /// Removes the last n tokens and returns them.
  std::vector<TokenId> take_tail(int64_t n) {
    std::vector<TokenId> ids(static_cast<size_t>(n));
    std::vector<char> bytes(static_cast<size_t>(n * bpt_));
    const int64_t at = kLlmcHeaderBytes + (count_ - n) * bpt_;
    TANDEM_CHECK(::pread(fd_, bytes.data(), bytes.size(), at) == static_cast<ssize_t>(bytes.size()), "cannot read '",
                 tmp_, "' back: ", std::strerror(errno));
    for (int64_t i = 0; i < n; ++i) {
      uint32_t v = 0;
      std::memcpy(&v, &bytes[i * bpt_], static_cast<size_t>(bpt_));
      ids[i] = static_cast<TokenId>(v);
    }
    count_ -= n;
    TANDEM_CHECK(::ftruncate(fd_, at) == 0, "cannot truncate '", tmp_, "': ", std::strerror(errno));
    return ids;
  }

  /// Writes the header, flushes to disk and renames the file into place.
  void commit() {
    int32_t header[kLlmcHeaderBytes / 4] = {};
    header[0] = bpt_ == 2 ? kLlmcMagicU16 : kLlmcMagicU32;
    header[1] = bpt_ == 2 ? kLlmcVersionU16 : kLlmcVersionU32;
    header[2] = static_cast<int32_t>(count_);
    write_at(header, kLlmcHeaderBytes, 0);
    TANDEM_CHECK(::fsync(fd_) == 0, "cannot flush '", tmp_, "' to disk: ", std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp_.c_str());
      TANDEM_FAIL("cannot rename '", tmp_, "' to '", path_, "': ", std::strerror(err));
    }
  }

  int64_t count() const { return count_; }

 private:
  void write_at(const void* data, int64_t size, int64_t offset) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const ssize_t n = ::pwrite(fd_, p, static_cast<size_t>(size), offset);
      if (n < 0 && errno == EINTR) continue;
      TANDEM_CHECK(n > 0, "cannot write '", tmp_, "': ", std::strerror(errno), "; check free space");
      p += n, size -= n, offset += n;
    }
  }

  std::string path_, tmp_;
  int bpt_;
  int fd_ = -1;
  int64_t count_ = 0;
};

// Routes each document's tokens to the training or the held-out file (Note [Held-out documents]).
class SplitWriter {
 public:
  SplitWriter(const TokenizeCorpusOptions& o, int bytes_per_token) : fraction_(o.val_fraction) {
    train_ = std::make_unique<TokenFileWriter>(o.out, bytes_per_token);
    if (fraction_ > 0) val_ = std::make_unique<TokenFileWriter>(held_out_path(o.out), bytes_per_token);
  }

  void add(const ChunkTokens& t) {
    size_t begin = 0;
    for (size_t end : t.doc_ends) {
      write(t.ids.data() + begin, end - begin);
      (to_val_ ? val_documents_ : train_documents_)++;
      ++documents_;
      to_val_ = held_out(documents_);
      begin = end;
    }
    write(t.ids.data() + begin, t.ids.size() - begin);
  }

  void finish(TokenizeSummary& s);

  int64_t documents() const { return documents_; }
  int64_t tokens() const { return train_->count() + (val_ ? val_->count() : 0); }

 private:
  bool held_out(int64_t g) const {
    return fraction_ > 0 && std::floor(double(g + 1) * fraction_) > std::floor(double(g) * fraction_);
  }
  void write(const TokenId* ids, size_t n) {
    if (n > 0) (to_val_ ? *val_ : *train_).append(ids, n);
  }

  double fraction_;
  std::unique_ptr<TokenFileWriter> train_, val_;
  int64_t documents_ = 0, train_documents_ = 0, val_documents_ = 0;
  bool to_val_ = false;
};

void SplitWriter::finish(TokenizeSummary& s) {
  TANDEM_CHECK(train_->count() > 0, "the inputs hold no text to tokenize (every document is empty); give other inputs");
  s.held_out = val_documents_ > 0 ? HeldOut::kDocuments : HeldOut::kNone;
  if (val_ && val_documents_ == 0 && train_->count() >= 2) {  // too few documents: the tail
    const int64_t n = std::clamp<int64_t>(std::llround(double(train_->count()) * fraction_), 1, train_->count() - 1);
    const auto tail = train_->take_tail(n);
    val_->append(tail.data(), tail.size());
    s.held_out = HeldOut::kTail;
  }
  s.documents = documents_;
  s.train_documents = train_documents_;
  s.val_documents = val_documents_;
  s.train_tokens = train_->count();
  s.val_tokens = val_ ? val_->count() : 0;
  train_->commit();
  if (s.held_out != HeldOut::kNone) val_->commit();
  fsync_directory(fs::path(s.train_path).parent_path().empty() ? "." : fs::path(s.train_path).parent_path().string());
}

void check_options(const TokenizeCorpusOptions& o) {
  TANDEM_CHECK(!o.inputs.empty(), "no inputs; give text files, .jsonl files or folders to tokenize");
  TANDEM_CHECK(!o.out.empty(), "no output file; give --out, e.g. --out data/train.bin");
  TANDEM_CHECK(o.val_fraction >= 0 && o.val_fraction < 1, "--val-fraction ", o.val_fraction,
               " is not in [0, 1); give e.g. 0.005 (0 holds nothing out)");
  TANDEM_CHECK(!o.field.empty(), "--field is empty; name the JSONL field that holds the text");
  TANDEM_CHECK(!fs::is_directory(o.out), "--out '", o.out, "' is a folder; give a file name, e.g. ", o.out,
               "/train.bin");
}

}  // namespace

std::string held_out_path(const std::string& out) {
  const fs::path p(out);
  return (p.parent_path() / (p.stem().string() + "_val" + p.extension().string())).string();
}

// Refuses an input that is not text: NUL bytes, or malformed UTF-8 beyond 16 bytes and 1 % of its
// first 64 KiB (an image, an archive, a token file given by mistake would otherwise become tokens;
// a few latin-1 bytes in a text are counted and reported instead).
void check_text(const std::string& file) {
  constexpr size_t kSample = 64 * 1024;
  std::ifstream in(file, std::ios::binary);
  std::string head(kSample, '\0');
  in.read(head.data(), static_cast<std::streamsize>(kSample));
  head.resize(static_cast<size_t>(in.gcount()));
  // The sample may end inside a character: leave its last incomplete one out.
  const std::string_view text(head.data(), head.size() < kSample ? head.size() : utf8_complete_length(head));
  const auto nul = std::count(text.begin(), text.end(), '\0');
  const int64_t bad = malformed_utf8_bytes(text);
  TANDEM_CHECK(nul == 0 && bad <= 16 + static_cast<int64_t>(text.size()) / 100, "input '", file,
               "' does not look like text (", nul, " NUL and ", bad, " malformed UTF-8 bytes in its first ",
               format_bytes(double(text.size())),
               "); leave it out of the inputs: tandem tokenize reads text and .jsonl files");
}

std::vector<std::string> corpus_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& input : inputs) {
    TANDEM_CHECK(fs::exists(input), "input '", input, "' does not exist; give text files, .jsonl files or folders");
    if (fs::is_directory(input)) {
      for (auto& f : folder_files(input)) files.push_back(std::move(f));
    } else {
      files.push_back(input);
    }
  }
  for (const auto& f : files) check_text(f);
  return files;
}

// Note [Tokenize pipeline]
// Encoding is the work; reading the inputs and writing the token file are serial, and done
// between the pool's batches they left the pool idle: on 2 threads a unigram model's corpus ran
// 1.3x its 1-thread speed where the sentencepiece package's ran 1.75x (bench/sentencepiece_peer.py).
// So they run beside the encoding, on two threads of their own (std::async), one batch ahead and
// one behind. Exceptions (an unreadable input, a full disk) come out of the futures in order.
struct ReadBatch {
  std::vector<Chunk> chunks;  // up to 8 tasks per pool thread; none: the inputs have ended
  int64_t bytes_read = 0;     // the reader's count after this batch, for the progress line
};

TokenizeSummary tokenize_corpus(const Tokenizer& tokenizer, const TokenizeCorpusOptions& o) {
  check_options(o);
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  TokenizeSummary s;
  const std::vector<std::string> files = corpus_files(o.inputs);
  for (const auto& f : files) s.input_bytes += static_cast<int64_t>(fs::file_size(f));
  s.files = static_cast<int64_t>(files.size());
  s.eos = tokenizer.eos_id();
  s.bytes_per_token = tokenizer.vocab_size() <= 65536 ? 2 : 4;
  s.train_path = o.out;
  const fs::path dir = fs::path(o.out).parent_path();
  if (!dir.empty()) ensure_writable_directory(dir.string(), "output folder");

  CpuThreadPool pool(resolve_cpu_threads(o.threads));
  s.threads = pool.size();
  CorpusReader reader(files, tokenizer, o.task_bytes);
  SplitWriter writer(o, s.bytes_per_token);
  const size_t batch_tasks = static_cast<size_t>(8 * pool.size());
  // Note [Tokenize pipeline]: batch k + 1 is read and batch k - 1 written while the pool encodes
  // batch k; the reader and the writer each run one task at a time, in order.
  const auto read_batch = [&reader, batch_tasks] {
    ReadBatch b;
    Chunk chunk;
    while (b.chunks.size() < batch_tasks && reader.next(chunk)) b.chunks.push_back(std::move(chunk));
    b.bytes_read = reader.bytes_read();
    return b;
  };
  const auto write_batch = [&](std::vector<ChunkTokens> results, int64_t bytes_read) {
    for (const auto& r : results) {
      writer.add(r);
      s.empty_documents += r.empty_documents;
      s.malformed_utf8_bytes += r.malformed_utf8_bytes;
    }
    if (o.on_progress) o.on_progress({bytes_read, s.input_bytes, writer.documents(), writer.tokens(), seconds()});
  };
  std::future<ReadBatch> next = std::async(std::launch::async, read_batch);
  std::future<void> written;
  for (;;) {
    ReadBatch batch = next.get();
    if (batch.chunks.empty()) break;
    next = std::async(std::launch::async, read_batch);
    std::vector<ChunkTokens> results(batch.chunks.size());
    pool.run(static_cast<int64_t>(batch.chunks.size()),
             [&](int64_t i) { results[i] = encode_chunk(tokenizer, batch.chunks[i], o.field, s.eos); });
    if (written.valid()) written.get();
    written = std::async(std::launch::async, write_batch, std::move(results), batch.bytes_read);
  }
  if (written.valid()) written.get();
  writer.finish(s);
  s.val_path = s.held_out == HeldOut::kNone ? "" : held_out_path(o.out);
  s.seconds = seconds();
  return s;
}

}  // namespace tandem
