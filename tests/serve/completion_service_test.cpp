// The model behind `tandem serve` (serve/completion_service.h) over a byte model `tandem train`
// wrote: naming, prompt counts, max_tokens and context limits, seeds, stop strings, OpenAI refusals
// (400, 429), cancellation, shutdown and the Prometheus counters.

#include "tandem/serve/completion_service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "../cli/cli_run.h"
#include "../error_of.h"
#include "../test_util.h"
#include "tandem/serve/openai_api.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// What a request's sink received.
struct Outcome {
  std::string text;
  int pieces = 0;
  std::optional<FinishReason> finish;
  Usage usage;
  std::string error;
};

// A request's sink and what reached it; `on_piece` runs on the scheduler thread after each piece.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  Outcome out;
  bool ended = false;
  std::promise<void> first;  // the first callback of any kind
  bool first_set = false;
  std::function<void()> on_piece;

  void mark_first() {
    if (!first_set) first_set = true, first.set_value();
  }
  bool wait_end(std::chrono::seconds timeout = 60s) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, timeout, [&] { return ended; });
  }
  Outcome snapshot() {
    std::lock_guard<std::mutex> lk(mu);
    return out;
  }
};

CompletionBackend::Sink sink_of(const std::shared_ptr<Stream>& s) {
  return {[s](const std::string& text) {
            {
              std::lock_guard<std::mutex> lk(s->mu);
              s->out.text += text;
              ++s->out.pieces;
              s->mark_first();
            }
            if (s->on_piece) s->on_piece();
          },
          [s](FinishReason reason, const Usage& usage) {
            std::lock_guard<std::mutex> lk(s->mu);
            s->out.finish = reason;
            s->out.usage = usage;
            s->ended = true;
            s->mark_first();
            s->cv.notify_all();
          },
          [s](const std::string& message) {
            std::lock_guard<std::mutex> lk(s->mu);
            s->out.error = message;
            s->ended = true;
            s->mark_first();
            s->cv.notify_all();
          }};
}

CompletionRequest completion(const std::string& prompt, std::optional<int64_t> max_tokens) {
  CompletionRequest r;
  r.endpoint = ApiEndpoint::kCompletions;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.temperature = 0;
  return r;
}

CompletionRequest chat(const std::string& content, std::optional<int64_t> max_tokens) {
  CompletionRequest r;
  r.endpoint = ApiEndpoint::kChatCompletions;
  r.messages = {{"user", content}};
  r.max_tokens = max_tokens;
  r.temperature = 0;
  return r;
}

// Submits `r` and waits for its end.
Outcome complete(CompletionService& service, const CompletionRequest& r) {
  auto s = std::make_shared<Stream>();
  service.submit(r, sink_of(s));
  EXPECT_TRUE(s->wait_end()) << "no end within a minute";
  return s->snapshot();
}

struct Refusal {
  int status = 0;
  std::string type, param, code, message;
  bool called = false;  // a callback ran: refusals must come before any
};

Refusal refusal_of(CompletionService& service, const CompletionRequest& r) {
  auto s = std::make_shared<Stream>();
  Refusal out;
  try {
    service.submit(r, sink_of(s));
    ADD_FAILURE() << "the request was accepted";
    s->wait_end();
  } catch (const ApiError& e) {
    out = {e.status(), e.type(), e.param(), e.code(), e.what()};
  }
  std::this_thread::sleep_for(20ms);
  std::lock_guard<std::mutex> lk(s->mu);
  out.called = s->first_set;
  return out;
}

// The value of a sample line "name value" in a Prometheus text; -1 when absent.
double metric(const std::string& text, const std::string& name) {
  const auto at = text.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + name.size() + 2));
}

// Waits until `name` reads `value` (the scheduler counts a request's end after its callback).
void expect_metric_soon(const CompletionService& service, const std::string& name, double value) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (metric(service.metrics_text(), name) != value && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  EXPECT_EQ(metric(service.metrics_text(), name), value) << name << " in\n" << service.metrics_text();
}

