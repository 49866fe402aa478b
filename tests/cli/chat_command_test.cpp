// `tandem chat` in-process (cli/chat_command.h) over a small random model: each reply is what
// CompletionService answers to the whole conversation with reply i seeded seed + i (Note [Chat in the
// terminal]), /reset, /exit, blank lines, a turn too long for the context, flags checked first.

#include "tandem/cli/chat_command.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../serve/serve_test_util.h"
#include "../test_util.h"
#include "command_run.h"
#include "tandem/formats/safetensors.h"
#include "tandem/io/hf_config.h"

namespace tandem {
namespace {

using test::error_of;

// The 94 printable ASCII bytes, the space and the line break (ids 0..95) and <|endoftext|> (96):
// every reply is printable text, which the terminal shows byte for byte.
std::string ascii_tokenizer_json() { return test::ascii_tokenizer_json({"<|endoftext|>"}); }

// The model folder (random weights, context 96) and its tokenizer, shared by the tests.
class ChatCommandTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    const ModelSpec spec = test::small_llama_spec(97);
    auto model = test::random_llama(spec, 21);
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    for (auto& [name, t] : model->hf_state_dict()) tensors.emplace_back(name, t);
    write_safetensors(dir_->file("model.safetensors"), tensors);
    std::ofstream(dir_->file("config.json")) << hf_config_json(spec);
    std::ofstream(dir_->file("tokenizer.json")) << ascii_tokenizer_json();
  }
  static void TearDownTestSuite() {
    service_.reset();
    delete dir_;
    dir_ = nullptr;
  }

  // The command line of the tests: sampled (so that the seed matters), every sampling flag set.
  static std::vector<std::string> argv() {
    return {
        "chat",      "--checkpoint",  dir_->path(), "--device", "cpu", "--max-tokens", "6",   "--system",
        "Be brief.", "--temperature", "1.0",        "--top-k",  "20",  "--top-p",      "0.9", "--repetition-penalty",
        "1.2",       "--seed",        "7"};
  }

  // What CompletionService answers to `messages` (after the system message) with `seed`.
  static std::string served_reply(std::vector<ChatMessage> messages, uint64_t seed) {
    if (!service_) {
      CompletionServiceOptions o;
      o.model.checkpoint = dir_->path();
      o.model.device = "cpu";
      o.model.max_batch = 1;
      service_ = std::make_unique<CompletionService>(o);
    }
    CompletionRequest r;
    r.endpoint = ApiEndpoint::kChatCompletions;
    r.messages = {{"system", "Be brief."}};
    r.messages.insert(r.messages.end(), messages.begin(), messages.end());
    r.max_tokens = 6;
    r.temperature = 1.0;
    r.top_k = 20;
    r.top_p = 0.9;
    r.repetition_penalty = 1.2;
    r.seed = seed;
    struct State {
      std::mutex m;
      std::condition_variable cv;
      std::string text, error;
      bool done = false;
    };
    auto s = std::make_shared<State>();
    CompletionBackend::Sink sink;
    sink.on_text = [s](const std::string& t) {
      const std::lock_guard<std::mutex> lock(s->m);
      s->text += t;
    };
    sink.on_finish = [s](FinishReason, const Usage&) {
      const std::lock_guard<std::mutex> lock(s->m);
      s->done = true;
      s->cv.notify_all();
    };
    sink.on_error = [s](const std::string& e) {
      const std::lock_guard<std::mutex> lock(s->m);
      s->error = e.empty() ? "failed" : e;
      s->done = true;
      s->cv.notify_all();
    };
    service_->submit(r, sink);
    std::unique_lock<std::mutex> lock(s->m);
    EXPECT_TRUE(s->cv.wait_for(lock, std::chrono::seconds(60), [&] { return s->done; }));
    EXPECT_EQ(s->error, "");
    return s->text;
  }

  static test::TempDir* dir_;
  static std::unique_ptr<CompletionService> service_;
};
test::TempDir* ChatCommandTest::dir_ = nullptr;
std::unique_ptr<CompletionService> ChatCommandTest::service_;

// What `tandem <argv>` printed with `input` on stdin, its exit code and the UserError it threw.
struct Chatted {
  int code = -1;
  std::string out, err, error;
};

