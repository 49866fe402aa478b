#include "tandem/cli/chat_command.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <utility>
#include <vector>

#include "tandem/cli/model_options.h"
#include "tandem/core/error.h"
#include "tandem/core/strings.h"
#include "tandem/serve/chat_format.h"

namespace tandem {

// Note [Chat in the terminal]
// `tandem chat` is a client of CompletionService, as the HTTP server is: each turn is one chat
// completion request that holds the whole conversation so far. The layout (Note [Chat formats]),
// the BOS, the stop strings that end the assistant's turn and the context check are therefore the
// server's, and a conversation typed here gets the reply `tandem serve` gives to the same messages
// and sampling parameters. The reply joins the history as the text that was printed (the stop
// string cut) and the next turn renders and tokenizes the conversation afresh, as an API client
// that resends its messages does; nothing is kept in the KV cache between turns, so each turn
// prefills the whole conversation. A conversation that outgrows the context is refused with its
// length, the turn dropped, and /reset starts over.

namespace {

constexpr const char* kHint = "type a message and Enter; /reset clears the conversation, /exit or Ctrl-D ends";

// One reply: its text goes to stdout as it arrives (on the scheduler's thread) while the caller
// waits for the end.
class TerminalReply {
 public:
  /// Callbacks into this object; it must live until wait() returns.
  CompletionBackend::Sink sink() {
    CompletionBackend::Sink s;
    s.on_text = [this](const std::string& text) {
      std::fwrite(text.data(), 1, text.size(), stdout);  // the whole text, a NUL byte included
      std::fflush(stdout);
      const std::lock_guard<std::mutex> lock(mutex_);
      text_ += text;
    };
    s.on_finish = [this](FinishReason, const Usage&) { end(""); };
    s.on_error = [this](const std::string& message) { end(message.empty() ? "unknown failure" : message); };
    return s;
  }

  /// Blocks until the reply ended; returns the failure, or "" when it finished.
  std::string wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    ended_cv_.wait(lock, [this] { return ended_; });
    return error_;
  }

  /// The whole text (after wait()).
  const std::string& text() const { return text_; }

 private:
  void end(const std::string& error) {
    const std::lock_guard<std::mutex> lock(mutex_);
    error_ = error;
    ended_ = true;
    ended_cv_.notify_all();
  }

  std::mutex mutex_;
  std::condition_variable ended_cv_;
  std::string text_, error_;
  bool ended_ = false;
};

// The next line of stdin without its line ending; false at EOF. On a terminal a "> " asks for it.
bool read_turn(std::string& line) {
  if (isatty(STDIN_FILENO)) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
  }
  if (!std::getline(std::cin, line)) return false;
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return true;
}

// The conversation so far, each turn one chat completion request of the whole of it to `backend`.
class Conversation {
 public:
  /// `opening`: the request of an empty conversation (its messages, max_tokens, sampling).
  Conversation(CompletionBackend& backend, CompletionRequest opening, uint64_t seed)
      : backend_(backend), opening_(std::move(opening)), request_(opening_), seed_(seed) {}

  /// Back to the opening messages.
  void reset() {
    request_ = opening_;
    replies_ = 0;
  }

  /// Sends `line` as the user's turn and streams the reply to stdout, a newline after it. Returns
  /// the generation's failure, or "" (also when the conversation no longer fits: said on stderr,
  /// the turn dropped).
  std::string say(const std::string& line) {
    request_.messages.push_back({"user", line});
    request_.seed = seed_ + replies_;  // reply i uses seed + i
    TerminalReply reply;
    try {
      backend_.submit(request_, reply.sink());
    } catch (const ApiError& e) {
      TANDEM_CHECK(e.code() == "context_length_exceeded", e.what());
      request_.messages.pop_back();
      std::fprintf(stderr, "tandem: this turn was not sent: %s; /reset starts a new conversation\n",
                   one_line(e.what()).c_str());
      return "";
    }
    const std::string error = reply.wait();
    std::fputc('\n', stdout);
    std::fflush(stdout);
    request_.messages.push_back({"assistant", reply.text()});
    ++replies_;
    return error;
  }

 private:
  CompletionBackend& backend_;
  const CompletionRequest opening_;
  CompletionRequest request_;
  uint64_t seed_ = 0, replies_ = 0;
};

}  // namespace

ChatCommand::ChatCommand(CLI::App& app) {
  sampling_.temperature = 0;  // greedy unless asked, as `tandem generate`
  command_ = app.add_subcommand("chat",
                                "a conversation in the terminal with a checkpoint or an HF model folder (Llama, Qwen2, "
                                "Mistral, Gemma, Gemma2, Phi-3, GPT-2)");
  auto* c = command_;
  add_model_options(c, service_.model);
  c->add_option("--system", system_, "the system message that opens the conversation (kept by /reset)");
  c->add_option("--max-tokens", max_tokens_, "tokens of one reply at most (default 512)");
  add_sampling_options(c, sampling_, "reply");
}

bool ChatCommand::chosen() const { return command_->parsed(); }

CompletionRequest ChatCommand::opening() const {
  CompletionRequest r;
  r.endpoint = ApiEndpoint::kChatCompletions;
  if (!system_.empty()) r.messages.push_back({"system", system_});
  r.max_tokens = max_tokens_;
  r.temperature = sampling_.temperature;
  r.top_k = sampling_.top_k;
  r.top_p = sampling_.top_p;
  r.repetition_penalty = sampling_.repetition_penalty;
  return r;
}

int ChatCommand::run() {
  TANDEM_CHECK(max_tokens_ >= 1, "--max-tokens must be at least 1; got ", max_tokens_);
  check_sampling_params(sampling_);
  service_.model.max_batch = 1;  // one conversation: the automatic KV cache holds one full context
  service_.max_queue = 1;
  CompletionService service(service_);
  std::fprintf(stderr, "%s%s\n", service.description().c_str(), kHint);
  Conversation conversation(service, opening(), sampling_.seed);
  for (std::string line; read_turn(line);) {
    if (line == "/exit") break;
    if (line == "/reset") {
      conversation.reset();
      std::fprintf(stderr, "(a new conversation)\n");
    } else if (!line.empty()) {
      const std::string error = conversation.say(line);
      if (!error.empty()) {
        std::fprintf(stderr, "tandem: error: generation failed: %s\n", one_line(error).c_str());
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace tandem