class CompletionServiceTest : public ::testing::Test {
 protected:
  // One tiny byte-level model (context 128, no BOS or EOS) trained for 3 steps, shared by the tests.
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    const auto r = test::run_cli("train --steps 3 --run-dir " + dir_->file("run") +
                                 " --set train.seq_len=16 --set data.synthetic_bytes=20000 --device cpu");
    train_error_ = r.code == 0 ? "" : r.err;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_EQ(train_error_, ""); }

  static std::string run() { return dir_->file("run"); }
  static std::string step_dir() { return run() + "/checkpoints/step_00000003"; }
  // A copy of the checkpoint as a plain model folder named `name`.
  static std::string copy_as(const std::string& name) {
    const std::string to = dir_->file(name);
    fs::remove_all(to);
    fs::copy(step_dir(), to, fs::copy_options::recursive);
    return to;
  }
  static CompletionServiceOptions options(const std::string& checkpoint, int64_t max_batch = 2) {
    CompletionServiceOptions o;
    o.model.checkpoint = checkpoint;
    o.model.device = "cpu";
    o.model.max_batch = max_batch;
    o.prefix_cache = false;  // every prompt prefilled alike: seeded outputs repeat bit for bit
    return o;
  }

  static test::TempDir* dir_;
  static std::string train_error_;
};
test::TempDir* CompletionServiceTest::dir_ = nullptr;
std::string CompletionServiceTest::train_error_;

TEST_F(CompletionServiceTest, TheModelIsNamedAfterItsRunOrFolderUnlessANameIsGiven) {
  {
    CompletionService s(options(run()));
    EXPECT_EQ(s.model_id(), "run");
    EXPECT_EQ(s.description().rfind("run (plain chat) ", 0), 0u) << s.description();
  }
  EXPECT_EQ(CompletionService(options(step_dir() + "/")).model_id(), "run") << "a checkpoint is named after its run";
  EXPECT_EQ(CompletionService(options(copy_as("my-model"))).model_id(), "my-model");
  auto named = options(run());
  named.model_name = "served";
  EXPECT_EQ(CompletionService(named).model_id(), "served");
}

TEST_F(CompletionServiceTest, ACompletionCountsItsPromptAndEndsAtMaxTokensOrTheContext) {
  CompletionService s(options(run()));
  const Outcome five = complete(s, completion("The model ", 5));
  EXPECT_EQ(five.error, "");
  EXPECT_EQ(five.finish, FinishReason::kLength);
  EXPECT_EQ(five.usage.prompt_tokens, 10);  // one token a byte, no BOS
  EXPECT_EQ(five.usage.completion_tokens, 5);
  EXPECT_LE(five.text.size(), 5u);
  EXPECT_EQ(complete(s, completion("The model ", 5)).text, five.text) << "greedy output repeats";
  // Without max_tokens a completion stops at 16, as OpenAI's does.
  EXPECT_EQ(complete(s, completion("The model ", std::nullopt)).usage.completion_tokens, 16);
  // max_tokens 0: the end at once, nothing generated.
  const Outcome none = complete(s, completion("The model ", 0));
  EXPECT_EQ(none.finish, FinishReason::kLength);
  EXPECT_EQ(none.usage.completion_tokens, 0);
  EXPECT_EQ(none.text, "");
  // More than the context leaves: as many as fit, 128 - 120.
  const Outcome full = complete(s, completion(std::string(120, 'a'), 1000));
  EXPECT_EQ(full.finish, FinishReason::kLength);
  EXPECT_EQ(full.usage.prompt_tokens, 120);
  EXPECT_EQ(full.usage.completion_tokens, 8);
}

TEST_F(CompletionServiceTest, AChatIsRenderedInTheFoldersLayoutAndRunsToTheContextByDefault) {
  {
    CompletionService s(options(run()));
    EXPECT_EQ(complete(s, chat("hi", 3)).usage.prompt_tokens, 19);  // "User: hi\nAssistant:"
    // Without max_tokens a chat may fill the context: "User: " + 108 + "\nAssistant:" is 125 tokens.
    const Outcome rest = complete(s, chat(std::string(108, 'b'), std::nullopt));
    EXPECT_EQ(rest.usage.prompt_tokens, 125);
    EXPECT_EQ(rest.usage.completion_tokens, 3);
    EXPECT_EQ(rest.finish, FinishReason::kLength);
  }
  // A ChatML template beside the weights: "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n".
  const std::string folder = copy_as("chatml");
  std::ofstream(folder + "/tokenizer_config.json")
      << R"({"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }})"
      << R"(<|im_end|>\n{% endfor %}"})";
  CompletionService s(options(folder));
  EXPECT_NE(s.description().find("(chatml chat)"), std::string::npos) << s.description();
  EXPECT_EQ(complete(s, chat("hi", 1)).usage.prompt_tokens, 52);
}

