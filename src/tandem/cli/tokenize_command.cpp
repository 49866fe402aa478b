#include "tandem/cli/tokenize_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "tandem/core/error.h"
#include "tandem/core/log.h"
#include "tandem/core/strings.h"
#include "tandem/data/tokenizer_files.h"

namespace tandem {

namespace {

// Progress on stderr: one redrawn bar on a terminal, a line every 10 seconds otherwise.
class ProgressBar {
 public:
  ProgressBar() : terminal_(::isatty(STDERR_FILENO) == 1) {}

  void update(const TokenizeProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (!terminal_ && now - last_ < std::chrono::seconds(10)) return;
    last_ = now;
    const double done = p.bytes_total > 0 ? double(p.bytes_done) / double(p.bytes_total) : 1.0;
    const int filled = static_cast<int>(done * kWidth + 0.5);
    const std::string bar = std::string(filled, '#') + std::string(kWidth - filled, '.');
    const std::string line =
        strprintf("[%s] %3.0f%%  %s of %s  %s documents  %s tokens  %s tokens/s", bar.c_str(), done * 100,
                  format_bytes(double(p.bytes_done)).c_str(), format_bytes(double(p.bytes_total)).c_str(),
                  format_count(double(p.documents)).c_str(), format_count(double(p.tokens)).c_str(),
                  format_count(p.seconds > 0 ? double(p.tokens) / p.seconds : 0).c_str());
    std::fprintf(stderr, terminal_ ? "\r%s\x1b[K" : "%s\n", line.c_str());
    drawn_ = true;
  }

  void finish() {
    if (terminal_ && drawn_) std::fputc('\n', stderr);
  }

 private:
  static constexpr int kWidth = 30;
  bool terminal_, drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

// "1 document", "2 documents".
std::string counted(int64_t n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); }

// "1 token", "1.2 K tokens".
std::string tokens_text(int64_t n) { return format_count(double(n)) + (n == 1 ? " token" : " tokens"); }

std::string held_out_text(const TokenizeSummary& s, double fraction) {
  switch (s.held_out) {
    case HeldOut::kDocuments:
      return strprintf(", %s (%s, %s: one in %.0f)", s.val_path.c_str(), tokens_text(s.val_tokens).c_str(),
                       counted(s.val_documents, "document").c_str(), 1.0 / fraction);
    case HeldOut::kTail: {
      // A share below one token is raised to one: say so rather than quote the share asked for.
      const std::string tail = fraction * double(s.tokens()) < 1
                                   ? std::string("the last token, as --val-fraction's share is less than one")
                                   : strprintf("the last %g%% of the tokens", fraction * 100);
      return strprintf(", %s (%s: %s, as there are fewer than %.0f documents)", s.val_path.c_str(),
                       tokens_text(s.val_tokens).c_str(), tail.c_str(), 1.0 / fraction);
    }
    case HeldOut::kNone:
      break;
  }
  return fraction > 0 ? " (too few tokens to hold any out)" : "";
}

void print_summary(const TokenizeSummary& s, double fraction, const Tokenizer& tokenizer) {
  const double rate = s.seconds > 0 ? double(s.tokens()) / s.seconds : 0;
  const std::string eos = s.eos ? "'" + tokenizer.id_to_token(*s.eos) + "' (" + std::to_string(*s.eos) + ")" : "none";
  std::printf(
      "tokenized %s from %s (%s) into %s tokens in %.1f s, %s tokens/s on %s, EOS %s: %s (%s tokens, %s, %s)%s\n",
      counted(s.documents, "document").c_str(), counted(s.files, "file").c_str(),
      format_bytes(double(s.input_bytes)).c_str(), format_count(double(s.tokens())).c_str(), s.seconds,
      format_count(rate).c_str(), counted(s.threads, "thread").c_str(), eos.c_str(), s.train_path.c_str(),
      format_count(double(s.train_tokens)).c_str(), counted(s.train_documents, "document").c_str(),
      s.bytes_per_token == 2 ? "uint16" : "uint32", held_out_text(s, fraction).c_str());
}

}  // namespace

TokenizeCommand::TokenizeCommand(CLI::App& app) {
  command_ = app.add_subcommand(
      "tokenize",
      "text files, JSONL files or folders into llm.c token files for `tandem train` (documents end with EOS; every "
      "1/val-fraction-th document goes to <out stem>_val.bin): tandem tokenize --tokenizer MODEL_DIR --out "
      "data/train.bin corpus/");
  command_
      ->add_option("--tokenizer", tokenizer_,
                   "tokenizer.json, tokenizer.model, a model folder or checkpoint holding one, or 'byte'")
      ->required();
  command_->add_option("--out", options_.out, "the training token file, e.g. data/train.bin")->required();
  command_->add_option("inputs", options_.inputs, "text files, .jsonl/.ndjson files, folders (searched recursively)")
      ->required()
      ->expected(-1);
  command_->add_option("--field", options_.field, "the JSONL field holding each document's text (default text)");
  command_->add_option("--val-fraction", options_.val_fraction,
                       "share of documents held out in <out stem>_val.bin (default 0.005; 0: none)");
  command_
      ->add_option("--threads", options_.threads, "threads (default TANDEM_CPU_THREADS, OMP_NUM_THREADS or all cores)")
      ->check(CLI::NonNegativeNumber);
  command_->add_option("--eos", eos_, "the token that ends each document (default the tokenizer's EOS)");
}

bool TokenizeCommand::chosen() const { return command_->parsed(); }

int TokenizeCommand::run() {
  const TokenizerSource source = find_tokenizer(tokenizer_);
  TANDEM_CHECK(eos_.empty() || !source.file.empty(), "--eos ", eos_,
               ": the byte tokenizer has no special tokens (its 256 ids are the bytes), so documents follow each "
               "other without one; leave --eos out, or give --tokenizer a folder whose vocabulary holds it");
  SpecialTokenNames overrides;
  if (!eos_.empty()) overrides.eos = eos_;
  const auto tokenizer = open_tokenizer(source, overrides);
  log::debug(tokenizer->description());
  if (!tokenizer->eos_id())
    log::warn(source.file.empty()
                  ? "the byte tokenizer has no EOS token: documents are written back to back with no separator"
                  : "the tokenizer has no EOS token: documents are written back to back with no separator "
                    "(name one with --eos)");
  ProgressBar bar;
  options_.on_progress = [&](const TokenizeProgress& p) { bar.update(p); };
  TokenizeSummary summary;
  try {
    summary = tokenize_corpus(*tokenizer, options_);
  } catch (...) {
    bar.finish();  // the error goes on a line of its own
    throw;
  }
  bar.finish();
  print_summary(summary, options_.val_fraction, *tokenizer);
  if (summary.malformed_utf8_bytes > 0)
    log::warn(
        strprintf("%lld bytes of the inputs were malformed UTF-8 (not text in that encoding: latin-1, a "
                  "binary part); the tokenizer encoded them as it encodes unknown bytes",
                  static_cast<long long>(summary.malformed_utf8_bytes)));
  return 0;
}

}  // namespace tandem