Chatted chat(const std::vector<std::string>& argv, const std::string& input) {
  CLI::App app{"chat test"};
  ChatCommand command(app);
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them last first
  app.parse(reversed);
  EXPECT_TRUE(command.chosen());
  std::istringstream in(input);
  std::streambuf* const stdin_buffer = std::cin.rdbuf(in.rdbuf());
  Chatted r;
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  r.error = error_of([&] { r.code = command.run(); });
  r.err = testing::internal::GetCapturedStderr();
  r.out = testing::internal::GetCapturedStdout();
  std::cin.rdbuf(stdin_buffer);
  std::cin.clear();
  return r;
}

// What the terminal prints before each line it reads (nothing when stdin is not a terminal).
std::string ask() { return isatty(STDIN_FILENO) ? "> " : ""; }

TEST_F(ChatCommandTest, EachReplyIsTheServersAnswerToTheWholeConversation) {
  const Chatted r = chat(argv(), "hi\nthere\n");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.code, 0);
  const std::string first = served_reply({{"user", "hi"}}, 7);
  const std::string second = served_reply({{"user", "hi"}, {"assistant", first}, {"user", "there"}}, 8);
  EXPECT_EQ(r.out, ask() + first + "\n" + ask() + second + "\n" + ask());
  // The replies are sampled: another seed gives another one, so the seeds above are checked.
  EXPECT_FALSE(first.empty());
  EXPECT_NE(served_reply({{"user", "hi"}}, 8), first);
  EXPECT_NE(r.err.find("/reset clears the conversation, /exit or Ctrl-D ends"), std::string::npos) << r.err;
}

TEST_F(ChatCommandTest, ResetStartsOverWithTheSystemMessageAndTheFirstSeed) {
  const Chatted r = chat(argv(), "hi\n/reset\nhi\n");
  ASSERT_EQ(r.error, "");
  const std::string first = served_reply({{"user", "hi"}}, 7);
  EXPECT_EQ(r.out, ask() + first + "\n" + ask() + ask() + first + "\n" + ask());
  EXPECT_NE(r.err.find("(a new conversation)"), std::string::npos) << r.err;
}

TEST_F(ChatCommandTest, BlankLinesAreSkippedCarriageReturnsDroppedAndExitEnds) {
  const Chatted r = chat(argv(), "\n\r\nhi\r\n/exit\nthere\n");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, ask() + ask() + ask() + served_reply({{"user", "hi"}}, 7) + "\n" + ask());
}

// Note [Chat in the terminal]: a turn that does not fit the context is refused with its length and
// dropped; the conversation goes on as if it had not been typed.
TEST_F(ChatCommandTest, ATurnLongerThanTheContextIsDroppedAndTheConversationGoesOn) {
  const Chatted r = chat(argv(), std::string(300, 'x') + "\nhi\n");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.err.find("tandem: this turn was not sent: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the model's context is 96"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("; /reset starts a new conversation\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, ask() + ask() + served_reply({{"user", "hi"}}, 7) + "\n" + ask());
}

TEST_F(ChatCommandTest, FlagsAreCheckedBeforeTheModelIsLoaded) {
  const auto refusal = [](const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {"chat", "--checkpoint", "/no/such/checkpoint"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return chat(argv, "hi\n").error;
  };
  EXPECT_NE(refusal({"--max-tokens", "0"}).find("--max-tokens must be at least 1; got 0"), std::string::npos);
  EXPECT_NE(refusal({"--temperature", "-1"}).find("temperature must be >= 0"), std::string::npos);
  EXPECT_NE(refusal({"--top-p", "0"}).find("top_p must be in (0, 1]"), std::string::npos);
  EXPECT_NE(refusal({"--repetition-penalty", "0"}).find("repetition_penalty must be > 0"), std::string::npos);
  EXPECT_NE(refusal({}).find("/no/such/checkpoint"), std::string::npos);  // good flags: the folder is refused
  CLI::App app{"chat test"};
  ChatCommand command(app);
  std::vector<std::string> no_checkpoint = {"chat"};
  EXPECT_THROW(app.parse(no_checkpoint), CLI::RequiredError);
}

}  // namespace
}  // namespace tandem
