// The HTTP front of `tandem serve` against a scripted backend: the routes' shapes, streaming as
// server-sent events, refusals as OpenAI-style errors, and a client leaving mid-stream cancelling
// its request. tests/python/test_serve.py drives the real server with the `openai` client.
#include "tandem/serve/http_server.h"

#include <gtest/gtest.h>

#ifdef TANDEM_WITH_HTTP
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

namespace tandem {
namespace {

using nlohmann::json;

// Answers each request with max_tokens pieces "w0 w1 ...", one every `gap`, on its own thread.
class ScriptedBackend : public CompletionBackend {
 public:
  explicit ScriptedBackend(int capacity, std::chrono::milliseconds gap) : capacity_(capacity), gap_(gap) {}
  ~ScriptedBackend() override {
    for (auto& t : threads_) t.join();
  }
  uint64_t submit(const CompletionRequest& r, Sink sink) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (running_ >= capacity_) throw ApiError(429, "rate_limit_error", "the queue is full", "", "queue_full");
    const uint64_t id = ++next_id_;
    auto job = std::make_shared<Job>();
    jobs_[id] = job;
    ++running_;
    const int64_t n = r.max_tokens.value_or(16);
    threads_.emplace_back([this, job, sink, n] { run(*job, sink, n); });
    return id;
  }
  void cancel(uint64_t id) override {
    std::shared_ptr<Job> job;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (!jobs_.count(id)) return;
      job = jobs_[id];
    }
    const std::lock_guard<std::mutex> lock(job->mutex);
    if (!job->done) cancelled_.insert(id);
    job->cancelled = true;
  }
  std::string model_id() const override { return "scripted"; }
  std::string metrics_text() const override { return "tandem_serve_running " + std::to_string(running()) + "\n"; }
  int running() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return running_;
  }
  std::set<uint64_t> cancelled() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return cancelled_;
  }

 private:
  struct Job {
    std::mutex mutex;
    bool cancelled = false, done = false;
  };
  void run(Job& job, const Sink& sink, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      std::this_thread::sleep_for(gap_);
      const std::lock_guard<std::mutex> lock(job.mutex);
      if (job.cancelled) break;
      sink.on_text((i ? " w" : "w") + std::to_string(i));
    }
    {
      const std::lock_guard<std::mutex> lock(job.mutex);
      if (!job.cancelled) sink.on_finish(FinishReason::kLength, Usage{2, n});
      job.done = true;
    }
    const std::lock_guard<std::mutex> lock(mutex_);
    --running_;
  }
  mutable std::mutex mutex_;
  int capacity_;
  std::chrono::milliseconds gap_;
  int running_ = 0;
  uint64_t next_id_ = 0;
  std::map<uint64_t, std::shared_ptr<Job>> jobs_;
  std::set<uint64_t> cancelled_;
  std::vector<std::thread> threads_;
};

HttpServerOptions loopback(const std::string& key = "") {
  HttpServerOptions o;
  o.port = 0;
  o.api_key = key;
  o.threads = 8;
  return o;
}

// The data: payloads of an SSE body.
std::vector<std::string> events(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

TEST(HttpServer, AnswersACompletionWhole) {
  ScriptedBackend backend(4, std::chrono::milliseconds(1));
  HttpServer server(backend, loopback());
  httplib::Client c("127.0.0.1", server.port());
  const auto res =
      c.Post("/v1/completions", R"({"model": "scripted", "prompt": "hi", "max_tokens": 3})", "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const auto j = json::parse(res->body);
  EXPECT_EQ(j["choices"][0]["text"], "w0 w1 w2");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["model"], "scripted");
  const auto models = c.Get("/v1/models");
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "scripted");
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST(HttpServer, StreamsAChatAsServerSentEvents) {
  ScriptedBackend backend(4, std::chrono::milliseconds(5));
  HttpServer server(backend, loopback());
  httplib::Client c("127.0.0.1", server.port());
  const auto res = c.Post("/v1/chat/completions",
                          R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": true,
                              "stream_options": {"include_usage": true}})",
                          "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  const auto ev = events(res->body);
  ASSERT_GE(ev.size(), 4u) << res->body;
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_EQ(json::parse(ev.front())["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 1 < ev.size(); ++i) {
    const auto j = json::parse(ev[i]);
    if (j["choices"].empty()) {
      EXPECT_EQ(j["usage"]["completion_tokens"], 4);
      continue;
    }
    const auto& ch = j["choices"][0];
    if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(text, "w0 w1 w2 w3");
  EXPECT_EQ(finish, "length");
}

TEST(HttpServer, RefusalsAreOpenAiErrors) {
  ScriptedBackend backend(1, std::chrono::milliseconds(20));
  HttpServer server(backend, loopback("sekrit"));
  httplib::Client c("127.0.0.1", server.port());
  const httplib::Headers auth = {{"Authorization", "Bearer sekrit"}};
  auto expect = [](const httplib::Result& res, int status, const std::string& needle) {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << res->body;
    const auto j = json::parse(res->body);
    EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << res->body;
  };
  expect(c.Post("/v1/completions", R"({"prompt": "x"})", "application/json"), 401, "API key");
  expect(c.Get("/v1/models", {{"Authorization", "Bearer wrong"}}), 401, "API key");
  expect(c.Post("/v1/completions", auth, "{nope", "application/json"), 400, "JSON");
  expect(c.Post("/v1/completions", auth, R"({"prompt": "x", "max_tokens": -2})", "application/json"), 400,
         "max_tokens");
  expect(c.Post("/v1/completions", auth, R"({"prompt": "x", "model": "gpt-9"})", "application/json"), 404, "gpt-9");
  expect(c.Get("/v2/nothing", auth), 404, "/v2/nothing");
  // One request holds the only slot: the next is refused with 429 while it runs.
  std::thread slow([&] {
    httplib::Client c2("127.0.0.1", server.port());
    c2.Post("/v1/completions", auth, R"({"prompt": "x", "max_tokens": 20})", "application/json");
  });
  while (backend.running() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto busy = c.Post("/v1/completions", auth, R"({"prompt": "x"})", "application/json");
  expect(busy, 429, "queue");
  EXPECT_EQ(busy->get_header_value("Retry-After"), "1");
  slow.join();
  const auto metrics = c.Get("/metrics")->body;
  EXPECT_NE(metrics.find("tandem_serve_http_responses_total{route=\"/v1/completions\",status=\"429\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("tandem_serve_http_responses_total{route=\"/v1/completions\",status=\"200\"} 1"),
            std::string::npos)
      << metrics;
  EXPECT_EQ(metrics.find("status=\"-1\""), std::string::npos) << metrics;
}

TEST(HttpServer, AClientLeavingMidStreamCancelsItsRequest) {
  ScriptedBackend backend(4, std::chrono::milliseconds(10));
  HttpServer server(backend, loopback());
  httplib::Client c("127.0.0.1", server.port());
  int chunks = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = R"({"prompt": "x", "max_tokens": 1000, "stream": true})";
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };  // then hang up
  c.send(req);
  for (int i = 0; i < 500 && backend.cancelled().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(backend.cancelled().size(), 1u) << "the request went on after its client left";
  for (int i = 0; i < 500 && backend.running() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(backend.running(), 0);
}

}  // namespace
}  // namespace tandem

#endif  // TANDEM_WITH_HTTP
