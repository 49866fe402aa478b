#pragma once
// A corpus of text files, JSON Lines files and folders into llm.c token files that `tandem train`
// reads, on every core: documents separated by the EOS token, every 1/f-th document held out
// (Note [Held-out documents]), both files written under temporary names and renamed when complete.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tandem/data/tokenizer.h"

namespace tandem {

/// How far tokenize_corpus has come (reported after each batch of tasks).
struct TokenizeProgress {
  int64_t bytes_done = 0, bytes_total = 0;  ///< input bytes read and encoded, of all inputs
  int64_t documents = 0, tokens = 0;
  double seconds = 0;
};

/// What to tokenize and where to write it.
struct TokenizeCorpusOptions {
  std::vector<std::string> inputs;      ///< text files, .jsonl/.ndjson files, folders (searched recursively)
  std::string out;                      ///< the training file; the held-out one is held_out_path(out)
  std::string field = "text";           ///< the JSONL field that holds a document's text
  double val_fraction = 0.005;          ///< the share of documents held out (0: none)
  int threads = 0;                      ///< 0: resolve_cpu_threads() (TANDEM_CPU_THREADS, OMP_NUM_THREADS, all)
  size_t task_bytes = size_t{1} << 20;  ///< text per task; longer documents are cut (Note [Document pieces])
  std::function<void(const TokenizeProgress&)> on_progress;
};

/// How the held-out split was chosen.
enum class HeldOut {
  kNone,       ///< val_fraction 0, or too few tokens to split
  kDocuments,  ///< whole documents: every 1/val_fraction-th one
  kTail,       ///< fewer documents than 1/val_fraction: the last val_fraction of the tokens
};

/// What tokenize_corpus wrote.
struct TokenizeSummary {
  int64_t files = 0, input_bytes = 0;
  int64_t documents = 0, empty_documents = 0;  ///< documents written; empty texts skipped
  int64_t train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  double seconds = 0;
  int threads = 1;
  int bytes_per_token = 2;     ///< 2 (llm.c uint16) or 4 (uint32, vocabularies over 65536)
  std::optional<TokenId> eos;  ///< the separator; none when the tokenizer has no EOS
  HeldOut held_out = HeldOut::kNone;
  std::string train_path, val_path;  ///< val_path is "" when nothing was held out
  int64_t malformed_utf8_bytes = 0;  ///< bytes of the text inputs in malformed UTF-8 sequences
  int64_t tokens() const { return train_tokens + val_tokens; }
};

/// Where the held-out split of `out` goes: "data/train.bin" -> "data/train_val.bin".
std::string held_out_path(const std::string& out);

/// The files of `inputs`: files as given, folders' text-like files (.txt .text .md .markdown .rst
/// .jsonl .ndjson; hidden ones skipped) recursively in name order. UserError for a missing input or
/// a folder without such files.
std::vector<std::string> corpus_files(const std::vector<std::string>& inputs);

/// Tokenizes the corpus. UserError (file and line, cause, fix) for a missing input, a malformed
/// JSONL line or a missing field; nothing is left behind under the output names on failure.
TokenizeSummary tokenize_corpus(const Tokenizer& tokenizer, const TokenizeCorpusOptions& options);

}  // namespace tandem
