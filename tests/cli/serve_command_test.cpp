// `tandem serve` in-process (cli/serve_command.h) over a small random model on the CPU: the ranges
// its flags accept, the API key from --api-key or else $TANDEM_API_KEY, --max-body-mib as the exact
// byte limit, --no-prefix-cache, and a stop request that drains the server and returns 0.

#include "tandem/cli/serve_command.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "../error_of.h"
#include "../serve/serve_test_util.h"
#include "../test_util.h"
#include "tandem/core/interrupt.h"
#include "tandem/formats/safetensors.h"
#include "tandem/io/hf_config.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;

// A TCP port nobody listened on a moment ago.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t n = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0;
  ::close(fd);
  return ok ? ntohs(a.sin_port) : -1;
}

// `request` sent to 127.0.0.1:port; what came back until the server closed (or only its first
// line, for a 100 Continue that waits for a body), "" when nothing listens.
std::string round_trip(int port, const std::string& request, bool first_line_only = false) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
      reply.append(buf, static_cast<size_t>(n));
      if (first_line_only && reply.find("\r\n") != std::string::npos) break;
    }
  }
  ::close(fd);
  return reply;
}

// The status code of an HTTP reply, 0 for none.
int status_of(const std::string& reply) { return reply.size() > 12 ? std::atoi(reply.substr(9, 3).c_str()) : 0; }

std::string get(int port, const std::string& path, const std::string& key = "") {
  return round_trip(port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" +
                              (key.empty() ? "" : "Authorization: Bearer " + key + "\r\n") + "\r\n");
}