TEST_F(CompletionServiceTest, ASeedRepeatsASampledCompletionAndAnotherSeedChangesIt) {
  CompletionService s(options(run()));
  auto sampled = [&](uint64_t seed) {
    auto r = completion("Once upon a time", 24);
    r.temperature = 1.0;
    r.seed = seed;
    return complete(s, r);
  };
  const Outcome a = sampled(5);
  EXPECT_EQ(a.usage.completion_tokens, 24);
  EXPECT_EQ(sampled(5).text, a.text);
  EXPECT_NE(sampled(6).text, a.text);
}

// The same seeded output with a stop string: it ends before the stop string's first occurrence,
// which is not delivered, with finish reason "stop".
TEST_F(CompletionServiceTest, AStopStringEndsTheCompletionBeforeIt) {
  CompletionService s(options(run()));
  auto r = completion("Once upon a time", 32);
  r.temperature = 1.0;
  r.seed = 7;
  const Outcome whole = complete(s, r);
  ASSERT_EQ(whole.finish, FinishReason::kLength);
  size_t at = std::string::npos;
  for (size_t i = 1; i < whole.text.size() && at == std::string::npos; ++i) {
    const char c = whole.text[i];
    if (c >= 'a' && c <= 'z' && whole.text.find(c) == i) at = i;
  }
  ASSERT_NE(at, std::string::npos) << "no lower-case letter after the first byte of '" << whole.text << "'";
  r.stop = {std::string(1, whole.text[at])};
  const Outcome cut = complete(s, r);
  EXPECT_EQ(cut.finish, FinishReason::kStop);
  EXPECT_EQ(cut.text, whole.text.substr(0, at)) << "stop '" << r.stop[0] << "' in '" << whole.text << "'";
  EXPECT_LT(cut.usage.completion_tokens, 32);
}

TEST_F(CompletionServiceTest, RefusalsAreOpenAiErrorsBeforeAnyCallback) {
  CompletionService s(options(run()));
  const Refusal empty = refusal_of(s, completion("", 4));
  EXPECT_EQ(empty.status, 400);
  EXPECT_EQ(empty.type, "invalid_request_error");
  EXPECT_EQ(empty.param, "prompt");
  EXPECT_EQ(empty.message, "the prompt is empty");
  EXPECT_FALSE(empty.called);

  const Refusal longest = refusal_of(s, completion(std::string(128, 'a'), 4));
  EXPECT_EQ(longest.status, 400);
  EXPECT_EQ(longest.code, "context_length_exceeded");
  EXPECT_EQ(longest.param, "prompt");
  EXPECT_NE(longest.message.find("the prompt is 128 tokens and the model's context is 128: shorten it"),
            std::string::npos)
      << longest.message;
  EXPECT_FALSE(longest.called);
  EXPECT_EQ(complete(s, completion(std::string(127, 'a'), 4)).usage.completion_tokens, 1) << "127 still fits";

  const Refusal long_chat = refusal_of(s, chat(std::string(111, 'b'), 4));  // 128 tokens rendered
  EXPECT_EQ(long_chat.status, 400);
  EXPECT_EQ(long_chat.code, "context_length_exceeded");
  EXPECT_EQ(long_chat.param, "messages");

  // What the scheduler refuses comes back as a 400 with its message.
  auto hot = completion("The model ", 4);
  hot.temperature = -1;
  const Refusal bad = refusal_of(s, hot);
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.type, "invalid_request_error");
  EXPECT_NE(bad.message.find("temperature must be >= 0"), std::string::npos) << bad.message;
  EXPECT_FALSE(bad.called);
}

// One place in the batch and no waiting line: while a request runs, the next is refused with 429;
// once it ends there is room again.
TEST_F(CompletionServiceTest, AFullQueueAnswers429UntilAPlaceFrees) {
  auto o = options(run(), /*max_batch=*/1);
  o.max_queue = 0;
  CompletionService s(o);
  auto first = std::make_shared<Stream>();
  std::promise<void> release;
  auto released = release.get_future().share();
  first->on_piece = [released] { released.wait(); };  // holds the scheduler in the first piece
  auto started = first->first.get_future();
  s.submit(completion("The model ", 20), sink_of(first));
  ASSERT_EQ(started.wait_for(60s), std::future_status::ready);
  const Refusal full = refusal_of(s, completion("The model ", 2));
  release.set_value();
  EXPECT_EQ(full.status, 429);
  EXPECT_EQ(full.type, "rate_limit_error");
  EXPECT_EQ(full.code, "queue_full");
  EXPECT_FALSE(full.called);
  ASSERT_TRUE(first->wait_end());
  EXPECT_EQ(first->snapshot().usage.completion_tokens, 20);
  EXPECT_EQ(metric(s.metrics_text(), "tandem_serve_refused_requests_total"), 1);
  expect_metric_soon(s, "tandem_serve_running_requests", 0);
  EXPECT_EQ(complete(s, completion("The model ", 2)).usage.completion_tokens, 2) << "room again";
}

// A client that went away: after cancel() returns its sink hears nothing, not even an end.
TEST_F(CompletionServiceTest, ACancelledRequestHearsNothingAfterCancelReturns) {
  CompletionService s(options(run()));
  auto stream = std::make_shared<Stream>();
  stream->on_piece = [] { std::this_thread::sleep_for(2ms); };
  auto started = stream->first.get_future();
  const uint64_t id = s.submit(completion("The model ", 100), sink_of(stream));
  ASSERT_EQ(started.wait_for(60s), std::future_status::ready);
  s.cancel(id);
  const Outcome at_cancel = stream->snapshot();
  EXPECT_EQ(complete(s, completion("The model ", 8)).usage.completion_tokens, 8);  // the scheduler went on
  const Outcome later = stream->snapshot();
  EXPECT_EQ(later.pieces, at_cancel.pieces);
  EXPECT_FALSE(later.finish.has_value());
  EXPECT_EQ(later.error, "");
  EXPECT_LT(later.pieces, 100);
  EXPECT_EQ(metric(s.metrics_text(), "tandem_serve_cancelled_requests_total"), 1);
  s.cancel(id);      // again: ignored
  s.cancel(999999);  // never issued: ignored
}

// A request still running when the service goes ends with an error event, not silence.
TEST_F(CompletionServiceTest, StoppingTheServiceEndsARequestInFlightWithAnError) {
  auto s = std::make_unique<CompletionService>(options(run()));
  auto stream = std::make_shared<Stream>();
  stream->on_piece = [] { std::this_thread::sleep_for(2ms); };  // 100 tokens take 0.2 s at least
  auto started = stream->first.get_future();
  s->submit(completion("The model ", 100), sink_of(stream));
  ASSERT_EQ(started.wait_for(60s), std::future_status::ready);
  s.reset();
  ASSERT_TRUE(stream->wait_end(1s)) << "the end came before the service was gone";
  const Outcome out = stream->snapshot();
  EXPECT_EQ(out.error, "the server is stopping");
  EXPECT_FALSE(out.finish.has_value());
  EXPECT_LT(out.pieces, 100);
}

TEST_F(CompletionServiceTest, MetricsCountTheRequestsAndTheirTokens) {
  CompletionService s(options(run()));
  const std::string before = s.metrics_text();
  EXPECT_NE(before.find("# TYPE tandem_serve_requests_total counter\n"), std::string::npos) << before;
  EXPECT_NE(before.find("# TYPE tandem_serve_queued_requests gauge\n"), std::string::npos) << before;
  EXPECT_EQ(metric(before, "tandem_serve_requests_total"), 0);
  EXPECT_GT(metric(before, "tandem_serve_kv_pages_capacity"), 0);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(complete(s, completion("The model ", 5)).usage.completion_tokens, 5);
  expect_metric_soon(s, "tandem_serve_finished_requests_total", 2);
  const std::string after = s.metrics_text();
  EXPECT_EQ(metric(after, "tandem_serve_requests_total"), 2);
  EXPECT_EQ(metric(after, "tandem_serve_prompt_tokens_total"), 20);
  EXPECT_EQ(metric(after, "tandem_serve_generated_tokens_total"), 10);
  EXPECT_EQ(metric(after, "tandem_serve_refused_requests_total"), 0);
  EXPECT_EQ(metric(after, "tandem_serve_queued_requests"), 0);
  EXPECT_EQ(metric(after, "tandem_serve_running_requests"), 0);
  EXPECT_EQ(metric(after, "tandem_serve_kv_pages_used"), 0) << "every page back";
}

TEST_F(CompletionServiceTest, AMissingCheckpointOrTokenizerIsAUserErrorNamingIt) {
  const std::string gone = dir_->file("no-such-model");
  EXPECT_NE(test::error_of([&] { CompletionService s(options(gone)); }).find("no-such-model"), std::string::npos);
  auto o = options(run());
  o.model.tokenizer = dir_->file("no-such-tokenizer.json");
  EXPECT_NE(test::error_of([&] { CompletionService s(o); }).find("no-such-tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace tandem