std::string post(int port, const std::string& path, const std::string& body, const std::string& key) {
  return round_trip(port, "POST " + path +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
                              "Authorization: Bearer " +
                              key + "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
}

// The value of a Prometheus line of /metrics; -1 when absent.
double metric(int port, const std::string& name) {
  const std::string text = get(port, "/metrics");
  const auto at = text.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::strtod(text.c_str() + at + name.size() + 2, nullptr);
}

// `tandem serve` running on a thread of this process until stop().
class RunningServe {
 public:
  explicit RunningServe(const std::vector<std::string>& argv) : command_(app_) {
    std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them last first
    app_.parse(reversed);
    clear_stop_request();
    thread_ = std::thread([this] {
      error_ = test::error_of([this] { code_ = command_.run(); });
      ended_ = true;
    });
  }
  ~RunningServe() { stop(); }

  /// Waits until /health answers on `port`; false when the command ended first or took too long.
  bool ready(int port) {
    for (auto until = std::chrono::steady_clock::now() + 120s; std::chrono::steady_clock::now() < until;) {
      if (ended_) return false;
      if (status_of(get(port, "/health")) == 200) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

  /// What a signal does (Note [Graceful drain]); returns the command's exit code.
  int stop() {
    if (thread_.joinable()) {
      request_stop();
      thread_.join();
      clear_stop_request();
      ::signal(SIGINT, SIG_DFL);  // run() installed tandem's handlers in this test process
      ::signal(SIGTERM, SIG_DFL);
    }
    return code_;
  }
  const std::string& error() const { return error_; }

 private:
  CLI::App app_{"serve test"};
  ServeCommand command_;
  std::thread thread_;
  std::atomic<bool> ended_{false};
  int code_ = -1;
  std::string error_;
};

// A model folder of random weights over the byte vocabulary, shared by the tests.
class ServeCommandTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    const ModelSpec spec = test::small_llama_spec(256);
    auto model = test::random_llama(spec, 8);
    std::vector<std::pair<std::string, torch::Tensor>> tensors;
    for (auto& [name, t] : model->hf_state_dict()) tensors.emplace_back(name, t);
    write_safetensors(dir_->file("model.safetensors"), tensors);
    std::ofstream(dir_->file("config.json")) << hf_config_json(spec);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void TearDown() override { ::unsetenv("TANDEM_API_KEY"); }

  static std::vector<std::string> argv(int port, const std::vector<std::string>& extra) {
    std::vector<std::string> a = {"serve", "--checkpoint", dir_->path(),         "--tokenizer",     "byte", "--device",
                                  "cpu",   "--port",       std::to_string(port), "--drain-timeout", "1"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  static test::TempDir* dir_;
};
test::TempDir* ServeCommandTest::dir_ = nullptr;

TEST(ServeCommand, FlagsOutOfTheirRangesAreRefusedWhenParsed) {
  const std::vector<std::vector<std::string>> bad = {
      {"--max-batch", "0"},       {"--max-batch", "4097"},     {"--max-queue", "-1"},
      {"--max-step-tokens", "0"}, {"--kv-cache-gib", "-1"},    {"--port", "65536"},
      {"--port", "-1"},           {"--max-body-mib", "0"},     {"--max-body-mib", "5000"},
      {"--drain-timeout", "-1"},  {"--drain-timeout", "90000"}};
  for (const auto& flag : bad) {
    CLI::App app{"serve test"};
    ServeCommand command(app);
    std::vector<std::string> argv = {flag[1], flag[0], "c", "--checkpoint", "serve"};  // reversed
    EXPECT_THROW(app.parse(argv), CLI::ValidationError) << flag[0] << " " << flag[1];
  }
  CLI::App app{"serve test"};
  ServeCommand command(app);
  std::vector<std::string> good = {"1",   "--max-queue",     "0", "--port",       "4096", "--max-batch",
                                   "0.5", "--drain-timeout", "c", "--checkpoint", "serve"};  // reversed
  EXPECT_NO_THROW(app.parse(good));
  EXPECT_TRUE(command.chosen());
  CLI::App required{"serve test"};
  ServeCommand needs_checkpoint(required);
  std::vector<std::string> none = {"serve"};
  EXPECT_THROW(required.parse(none), CLI::RequiredError);
}

TEST_F(ServeCommandTest, ServesWithTheEnvironmentsKeyUntilAStopDrainsIt) {
  ::setenv("TANDEM_API_KEY", "secret", 1);
  const int port = free_port();
  RunningServe serve(argv(port, {"--model-name", "tiny-chat", "--max-body-mib", "0.001"}));
  ASSERT_TRUE(serve.ready(port)) << serve.error();
  EXPECT_EQ(status_of(get(port, "/v1/models")), 401);
  EXPECT_EQ(status_of(get(port, "/v1/models", "wrong")), 401);
  const std::string models = get(port, "/v1/models", "secret");
  EXPECT_EQ(status_of(models), 200) << models;
  EXPECT_NE(models.find("\"tiny-chat\""), std::string::npos) << models;
  // --max-body-mib 0.001 is 1048 bytes: a body of that size may come, one byte more is refused unread.
  const std::string ask =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer secret\r\n"
      "Connection: close\r\nExpect: 100-continue\r\nContent-Length: ";
  EXPECT_EQ(status_of(round_trip(port, ask + "1049\r\n\r\n")), 413);
  EXPECT_EQ(status_of(round_trip(port, ask + "1048\r\n\r\n", true)), 100);
  // The prefix cache is on by default: the same prompt again finds its two full pages.
  const std::string body = R"({"prompt": ")" + std::string(40, 'a') + R"(", "max_tokens": 1})";
  EXPECT_EQ(status_of(post(port, "/v1/completions", body, "secret")), 200);
  EXPECT_EQ(status_of(post(port, "/v1/completions", body, "secret")), 200);
  EXPECT_EQ(metric(port, "tandem_serve_prefix_hit_tokens_total"), 32);
  EXPECT_EQ(serve.stop(), 0);
  EXPECT_EQ(serve.error(), "");
  EXPECT_EQ(get(port, "/health"), "") << "the server stopped listening";
}

TEST_F(ServeCommandTest, AKeyOnTheCommandLineWinsAndNoPrefixCacheSharesNothing) {
  ::setenv("TANDEM_API_KEY", "secret", 1);
  const int port = free_port();
  RunningServe serve(argv(port, {"--api-key", "flag-key", "--no-prefix-cache"}));
  ASSERT_TRUE(serve.ready(port)) << serve.error();
  EXPECT_EQ(status_of(get(port, "/v1/models", "secret")), 401);
  const std::string models = get(port, "/v1/models", "flag-key");
  EXPECT_EQ(status_of(models), 200) << models;
  // Without --model-name, the model is named after its folder.
  EXPECT_NE(models.find(std::filesystem::path(dir_->path()).filename().string()), std::string::npos) << models;
  const std::string body = R"({"prompt": ")" + std::string(40, 'a') + R"(", "max_tokens": 1})";
  EXPECT_EQ(status_of(post(port, "/v1/completions", body, "flag-key")), 200);
  EXPECT_EQ(status_of(post(port, "/v1/completions", body, "flag-key")), 200);
  EXPECT_EQ(metric(port, "tandem_serve_prefix_hit_tokens_total"), 0);
  EXPECT_EQ(serve.stop(), 0);
}

TEST_F(ServeCommandTest, AMissingCheckpointIsAUserErrorBeforeListening) {
  const int port = free_port();
  RunningServe serve(
      {"serve", "--checkpoint", dir_->file("missing"), "--device", "cpu", "--port", std::to_string(port)});
  EXPECT_FALSE(serve.ready(port));
  EXPECT_EQ(serve.stop(), -1);
  EXPECT_NE(serve.error().find("missing"), std::string::npos) << serve.error();
}

}  // namespace
}  // namespace tandem
